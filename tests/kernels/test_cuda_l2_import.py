"""Importer of CUDA-L2-style M_N_K.cu kernel directories (gemmrl.kernels.cuda_l2_import).

CPU tier: discovery, entry/layout/red-flag analysis, cache keys, the CUTLASS message, and one slow test
(``test_slow_*``, ~1 min on 2 cores, skipped without nvcc): a real compile of a correct and a broken synthetic
kernel through the same builder, which on a CPU build of torch stops at the link step.
GPU tier (``gpu``): a naive fp32-accumulating HGEMM built, loaded and checked against torch.matmul.
All kernel sources here are written for these tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gemmrl.kernels import cuda_l2_import as imp
from gemmrl.kernels import toolchain
from gemmrl.problem import GemmProblem

SIG = "void {name}(torch::Tensor a, torch::Tensor b, torch::Tensor b_col_major, torch::Tensor c)"


def _src(body: str, name: str = "cuda_l2_h100_fp32", pre: str = "") -> str:
    return f"#include <torch/extension.h>\n{pre}\n{SIG.format(name=name)} {{\n{body}\n}}\n"


TN_BODY = """  const int M = a.size(0), K = a.size(1), N = b.size(1);
  auto* A = reinterpret_cast<const half*>(a.data_ptr());
  auto* B = reinterpret_cast<const half*>(b_col_major.data_ptr());
  auto* C = reinterpret_cast<half*>(c.data_ptr());
  kern<<<1, 32, 0, stream>>>(A, B, C, M, N, K);"""
NN_BODY = TN_BODY.replace("b_col_major.data_ptr", "b.data_ptr")


# ------------------------------------------------------------------------------------------------ discovery
def test_discover_keeps_mnk_files_and_notes_the_rest(tmp_path):
    for name in ("64_128_256.cu", "1_4096_4096.cu", "0064_64_64.cu", "readme.md", "64_64.cu", "a_b_c.cu",
                 "64_64_64.cuh", "0_64_64.cu"):
        (tmp_path / name).write_text(_src(TN_BODY))
    (tmp_path / "128_128_128.cu").mkdir()
    found = imp.discover(tmp_path)
    assert sorted(found) == ["1_4096_4096", "64_128_256", "64_64_64"]
    assert found["64_64_64"].name == "0064_64_64.cu"  # canonical key from a zero-padded name
    ignored = dict(found.ignored)
    for name in ("readme.md", "64_64.cu", "a_b_c.cu", "64_64_64.cuh", "0_64_64.cu", "128_128_128.cu"):
        assert name in ignored, name
    assert "not a valid shape" in ignored["0_64_64.cu"]


def test_discover_rejects_a_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        imp.discover(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------ analysis
def test_entry_and_layout_tn():
    info = imp.analyze_source(_src(TN_BODY))
    assert info.entry == "cuda_l2_h100_fp32"
    assert info.params == ("a", "b", "b_col_major", "c")
    assert (info.layout, info.layout_detected) == ("tn", "tn")
    assert info.layout_evidence["b_col_major"] == ["b_col_major.data_ptr"]
    assert info.layout_evidence["b"] == []  # b.size(1) is metadata, not a read


def test_layout_nn_and_multiline_signature_and_const_ref():
    src = ("#include <torch/extension.h>\nvoid my_gemm(\n  const torch::Tensor& a,\n  const at::Tensor &b,\n"
           "  torch::Tensor bt, torch::Tensor c)\n{\n" + NN_BODY + "\n}\n")
    info = imp.analyze_source(src)
    assert info.entry == "my_gemm"
    assert info.params == ("a", "b", "bt", "c")
    assert info.param_types[:2] == ("const torch::Tensor&", "const at::Tensor &")
    assert (info.layout, info.layout_detected) == ("nn", "nn")


def test_layout_both_and_neither_are_said_and_declared_tn():
    both = TN_BODY + "\n  auto* Brow = b.data_ptr<at::Half>();"
    info = imp.analyze_source(_src(both))
    assert (info.layout_detected, info.layout) == ("both", "tn")
    assert any("both" in n for n in info.notes)
    neither = "  (void)b; CHECK_SHAPE(b_col_major, 1, 2); int n = b.size(1) + b_col_major.stride(0);"
    info = imp.analyze_source(_src(neither))
    assert (info.layout_detected, info.layout) == ("neither", "tn")
    assert any("neither" in n for n in info.notes)


def test_layout_read_through_a_macro_or_helper():
    pre = "#define LAUNCH(x) launch(reinterpret_cast<half*>(a.data_ptr()), reinterpret_cast<half*>(b_col_major.data_ptr()), x)"
    info = imp.analyze_source(_src("  CHECK_SHAPE(b, 1, 2);\n  LAUNCH(3);", pre=pre))
    assert info.layout_detected == "tn"
    info = imp.analyze_source(_src("  (void)b_col_major;\n  auto* p = raw_ptr(b);"))
    assert info.layout_detected == "nn"
    assert info.layout_evidence["b"] == ["auto* p = raw_ptr(b);"]


def test_comments_do_not_count():
    body = "  // b_col_major.data_ptr() cudaDeviceSynchronize();\n  /* cudaMalloc(&p, 4); */\n" + NN_BODY
    info = imp.analyze_source(_src(body))
    assert info.layout_detected == "nn"
    assert not {"device_sync", "device_malloc"} & {f["flag"] for f in info.red_flags}


def test_entry_errors_and_override():
    with pytest.raises(imp.EntryError, match="no entry point"):
        imp.analyze_source("#include <torch/extension.h>\nvoid f(torch::Tensor a, torch::Tensor b) {}\n")
    two = _src(TN_BODY, name="first") + SIG.format(name="second") + " {\n" + NN_BODY + "\n}\n"
    with pytest.raises(imp.EntryError, match="several functions"):
        imp.analyze_source(two)
    assert imp.analyze_source(two, entry="second").layout == "nn"
    with pytest.raises(imp.EntryError, match="no definition of entry 'third'"):
        imp.analyze_source(two, entry="third")
    # a declaration alone is not a definition; a conventional cuda_l2_* name wins over a helper
    decl = SIG.format(name="cuda_l2_x") + ";\n" + _src(TN_BODY, name="helper") + _src(NN_BODY, name="cuda_l2_x")
    assert imp.analyze_source(decl).entry == "cuda_l2_x"
    with pytest.raises(imp.EntryError, match="static"):
        imp.analyze_source(_src(TN_BODY).replace("void cuda_l2", "static void cuda_l2"))


def test_entry_in_namespace_and_preprocessor_branches():
    src = ("#include <torch/extension.h>\nnamespace outer { namespace inner {\n"
           + SIG.format(name="cuda_l2_h100_fp32") + " {\n" + TN_BODY + "\n}\n}}\n")
    info = imp.analyze_source(src)
    assert info.namespace == ("outer", "inner")
    binding = imp.binding_source(info, "64_64_64", "64_64_64.cu")
    assert "namespace outer { namespace inner { void cuda_l2_h100_fp32(" in binding
    assert "outer::inner::cuda_l2_h100_fp32(a, b, bt, c);" in binding
    twice = "#if defined(X)\n" + _src(TN_BODY) + "#else\n" + _src('  throw std::runtime_error("no");') + "#endif\n"
    info = imp.analyze_source(twice)
    assert info.layout_detected == "tn" and any("2 times" in n for n in info.notes)


def test_red_flags_in_and_out_of_the_call_path():
    pre = """static int g_best = -1;
static void unused_helper() { void* p; cudaMalloc(&p, 16); cudaStreamCreate(&s); }
static void tune(const half* A) {
  cudaEvent_t e0; cudaEventRecord(e0); cudaDeviceSynchronize(); g_best = 1;
  auto t = torch::empty({4}); kern<<<1, 32>>>(A);
}"""
    body = TN_BODY + "\n  if (g_best < 0) tune(A);"
    info = imp.analyze_source(_src(body, pre=pre))
    in_path = set(info.flags_in_call_path())
    assert {"device_sync", "self_timing", "tensor_alloc", "default_stream", "static_state"} <= in_path
    assert not {"device_malloc", "own_stream"} & in_path
    elsewhere = {f["flag"] for f in info.red_flags if not f["in_call_path"]}
    assert {"device_malloc", "own_stream"} <= elsewhere
    ds = [f for f in info.red_flags if f["flag"] == "device_sync"][0]
    assert ds["line"] == 5 and "cudaDeviceSynchronize" in ds["text"]
    # a launch with an explicit stream (4 launch args) is not a default-stream launch
    clean = imp.analyze_source(_src(TN_BODY))
    assert clean.flags_in_call_path() == []


def test_needs_cutlass_only_when_included():
    assert not imp.analyze_source(_src(TN_BODY)).needs_cutlass
    assert imp.analyze_source(_src(TN_BODY, pre='#include "cutlass/cutlass.h"')).needs_cutlass
    assert imp.analyze_source(_src(TN_BODY, pre="#include <cute/tensor.hpp>")).needs_cutlass


# ------------------------------------------------------------------------------------------------ build bits
def test_cache_key_changes_with_each_input():
    base = dict(flags=["-O3"], arch="90a", torch_version="2.11.0", cuda_version="13.0/13.0.88", entry="e",
                mnk="64_64_64", dtype="fp16", cutlass="4.2.0")
    k0 = imp.cache_key("src", **base)
    assert k0 == imp.cache_key(b"src", **base)  # deterministic, str or bytes
    changes = {"flags": ["-O2"], "arch": "100a", "torch_version": "2.13.0", "cuda_version": "12.8/12.8.93",
               "entry": "f", "mnk": "64_64_128", "dtype": "bf16", "cutlass": "4.3.0"}
    keys = {imp.cache_key("src", **{**base, k: v}) for k, v in changes.items()}
    keys.add(imp.cache_key("src ", **base))
    assert k0 not in keys and len(keys) == len(changes) + 1


def test_build_flags_follow_cuda_l2_and_the_arch():
    flags = imp.build_flags("90a")
    for f in ("-O3", "--use_fast_math", "--expt-relaxed-constexpr", "--expt-extended-lambda",
              "-U__CUDA_NO_HALF_OPERATORS__", "-Xptxas=-v"):
        assert f in flags
    assert flags[-1] == "-gencode=arch=compute_90a,code=sm_90a"
    assert "-DNDEBUG" in flags and "-DNDEBUG" not in imp.build_flags("90a", ndebug=False)  # CUDA-L2's exact build
    assert not any(f.startswith("-std") for f in flags)  # torch picks the standard its headers need


def test_arch_env_override_by_its_older_name(monkeypatch):
    monkeypatch.delenv("GEMMRL_CUDA_ARCH", raising=False)
    monkeypatch.setenv("GEMMRL_IMPORT_ARCH", "sm_90a")
    assert toolchain.arch_for() == "90a"
    monkeypatch.setenv("GEMMRL_IMPORT_ARCH", "9.0a")
    assert toolchain.arch_for() == "90a"


def test_missing_cutlass_gives_the_clear_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cutlass_library", None)  # import fails
    monkeypatch.delenv("CUTLASS_DIR", raising=False)
    with pytest.raises(toolchain.CutlassNotFound, match=r"pip install nvidia-cutlass.*CUTLASS_DIR"):
        toolchain.cutlass_include_dirs()
    monkeypatch.setenv("CUTLASS_DIR", str(tmp_path))
    with pytest.raises(toolchain.CutlassNotFound, match="has no include/cutlass/cutlass.h"):
        toolchain.cutlass_include_dirs()
    (tmp_path / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "include" / "cutlass" / "cutlass.h").write_text("")
    assert toolchain.cutlass_include_dirs() == [tmp_path / "include", tmp_path / "tools" / "util" / "include"]
    # and through load_kernel_dir: a structured failure, no compile attempted
    monkeypatch.delenv("CUTLASS_DIR")
    kdir = tmp_path / "kset"
    kdir.mkdir()
    (kdir / "64_64_64.cu").write_text(_src(TN_BODY, pre="#include <cute/tensor.hpp>"))
    res = imp.load_kernel_dir(kdir, [GemmProblem(64, 64, 64), "128_128_128"], progress=False)
    assert res["64_64_64"].stage == "cutlass" and "pip install nvidia-cutlass" in res["64_64_64"].message
    assert res["128_128_128"].missing and "no 128_128_128.cu" in res["128_128_128"].reason


def test_parse_build_log_nvcc_gcc_and_link():
    log = ("[1/3] /usr/local/cuda/bin/nvcc -c kernel.cu ...\n"
           "/cache/b/kernel.cu(12): error: expected a \";\"\n  int x = 1\n")
    p = toolchain.parse_build_log(log, "/cache/b", "/k/64_64_64.cu")
    assert p == {"stage": "compile", "file": "/k/64_64_64.cu", "line": 12, "message": 'expected a ";"'}
    p = toolchain.parse_build_log("/cache/b/binding.cpp:7:3: error: 'foo' was not declared\n", "/cache/b", "/k/x.cu")
    assert (p["stage"], p["line"], p["message"]) == ("compile", 7, "'foo' was not declared")
    assert "binding.cpp (generated)" in p["file"]
    p = toolchain.parse_build_log("ok\n/usr/bin/ld: cannot find -lc10_cuda: No such file\n", "/cache/b", "/k/x.cu")
    assert p["stage"] == "link" and "c10_cuda" in p["message"]
    p = toolchain.parse_build_log("something odd happened\n")
    assert p["stage"] == "build"
    head = toolchain.log_head("[1/2] nvcc " + "x" * 50 + "\nline a\n\nline b\n")
    assert head == "line a\nline b"
    noisy = "\n".join(f"warning {i}" for i in range(50)) + "\nk.cu(3): error: boom\nafter\n"
    assert toolchain.log_head(noisy, n=5).splitlines() == ["warning 47", "warning 48", "warning 49", "k.cu(3): error: boom", "after"]


def test_only_errors_in_the_kernel_source_are_cached():
    src = "/k/64_64_64.cu"
    assert imp._cacheable({"stage": "compile", "file": src, "message": 'expected a ";"'}, src)
    assert not imp._cacheable({"stage": "compile", "file": "/torch/include/x.h", "message": "boom"}, src)
    assert not imp._cacheable({"stage": "compile", "file": src, "message": 'cannot open source file "cute/x.hpp"'}, src)
    assert not imp._cacheable({"stage": "link", "file": src, "message": "cannot find -lc10_cuda"}, src)


def test_parse_ptxas():
    text = ("ptxas info    : Used 128 registers, used 1 barriers\n    0 bytes stack frame, 8 bytes spill stores, "
            "4 bytes spill loads\nptxas info    : Used 40 registers\n    0 bytes stack frame, 0 bytes spill stores, "
            "0 bytes spill loads\n")
    text += ("ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
             "to wgmma pipeline crossing function boundary at a function call in the function '_Z1fv'\n")
    assert toolchain.Ptxas.parse(text).as_record(smem=False) == {  # an imported kernel's build record
        "kernels": 2, "max_registers": 128, "spill_store_bytes": 8, "spill_load_bytes": 4,
        "perf_warnings": ["C7510: wgmma.mma_async instructions are serialized due to wgmma pipeline crossing "
                          "function boundary at a function call"]}


def test_binding_checks_shape_dtype_and_declares_exact_types():
    src = _src(TN_BODY).replace("torch::Tensor a,", "const torch::Tensor& a,")
    info = imp.analyze_source(src)
    text = imp.binding_source(info, "64_128_256", "64_128_256.cu", "bf16")
    assert "void cuda_l2_h100_fp32(const torch::Tensor& a, torch::Tensor b, torch::Tensor b_col_major" in text
    assert "M = 64, N = 128, K = 256" in text
    assert "at::kBFloat16" in text and "serves only M_N_K = 64_128_256" in text
    assert 'm.def("run"' in text
    assert "#define GEMMRL_JOIN_LEGACY 0" in text  # TN_BODY launches on a stream it is given


def test_legacy_stream_join_only_where_the_source_launches_on_the_default_stream():
    legacy = imp.analyze_source(_naive())  # <<<..., 0, 0>>>: a stream argument of 0 is the legacy stream
    assert imp.joins_legacy_stream(legacy) and "default_stream" in legacy.flags_in_call_path()
    assert "#define GEMMRL_JOIN_LEGACY 1" in imp.binding_source(legacy, "64_64_64", "64_64_64.cu")
    current = imp.analyze_source(_naive(stream_include="#include <c10/cuda/CUDAStream.h>",
                                        stream="c10::cuda::getCurrentCUDAStream()"))
    assert not imp.joins_legacy_stream(current)
    assert "#define GEMMRL_JOIN_LEGACY 0" in imp.binding_source(current, "64_64_64", "64_64_64.cu")
    nostream = imp.analyze_source(_src(TN_BODY.replace("<<<1, 32, 0, stream>>>", "<<<1, 32>>>")))
    assert imp.joins_legacy_stream(nostream)


def test_candidate_convention_and_supports():
    calls = []
    cand = imp.ImportedCandidate("import:set", "64_128_256", "tn", lambda *a: calls.append(a), acc="fp32",
                                 build={"hash": "abc"})
    assert (cand.name, cand.layout, cand.acc, cand.ok) == ("import:set", "tn", "fp32", True)
    cand(1, 2, 3, 4)
    assert calls == [(1, 2, 3, 4)]

    class T:  # a tensor's device index is all the stream getter needs
        device = type("D", (), {"index": 3})()
    streamed = imp.ImportedCandidate("import:set", "64_128_256", "tn", lambda *a: calls.append(a),
                                     stream=lambda d: 1000 + d)
    streamed(T, 2, 3, 4)
    assert calls[-1] == (T, 2, 3, 4, 1003)  # torch's current stream goes to the binding
    assert cand.prepare(None, None, "graph", None) is None
    assert cand.info() == {"hash": "abc"}
    assert cand.supports(GemmProblem(64, 128, 256)) and not cand.supports(GemmProblem(64, 128, 512))
    assert not cand.supports(GemmProblem(64, 128, 256, dtype="bf16"))


def test_nothing_happens_at_import():
    import subprocess

    code = ("import sys, gemmrl.kernels.cuda_l2_import as m; "
            "assert 'torch.utils.cpp_extension' not in sys.modules; "
            "import torch; assert not torch.cuda.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ compiling
def _nvcc_or_skip():
    tc = imp.toolchain()
    if not tc["nvcc"]:
        pytest.skip("no nvcc here (set CUDA_HOME): compile tests need the CUDA toolkit")
    from torch.utils.cpp_extension import include_paths

    if not (Path(include_paths()[0]) / "ATen" / "core" / "Tensor.h").is_file():
        pytest.skip("torch headers missing")
    return tc


# Light headers (ATen/core/Tensor.h, not torch/extension.h) keep the compile test short on small CI machines.
NAIVE = r"""#include <ATen/core/Tensor.h>
#include <cuda_fp16.h>
{stream_include}
// naive HGEMM: one thread per output, fp32 accumulation, reads B^T [N,K] (b_col_major)
__global__ void naive_hgemm(const half* A, const half* Bt, half* C, int M, int N, int K) {{
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N || m >= M) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += __half2float(A[(size_t)m * K + k]) * __half2float(Bt[(size_t)n * K + k]);
  C[(size_t)m * N + n] = __float2half(acc);
}}

void naive_entry(at::Tensor a, at::Tensor b, at::Tensor b_col_major, at::Tensor c) {{
  const int M = a.size(0), K = a.size(1), N = b.size(1);
  naive_hgemm<<<dim3((N + 127) / 128, M), 128, 0, {stream}>>>(
      reinterpret_cast<const half*>(a.data_ptr()), reinterpret_cast<const half*>(b_col_major.data_ptr()),
      reinterpret_cast<half*>(c.data_ptr()), M, N, K);
  {syntax_error}
}}
"""


def _naive(stream_include: str = "", stream: str = "0", syntax_error: str = "") -> str:
    return NAIVE.format(stream_include=stream_include, stream=stream, syntax_error=syntax_error)


def test_slow_compile_good_and_broken_kernels_in_parallel(tmp_path, monkeypatch):
    """~1 min on 2 cores: a correct kernel compiles (on a CPU build of torch it then fails to *link*,
    which says compilation passed); a syntax error comes back structured; the second import is cached."""
    tc = _nvcc_or_skip()
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")
    kdir = tmp_path / "synthetic"
    kdir.mkdir()
    (kdir / "64_64_64.cu").write_text(_naive())
    (kdir / "128_64_64.cu").write_text(_naive(syntax_error="int x = ;  // deliberate"))
    res = imp.load_kernel_dir(kdir, ["64_64_64", "128_64_64"], progress=False, jobs=2)
    bad = res["128_64_64"]
    assert isinstance(bad, imp.ImportFailure) and bad.stage == "compile", bad
    assert bad.file == str(kdir / "128_64_64.cu")
    lines = (kdir / "128_64_64.cu").read_text().splitlines()
    assert "deliberate" in lines[bad.line - 1]
    assert "expected an expression" in bad.message
    assert "error" in bad.log_head and Path(bad.log_path).is_file()
    good = res["64_64_64"]
    if tc["torch_cuda"] == "None":  # CPU torch: compiled, cannot link against torch's CUDA libraries
        assert isinstance(good, imp.ImportFailure) and good.stage == "link", good
        bdir = Path(good.log_path).parent
        assert (bdir / "kernel.cuda.o").is_file() and (bdir / "binding.o").is_file()
        assert "Used" in (bdir / "build.log").read_text()  # ptxas -v output is kept
    else:
        assert isinstance(good, imp.ImportedCandidate), good
        assert good.info()["layout_detected"] == "tn" and good.info()["ptxas"]["kernels"] >= 1
    # second import: the compile error is cached (no compile), a rebuild is asked for with force=True
    again = imp.load_kernel_dir(kdir, ["128_64_64"], progress=False)["128_64_64"]
    assert again.cached and again.stage == "compile" and again.line == bad.line


# ------------------------------------------------------------------------------------------------ GPU tier
_GPU_CHILD = r"""
import sys
import torch
from pathlib import Path
from gemmrl.candidate import make_buffers
from gemmrl.kernels import cuda_l2_import as imp
from gemmrl.problem import GemmProblem


def main(kdir):
    probs = [GemmProblem(64, 128, 256), GemmProblem(100, 72, 40)]
    print("child: building", flush=True)
    res = imp.load_kernel_dir(kdir, probs, progress=False)
    print("child: loaded", {k: type(v).__name__ for k, v in res.items()}, flush=True)
    for p in probs:
        cand = res[p.mnk]
        assert isinstance(cand, imp.ImportedCandidate), getattr(cand, "log_head", cand)
        assert (cand.name, cand.layout) == ("import:naive_set", "tn")
        assert cand.info()["arch"].endswith("a") or torch.cuda.get_device_capability()[0] < 9
        bufs = make_buffers(p, "cuda", seed=1)
        print("child: calling", p.mnk, flush=True)
        cand(*bufs.args())
        torch.cuda.synchronize()
        print("child: called", p.mnk, flush=True)
        ref = (bufs.a.double() @ bufs.b.double()).to(torch.float16)
        torch.testing.assert_close(bufs.c, ref, atol=2e-3, rtol=2e-3)
        from gemmrl.verify import check_stream_order
        so = check_stream_order(cand, p, "cuda")
        assert so.passed, so.reason
    # a call with another shape or dtype is refused with a clear message
    for shape, dtype, needle in (((64, 128, 512), "fp16", "serves only M_N_K = 64_128_256"),
                                 ((64, 128, 256), "bf16", "imported for fp16")):
        other = make_buffers(GemmProblem(*shape, dtype=dtype), "cuda")
        try:
            res["64_128_256"](*other.args())
        except RuntimeError as e:
            assert needle in str(e), e
        else:
            raise AssertionError(f"call with {shape} {dtype} was not refused")
    # second import: cached, no compile
    again = imp.load_kernel_dir(kdir, probs[:1], progress=False)["64_128_256"]
    assert again.info()["cached"] is True and again.info()["hash"] == res["64_128_256"].info()["hash"]
    print("CHILD-OK")


if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason="known bug, seen 3 times on the H100 (the CUDA-L2 import run): of two modules built from one "
                   "source that uses c10::cuda::getCurrentCUDAStream(), the second segfaults when called on a "
                   "torch pool stream (stream_order check); the first passes, and the default stream works. "
                   "CUDA-L2's one such file (128_8192_1024) imports and passes. Suspect: hidden visibility + "
                   "-Bsymbolic giving each module its own copy of c10's inline stream code")
def test_gpu_naive_kernel_matches_torch(tmp_path):
    """Builds two modules from one source and runs them in a child process: a kernel that faults takes
    down the child, not the test session (the CUTLASS-family bar's sandbox generalises this)."""
    import subprocess
    import sys

    kdir = tmp_path / "naive_set"
    kdir.mkdir()
    # the header set of CUDA-L2's one kernel that uses the current stream (128_8192_1024.cu), which ran on the
    # H100 on torch's pool streams; with <c10/cuda/CUDAStream.h> alone this kernel segfaulted there on a pool
    # stream (not yet explained; the default stream worked)
    src = _naive(stream_include="#include <torch/extension.h>\n#include <c10/cuda/CUDAStream.h>",
                 stream="c10::cuda::getCurrentCUDAStream()")
    for mnk in ("64_128_256", "100_72_40"):
        (kdir / f"{mnk}.cu").write_text(src)
    child = tmp_path / "child.py"
    child.write_text(_GPU_CHILD)
    env = {**os.environ, "GEMMRL_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-X", "faulthandler", str(child), str(kdir)], capture_output=True,
                         text=True, env=env, timeout=900)
    print(out.stdout[-4000:], "\n--- stderr ---\n", out.stderr[-8000:])  # shown by pytest on failure
    assert out.returncode == 0 and "CHILD-OK" in out.stdout, (out.returncode, out.stdout[-300:])
