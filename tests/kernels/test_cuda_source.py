"""CUDA C++ candidates: declarations, builds (compile-only on the CPU tier, where nvcc exists), structured errors,
the ptxas report and the spill limit, the build cache; on a GPU the planted kernels run through the battery
and the serving-safety check."""

from __future__ import annotations

import os
import time

import pytest

from conftest import assert_serves
from gemmrl.kernels import cuda_source as cs
from gemmrl.kernels import toolchain
from gemmrl.adversarial.planted_cuda import PLANTED, planted_source
from gemmrl.problem import GemmProblem

HAS_NVCC = bool(toolchain.find_nvcc())
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc (the CUDA toolkit) to compile")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", os.environ.get("GEMMRL_CUDA_ARCH", "90a"))
    return tmp_path / "cache"


# -- declarations ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,shape,ok", [
    ("64_4096_64", (64, 4096, 64), True),
    ("64_4096_64", (64, 4096, 128), False),
    ("64_4096_64,1_8_8", (1, 8, 8), True),
    ("M=1..64,N%8,K%8", (1, 8, 8), True),
    ("M=1..64,N%8,K%8", (65, 8, 8), False),
    ("M=1..64,N%8,K%8", (3, 12, 8), False),
    ("K=128..", (7, 13, 128), True),
    ("K=128..", (7, 13, 127), False),
    ("any", (1, 1, 1), True),
    ("", (12345, 3, 77), True),
])
def test_shape_range(text, shape, ok):
    r = cs.ShapeRange.parse(text)
    assert r.admits(*shape) is ok
    assert cs.ShapeRange.parse(str(r)) == r


@pytest.mark.parametrize("text", ["M=0..4", "M=9..3", "X%8", "64_64", "N%0"])
def test_shape_range_rejects(text):
    with pytest.raises(cs.CudaSourceError):
        cs.ShapeRange.parse(text)


@pytest.mark.parametrize("kw,msg", [
    ({"abi": "pybind"}, "ABI"), ({"layout": "tt"}, "layout"), ({"entry": "9bad"}, "identifier"),
    ({"code": "  "}, "empty"), ({"abi": "cuda_l2"}, "exactly one shape"),
])
def test_source_declaration_errors(kw, msg):
    with pytest.raises(cs.CudaSourceError, match=msg):
        cs.CudaSource(**{"code": "int x;", **kw})


def test_admits_checks_dtype_and_shapes():
    src = cs.CudaSource("int x;", shapes=cs.ShapeRange.parse("M=1..16"), dtype="bf16")
    assert src.admits(GemmProblem(16, 8, 8, dtype="bf16"))
    assert not src.admits(GemmProblem(17, 8, 8, dtype="bf16"))
    assert not src.admits(GemmProblem(16, 8, 8, dtype="fp16"))


# -- probes: the other shapes a declared source is verified at ---------------------------------------------
def _check_probes(r, shape, probes):
    assert probes and all(r.admits(*s) and s != shape for s in probes), (str(r), probes)
    assert len(set(probes)) == len(probes)


def test_probes_of_any_reach_its_far_corners():
    r = cs.ShapeRange.parse("any")
    got = r.probes(256, 256, 256)
    _check_probes(r, (256, 256, 256), got)
    assert cs.PROBE_MAX_DIM == 16384
    # the two probes near the measured shape first, then the corners, then their odd tails
    assert got == [(255, 255, 255), (129, 129, 129), (1, 1, 16384), (16384, 1, 1), (1, 16384, 1),
                   (1, 1, 16383), (16383, 1, 1), (1, 16383, 1)]
    assert r.probes(256, 256, 256, n=2) == got[:2]
    assert r.probes(256, 256, 256, corners="K", odd_tails=False) == got[:3]
    assert (1, 1, 16384) in r.probes(1, 1, 16383) and (1, 1, 16383) not in r.probes(1, 1, 16383)


def test_probes_respect_multiples_and_bounds():
    r = cs.ShapeRange.parse("M=1..64,N%8,K%8")
    got = r.probes(16, 64, 128)
    _check_probes(r, (16, 64, 128), got)
    # largest K and N capped at 16384 on their multiple, the largest M is its bound; small dims are the
    # smallest admitted (M 1, N and K 8); N and K have no odd tail (their multiple is 8), M does (63)
    assert got[2:] == [(1, 8, 16384), (64, 8, 8), (1, 16384, 8), (63, 8, 8)]

    r = cs.ShapeRange.parse("M=1..100,N=8..4000,K=64..,N%8,K%16")
    got = r.probes(32, 64, 128)
    _check_probes(r, (32, 64, 128), got)
    assert {(1, 8, 16384), (100, 8, 64), (1, 4000, 64), (99, 8, 64)} <= set(got)

    r = cs.ShapeRange.parse("M=3..1000,N=5..30,K=7..20000,M%4,K%6")  # bounds that are not multiples
    got = r.probes(100, 20, 600)
    _check_probes(r, (100, 20, 600), got)
    assert {(4, 5, 16380), (1000, 5, 12), (4, 30, 12), (4, 29, 12)} <= set(got)
    for shape in got:
        assert shape[0] * shape[1] * shape[2] <= 1000 * 30 * 16380


def test_probe_corners_keep_every_dim_cheap():
    """A corner is large in one dim only: the others at their smallest admitted value (1..64 in these)."""
    for text in ("any", "M=1..64,N%8,K%8", "N%64,K%64", "M=16..4096,K=32..", "M=1..8,N=1..8,K=1..8"):
        r = cs.ShapeRange.parse(text)
        corners = [s for s in r.probes(8, 64, 64) if max(s) > 128]
        assert all(sorted(s)[1] <= 64 for s in corners), (text, corners)
        _check_probes(r, (8, 64, 64), r.probes(8, 64, 64))


def test_probes_of_exact_declarations_are_their_other_shapes():
    r = cs.ShapeRange.parse("64_4096_64,128_4096_64,256_4096_64")
    assert r.probes(64, 4096, 64) == [(128, 4096, 64), (256, 4096, 64)]
    assert r.probes(64, 4096, 64, n=1) == [(128, 4096, 64)]
    assert cs.ShapeRange.parse("64_4096_64").probes(64, 4096, 64) == []


def test_a_range_with_no_multiple_inside_has_no_corners():
    r = cs.ShapeRange.parse("M=5..7,M%8")
    assert not any(r.admits(m, 1, 1) for m in range(1, 20))
    assert r.probes(8, 1, 1) == []


# -- builds --------------------------------------------------------------------------------------------------
@needs_nvcc
def test_build_correct_then_cached(cache):
    src = planted_source("correct")
    assert not cs.cached(src, "90a")  # nothing built in a fresh cache
    b = cs.build(src, "90a")
    assert b.ok, b.error
    assert cs.cached(src, "90a") and not cs.cached(planted_source("correct", layout="nn"), "90a")
    assert os.path.isfile(b.so)
    assert b.ptxas.kernels >= 1 and 0 < b.ptxas.max_registers <= 255
    assert b.ptxas.spill_store_bytes == 0
    t0 = time.perf_counter()
    again = cs.build(src, "90a")
    assert again.cached and again.ok and again.so == b.so and again.key == b.key
    assert time.perf_counter() - t0 < 2.0  # found, not recompiled
    other = cs.build(planted_source("correct", layout="nn"), "90a")  # other flags: another key
    assert other.key != b.key


@needs_nvcc
def test_compile_error_is_structured_and_cached(cache):
    src = planted_source("syntax_error")
    b = cs.build(src, "90a")
    assert not b.ok and b.so is None
    assert b.error.stage == "compile"
    assert b.error.file == "<candidate>"
    want = next(i for i, ln in enumerate(src.code.splitlines(), 1) if "missing ;" in ln)
    assert b.error.line in (want, want + 1)  # nvcc points at the token where the ';' was expected
    assert "error" in b.error.log_head.lower()
    assert cs.build(src, "90a").cached  # the source's own error is remembered
    assert not cs.cached(src, "90a")  # remembered as an error: nothing to load


@needs_nvcc
def test_spills_rejected(cache):
    b = cs.build(planted_source("spills"), "90a")
    assert not b.ok
    assert b.error.stage == "spills", b.error
    assert b.ptxas.spill_store_bytes > 0
    lenient = cs.build(planted_source("spills"), "90a", max_spill_bytes=1 << 20, force=True)
    assert lenient.ok


@needs_nvcc
def test_timeout_is_a_build_error(cache):
    b = cs.build(planted_source("hang"), "90a", timeout_s=0.05)
    assert not b.ok and b.error.stage == "timeout"
    assert cs.build(planted_source("hang"), "90a").ok  # a timeout is not cached


@needs_nvcc
def test_build_many_keeps_order(cache):
    srcs = [planted_source(k) for k in ("syntax_error", "correct", "legacy_stream")]
    got = cs.build_many(srcs, "90a", jobs=2)
    assert [b.ok for b in got] == [False, True, True]
    assert got[1].key != got[2].key


def test_no_nvcc_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setattr(cs, "find_nvcc", lambda: "")
    b = cs.build(planted_source("correct"), "90a")
    assert not b.ok and b.error.stage == "toolchain" and "nvcc" in b.error.message


def test_missing_headers_are_a_clear_error(cache):
    src = cs.CudaSource("int x;", includes=("cutlass",))
    try:
        toolchain.cutlass_include_dirs()
        pytest.skip("the CUTLASS headers are installed here")
    except toolchain.CutlassNotFound:
        pass
    b = cs.build(src, "90a")
    assert not b.ok and b.error.stage == "headers" and "cutlass" in b.error.message.lower()


def test_planted_kinds():
    assert set(PLANTED) >= {"correct", "illegal_address", "hang", "legacy_stream", "huge_malloc", "syntax_error"}
    with pytest.raises(ValueError, match="unknown planted"):
        planted_source("nope")


# -- GPU: run them ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (33, 65, 129), (128, 256, 64)])
def test_correct_planted_passes_battery_and_graph(shape, layout):
    assert_serves(planted_source("correct", layout=layout), GemmProblem(*shape, layout=layout))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["legacy_stream", "device_sync"])
def test_graph_unsafe_rejected_for_serving(kind):
    from gemmrl.candidate import make_buffers

    p = GemmProblem(64, 128, 64)
    cand, rec = cs.load_candidate(planted_source(kind))
    assert cand is not None, rec
    bufs = make_buffers(p, "cuda")
    cand.prepare(p, bufs, "graph", None)
    ok, why = cs.graph_safety(cand, bufs)
    assert not ok and why
