"""CPU tier for the library of winners: entries, the JSON file, lookup, building from rows, trials, `gemmrl lib`."""

import gzip
import json
import math
from pathlib import Path

import pytest

from gemmrl import library as L
from gemmrl.cli.main import main
from gemmrl.library import (PROTOCOL_ORDER, Entry, Library, LibraryError, TrialsStore, add_to_user_library,
                            build_entries, load_default, packaged, user_library_path)
from gemmrl.results import COLUMNS, ResultsWriter
from gemmrl.summary import BASELINES
from conftest import script_module

GPU, GPU2 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
CFG = "tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)"
CFG2 = "tiled(BM=128,BN=64,BK=32,warps=4,stages=3,group_m=8)"
CUT = "coop_128x128x64_c1x1_persistent_nn_fp16:s1_rh_dheuristic_k1"  # CUTLASS <config>:<knobs> (kernels/cutlass_sm90)
CUT2 = "pingpong_64x64x128_c1x1_persistent_nn_fp16:s8_rh_dheuristic_k1"


def _entry(M=64, N=128, K=256, **kw):
    d = dict(gpu=GPU, cc="9.0", dtype="fp16", acc="fp32", layout="nn", protocol="offline", M=M, N=N, K=K,
             family="triton", impl=CFG, algo=CFG, time_ms=0.01, vendor_best_ms=0.02, vendor_best="cublas_nn",
             m_lo=M, m_hi=M, members=(f"{M}_{N}_{K}",), verified=True, torch="2.5.0", timestamp="t0")
    d.update(kw)
    return Entry(**d)


def _bucket(lo, hi, N=128, K=256, **kw):
    return _entry(M=lo, N=N, K=K, m_lo=lo, m_hi=hi, members=(f"{lo}_{N}_{K}", f"{hi}_{N}_{K}"), **kw)


def _row(mnk, cand, time_ms, layout="nn", protocol="offline", algo="", **kw):
    r = {c: "" for c in COLUMNS}
    m, n, k = mnk.split("_")
    r.update(mnk=mnk, dtype="fp16", acc="fp32", layout=layout, candidate=cand, protocol=protocol,
             time_ms=str(time_ms), tflops=str(2 * int(m) * int(n) * int(k) / (time_ms * 1e9)), n="10",
             verified="true", floor_ok="true", rep="0", recheck="", members="", gpu=GPU, cc="9.0", algo=algo,
             M=m, N=n, K=k, torch="2.5.0", triton="3.1.0", timestamp="2026-01-01T00:00:00Z")
    r.update(kw)
    return r


S = "64_128_256"
BASE = [  # offline nn: triton CFG wins; offline tn: cublas_tn (also vendor_best); graph nn: triton-sel (CFG2)
    _row(S, f"triton:{CFG}", 1.0, algo=CFG), _row(S, f"triton:{CFG2}", 1.5, algo=CFG2),
    _row(S, "cublas_nn", 2.0), _row(S, "cublas_tn", 1.2, layout="tn"), _row(S, "torch", 3.0, layout="tn"),
    _row(S, "triton-sel:graph", 0.5, protocol="graph", algo=CFG2), _row(S, "cublas_nn", 0.8, protocol="graph"),
    _row("128_128_256", f"triton:{CFG}", 1.0, algo=CFG),  # no vendor row: no entry
]


def _by(entries):
    return {(e.mnk, e.layout, e.protocol, e.m_lo, e.m_hi): e for e in entries}


# -- Entry ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, word", [
    (dict(family="wgmma"), "family"), (dict(layout="tt"), "layout"),
    (dict(family="cutlass"), "cannot read CUTLASS config"),  # a Triton config string is not a CUTLASS impl
    (dict(family="cutlass", impl=CUT.replace("_nn_", "_tn_")), "tn/fp16 config for a nn/fp16 entry"),
    (dict(family="cutlass", impl=CUT, dtype="bf16"), "nn/fp16 config for a nn/bf16 entry"),
    (dict(family="cutlass", impl=CUT.replace("k1", "kx")), "cannot read knobs"), (dict(dtype="fp32"), "dtype/acc"),
    (dict(acc="bf16"), "dtype/acc"), (dict(family="vendor", impl="cublas_xx"), "vendor impl"),
    (dict(time_ms=0.0), "time_ms"), (dict(time_ms=-1.0), "time_ms"), (dict(time_ms=math.nan), "time_ms"),
    (dict(M=0, m_lo=0, m_hi=0), "shape"), (dict(N=0), "shape"), (dict(m_lo=128, m_hi=256), "M range"),
    (dict(m_lo=1, m_hi=32), "M range"),
])
def test_entry_validation(kw, word):
    with pytest.raises(LibraryError, match=word):
        _entry(**kw)


@pytest.mark.parametrize("e", [_entry(), _bucket(64, 512),
                               _entry(family="vendor", impl="cublaslt_autotuned_tn", algo="algo 7", layout="tn"),
                               _entry(family="cutlass", impl=CUT, algo=CUT)])
def test_entry_dict_round_trip(e):
    assert Entry.from_dict(e.to_dict()) == e
    assert Entry.from_dict(json.loads(json.dumps(e.to_dict()))) == e  # members come back as a tuple
    assert e.speedup == pytest.approx(e.vendor_best_ms / e.time_ms)


@pytest.mark.parametrize("field", [pytest.param("gpu", id="gpu_name"), "M", "K", "family", "time_ms",
                                   "vendor_best_ms", "m_hi", "members", "verified"])
def test_from_dict_missing_field(field):
    d = _entry().to_dict()
    del d[field]
    with pytest.raises(LibraryError, match=f"without.*'{field}'"):
        Entry.from_dict(d)


@pytest.mark.parametrize("field, value", [("M", "abc"), ("N", None), ("m_lo", "1.5"), ("time_ms", "fast"),
                                          ("vendor_best_ms", None), ("members", 5), ("verified", "false"),
                                          ("verified", 1)])
def test_from_dict_malformed(field, value):
    d = dict(_entry().to_dict(), **{field: value})
    with pytest.raises(LibraryError, match="malformed"):
        Entry.from_dict(d)
    with pytest.raises(LibraryError, match="not an object"):
        Entry.from_dict([d])


@pytest.mark.parametrize("members", [("a;b",), ("64_256",), ("64_256_x",), ("64_256_256", "")])
def test_entry_rejects_malformed_members(members):
    with pytest.raises(LibraryError, match="members"):
        _entry(members=members)


# -- the file ---------------------------------------------------------------------------------------------
def test_save_load_round_trip(tmp_path):
    cut = _entry(M=32, family="cutlass", impl=CUT, algo=CUT)
    lib = Library([_entry(), _entry(M=128), _bucket(64, 128), _entry(gpu=GPU2, family="vendor", impl="torch"), cut])
    p = lib.save(tmp_path / "sub" / "lib.json")
    got = Library.load(p)
    assert set(got.entries) == set(lib.entries) and len(got.entries) == 5
    assert got.lookup(GPU, "fp16", "fp32", "nn", "offline", 32, 128, 256) == cut
    assert got.sources == (str(p),)
    assert [x.name for x in p.parent.iterdir()] == ["lib.json"]  # no .tmp left behind
    assert got.lookup(GPU, "fp16", "fp32", "nn", "offline", 100, 128, 256) == _bucket(64, 128)


def test_save_load_gzipped(tmp_path):
    """A name ending .gz is written gzipped, and any name is read either way (a grid library is megabytes)."""
    import gzip

    lib = Library([_entry(), _entry(M=128), _bucket(64, 128)])
    p = lib.save(tmp_path / "lib.json.gz")
    assert p.read_bytes()[:2] == b"\x1f\x8b" and json.loads(gzip.decompress(p.read_bytes()))["format"]
    assert set(Library.load(p).entries) == set(lib.entries)
    assert lib.save(tmp_path / "again.json.gz").read_bytes() == p.read_bytes()  # same library, same bytes
    plain = tmp_path / "renamed.json"
    plain.write_bytes(p.read_bytes())
    assert set(Library.load(plain).entries) == set(lib.entries)
    (tmp_path / "cut.json.gz").write_bytes(p.read_bytes()[:40])  # a truncated download
    with pytest.raises(LibraryError, match="gemmrl lib build"):
        Library.load(tmp_path / "cut.json.gz")


def _edit(key, value):
    def f(doc):
        doc[key] = value
        return json.dumps(doc)
    return f


def _edit_entry(doc):
    doc["entries"][0]["time_ms"] /= 2
    return json.dumps(doc)


@pytest.mark.parametrize("mutate, words", [
    (lambda doc: "{not json", ["gemmrl lib build", "gemmrl lib import"]),
    (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "format"}), ["format", "gemmrl lib export"]),
    (_edit("format", "something-else"), ["format"]),
    (lambda doc: json.dumps(doc["entries"]), ["format"]),
    (_edit("schema", 2), ["schema 2", "gemmrl lib build"]),
    (_edit("entries", {}), ["not a list"]),
    (_edit_entry, ["checksum", "gemmrl lib build"]),
    (lambda doc: json.dumps(dict(doc, entries=doc["entries"][:1])), ["checksum"]),
    (_edit("sha256", "0" * 64), ["checksum"]),
])
def test_load_refuses(tmp_path, mutate, words):
    p = Library([_entry(), _entry(M=128)]).save(tmp_path / "lib.json")
    p.write_text(mutate(json.loads(p.read_text())))
    with pytest.raises(LibraryError) as ei:
        Library.load(p)
    for w in words:
        assert w in str(ei.value)


def test_load_refuses_missing_binary_and_bad_entry(tmp_path):
    with pytest.raises(LibraryError, match="no such library file"):
        Library.load(tmp_path / "nope.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(LibraryError, match="gemmrl lib build"):
        Library.load(tmp_path / "bin.json")
    # a consistent checksum does not make a bad entry acceptable
    bad = dict(_entry().to_dict(), family="wgmma")
    doc = {"format": L.FORMAT, "schema": L.SCHEMA, "sha256": L._digest([bad]), "entries": [bad]}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(LibraryError, match="family"):
        Library.load(tmp_path / "bad.json")


# -- lookup -----------------------------------------------------------------------------------------------
def _look(lib, M, gpu=GPU, dtype="fp16", acc="fp32", layout="nn", protocol="offline", N=128, K=256):
    return lib.lookup(gpu, dtype, acc, layout, protocol, M, N, K)


def test_lookup_exact_bucket_and_misses():
    exact64, vendor128 = _entry(M=64), _entry(M=128, family="vendor", impl="cublas_nn", algo="a3")
    b = _bucket(64, 256, impl=CFG2)
    lib = Library([exact64, b, vendor128])
    assert _look(lib, 64) is exact64 and _look(lib, 128) is vendor128  # exact entries win over the bucket
    assert _look(lib, 256) is b and _look(lib, 100) is b and _look(lib, 200) is b
    for M in (63, 257, 1024):
        assert _look(lib, M) is None
    for kw in (dict(gpu=GPU2), dict(dtype="bf16"), dict(acc="fp16"), dict(layout="tn"), dict(protocol="graph"),
               dict(N=256), dict(K=128)):
        assert _look(lib, 100, **kw) is None and _look(lib, 64, **kw) is None


def test_lookup_narrowest_bucket_and_bucket_members():
    wide, narrow = _bucket(64, 1024), _bucket(128, 256, impl=CFG2)
    lib = Library([wide, narrow])
    assert _look(lib, 200) is narrow and _look(lib, 512) is wide and _look(lib, 100) is wide
    assert _look(lib, 64) is wide and _look(lib, 1024) is wide  # members served without an exact entry


@pytest.mark.parametrize("protos", [("graph", "offline"), ("offline", "cold"), ("cold",), ("server", "graph")])
def test_lookup_any_protocol_order(protos):
    ents = {p: _entry(protocol=p, impl=f"cfg-{p}") for p in protos}
    lib = Library(ents.values())
    for mode, order in PROTOCOL_ORDER.items():
        want = next(p for p in order if p in ents)
        assert lib.lookup_any(GPU, "fp16", "fp32", "nn", order, 64, 128, 256) is ents[want], mode
        assert lib.lookup_any(GPU2, "fp16", "fp32", "nn", order, 64, 128, 256) is None
    assert PROTOCOL_ORDER["graph"][0] == "graph" and PROTOCOL_ORDER["eager"][0] == "offline"


def test_merge_second_wins():
    a1, a2, ab = _entry(), _entry(M=512), _bucket(64, 256)
    b1, bb = _entry(impl=CFG2, time_ms=0.005), _bucket(64, 256, impl=CFG2)
    a, b = Library([a1, a2, ab], ("a",)), Library([b1, bb], ("b",))
    m = a.merge(b)
    assert _look(m, 64) is b1 and _look(m, 512) is a2 and _look(m, 100) is bb and _look(m, 256) is bb
    assert len(m.entries) == 3 and m.sources == ("a", "b")
    assert _look(a, 64) is a1 and _look(a, 100) is ab  # the first library is unchanged
    assert _look(b.merge(a), 64) is a1


# -- building from rows -----------------------------------------------------------------------------------
def test_build_entries_winners():
    got = _by(build_entries(BASE, buckets=False))
    assert set(got) == {(S, "nn", "offline", 64, 64), (S, "tn", "offline", 64, 64), (S, "nn", "graph", 64, 64)}
    nn = got[(S, "nn", "offline", 64, 64)]
    assert (nn.family, nn.impl, nn.time_ms) == ("triton", CFG, 1.0)
    assert (nn.vendor_best, nn.vendor_best_ms) == ("cublas_tn", 1.2)  # fastest vendor over both layouts
    tn = got[(S, "tn", "offline", 64, 64)]
    assert (tn.family, tn.impl, tn.speedup) == ("vendor", "cublas_tn", 1.0)
    g = got[(S, "nn", "graph", 64, 64)]
    assert (g.family, g.impl, g.vendor_best, g.vendor_best_ms) == ("triton", CFG2, "cublas_nn", 0.8)
    assert all(e.gpu == GPU and e.torch == "2.5.0" and e.verified and e.members == (S,) for e in got.values())
    assert all(e.impl in BASELINES for e in got.values() if e.family == "vendor")


@pytest.mark.parametrize("bad", [
    _row(S, f"triton:{CFG2}", 0.1, algo=CFG2, verified="false"),
    _row(S, f"triton:{CFG2}", 0.1, algo=CFG2, floor_ok="false"),
    _row(S, "triton:tiled(BM=16,BN=16,BK=16,warps=1,stages=1,group_m=1)", 0.1,
         algo="tiled(BM=16,BN=16,BK=16,warps=1,stages=1,group_m=1)", recheck="1"),  # a re-measure without a first run
    _row(S, f"triton:{CFG2}", 0.1, algo=CFG2, rep="1"),
    _row(S, f"triton:{CFG2}", 0.1, algo=CFG2, members="a;b"),
    _row(S, "cublas_nn", 0.1, members="cublas_tn;cublas_nn"),
    _row(S, "cublas_tn", 0.1, layout="tn", verified="false"),
    _row(S, "cuda_l2:kernel7", 0.1),
    _row("128_128_256", "cublas_nn", 0.1, recheck="1"),
])
def test_build_entries_ignores(bad):
    assert _by(build_entries(BASE + [bad])) == _by(build_entries(BASE))


def test_build_entries_judges_by_median_over_runs():
    """Two runs: cublaslt_heuristic_nn drew one lucky measurement (0.9 in run a) and is slower everywhere else. By
    minimum the lucky path would win; by median (first runs and re-measurements alike) cublas_nn does."""
    rows = [_row(S, "cublas_nn", 1.0, source="a"), _row(S, "cublas_nn", 1.0, recheck="1", source="a"),
            _row(S, "cublas_nn", 1.0, source="b"),
            _row(S, "cublaslt_heuristic_nn", 0.9, source="a"), _row(S, "cublaslt_heuristic_nn", 1.2, source="b"),
            _row(S, "cublaslt_heuristic_nn", 1.2, recheck="2", source="b")]
    got = _by(build_entries(rows, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (got.impl, got.time_ms, got.vendor_best, got.vendor_best_ms) == ("cublas_nn", 1.0, "cublas_nn", 1.0)
    only_min = _by(build_entries([r for r in rows if r.get("source") == "a" and not r.get("recheck")],
                                 buckets=False))[(S, "nn", "offline", 64, 64)]
    assert only_min.impl == "cublaslt_heuristic_nn"
    # two algorithms of one vendor path are two candidates
    algos = [_row(S, "cublaslt_autotuned_nn", t, algo=a) for a, t in (("x", 1.0), ("y", 0.8), ("y", 0.9), ("x", 1.1))]
    e = _by(build_entries(algos, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.algo, e.time_ms) == ("y", pytest.approx(0.85))


def test_build_entries_compares_within_each_run():
    """Run b's machine is 20% slower (cold small shapes differed by ~25% between two H100 hosts). A CUTLASS config
    timed only in run a, 2% behind the vendor path there, beats the vendor's absolute median over both runs; judged
    against each run's own vendor time it loses. A run that timed no vendor path is judged against the others'."""
    rows = [_row(S, "cublas_nn", 1.0, source="a"), _row(S, "cublas_nn", 1.2, source="b"),
            _row(S, "cublas_nn", 1.2, recheck="1", source="b"),
            _row(S, f"cutlass:{CUT}", 1.02, algo=CUT, source="a")]
    e = _by(build_entries(rows, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl, e.time_ms, e.vendor_best_ms) == ("vendor", "cublas_nn", 1.2, 1.2)
    # 10% ahead of the vendor in run a: it wins, its vendor_best scaled by the relative medians (1.0 / 0.9)
    faster = [dict(r, time_ms="0.9") if r["candidate"].startswith("cutlass") else r for r in rows]
    e = _by(build_entries(faster, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.time_ms) == ("cutlass", 0.9) and e.vendor_best_ms == pytest.approx(1.0)  # 0.9 x 1.0 / 0.9
    assert e.speedup == pytest.approx(1 / 0.9)
    # a select run (source c) timed the config beside no vendor path: judged against the median reference (1.1)
    alone = rows + [_row(S, f"cutlass:{CUT}", 1.21, algo=CUT, source="c"), _row(S, f"cutlass:{CUT}", 1.21, algo=CUT,
                                                                               source="c")]
    e = _by(build_entries(alone, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl) == ("vendor", "cublas_nn")  # the config: 1.02, 1.1, 1.1 relative; cublas 1.0, 1.0, 1.0
    only = [r for r in alone if r.get("source") == "c"]
    assert build_entries(only, buckets=False) == []  # no vendor path anywhere: nothing to claim against


def test_build_entries_counts_what_gemmrl_served():
    """A Triton config won one selection measurement; two gemmrl.mm runs that it served measured it slower than the
    vendor path: by median it loses its entry. The same config under two labels is one candidate."""
    sel = [_row(S, "triton-sel:graph", 0.9, algo=CFG), _row(S, "cublas_nn", 1.0), _row(S, "cublas_nn", 1.0)]
    assert _by(build_entries(sel, buckets=False))[(S, "nn", "offline", 64, 64)].impl == CFG

    def served(t, eager=f"triton:{CFG}", protocol="offline"):
        return _row(S, "gemmrl", t, protocol=protocol,
                    algo=f"eager={eager} (offline entry {S}); graph=vendor:cublas_nn (graph entry {S}); hot=torch")

    lost = sel + [served(1.2), served(1.1)]
    e = _by(build_entries(lost, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl) == ("vendor", "cublas_nn")
    # what a vendor path served, a graph row's eager part, a host-timed call through another hot path, and other
    # labels of the same config
    slow_path = dict(served(1.2), algo=served(1.2)["algo"].replace("hot=torch", "hot=c"))
    others = sel + [served(1.2, eager="vendor:cublas_nn"), served(1.2, protocol="graph"), slow_path,
                    _row(S, "triton-sel:cold", 0.95, algo=CFG)]
    e = _by(build_entries(others, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl, e.time_ms) == ("triton", CFG, pytest.approx(0.925))  # median of 0.9 and 0.95


@pytest.mark.parametrize("rows, protocol, want", [
    ([("torch", 1.0), ("cublaslt_heuristic_nn", 1.015)], "cold", "cublaslt_heuristic_nn"),  # within 2%: cheaper host
    ([("torch", 1.0), ("cublaslt_heuristic_nn", 1.03)], "cold", "torch"),                  # outside the band
    ([("torch", 1.0), ("cublaslt_heuristic_nn", 1.015)], "graph", "torch"),                # graph pays no host cost
    ([("cublas_nn", 1.0), ("cublaslt_autotuned_nn", 1.01)], "offline", "cublaslt_autotuned_nn"),
    ([("torch", 1.0), ("cublas_nn", 1.01)], "server", "cublas_nn"),
    ([("torch", 1.0), ("cublas_nn", 1.005), ("cublaslt_heuristic_nn", 1.019)], "cold", "cublaslt_heuristic_nn"),
    ([("torch", 1.0), ("cublaslt_heuristic_nn", 1.019), ("cublaslt_autotuned_nn", 1.01)], "cold",
     "cublaslt_autotuned_nn"),                                                             # the cheapest, then fastest
    ([("cublas_nn", 1.0), ("cublaslt_heuristic_tn", 1.001)], "cold", "cublas_nn"),         # another layout's entry
    ([(f"triton:{CFG}", 0.9), ("torch", 1.0), ("cublaslt_heuristic_nn", 1.0)], "cold", CFG),  # a generated winner stays
    ([("cublaslt_autotuned_nn", 1.0), (f"triton:{CFG}", 1.019)], "cold", CFG),  # the direct launch path: cheapest host
    ([("torch", 1.0), ("cublaslt_autotuned_nn", 1.0), (f"triton:{CFG}", 1.01)], "offline", CFG),
    ([("cublaslt_autotuned_nn", 1.0), (f"triton:{CFG}", 1.03)], "cold", "cublaslt_autotuned_nn"),
    ([("cublaslt_autotuned_nn", 1.0), (f"triton:{CFG}", 1.01)], "graph", "cublaslt_autotuned_nn"),
    ([(f"cutlass:{CUT}", 0.99), ("cublaslt_autotuned_nn", 1.0), (f"triton:{CFG}", 1.0)], "cold", CUT),  # not ranked
    ([("cublaslt_heuristic_nn", 1.0), ("torch", 0.995)], "cold", "cublaslt_heuristic_nn"),  # torch 0.5% faster
])
def test_eager_entries_take_a_cheaper_host_path_within_the_band(rows, protocol, want):
    """Every protocol but graph is served to eager calls, which pay their path's host cost (torch.matmul ~10 us and
    cuBLAS ~2.4 us a call more than a cuBLASLt path on the H100, a Triton config's direct launch less): a vendor
    winner gives way to a cheaper path of the same layout timed within 2% of it; a generated winner stays.
    vendor_best stays the fastest vendor path."""
    rs = [_row(S, c, t, protocol=protocol, algo=c.partition(":")[2],
               layout="tn" if c.endswith("_tn") else "nn") for c, t in rows]
    e = _by(build_entries(rs, buckets=False))[(S, "nn", protocol, 64, 64)]
    assert e.impl == want
    fastest = min((t, c) for c, t in rows if ":" not in c)
    assert (e.vendor_best, e.vendor_best_ms) == (fastest[1], pytest.approx(fastest[0]))


@pytest.mark.parametrize("path, rank", [(f"triton:{CFG}", 0), ("cublaslt_autotuned_tn", 1), ("cublaslt_heuristic", 1),
                                        ("cublas_nn", 2), ("cublas", 2), ("torch", 3), (f"cutlass:{CUT}", 4),
                                        ("nvmath", 4)])
def test_host_rank(path, rank):
    assert L.host_rank(path) == rank


SK = "splitk(BM=64,BN=64,BK=64,warps=4,stages=4,group_m=8,split=4,reduction=fused,tma=False,nondeterministic=False)"


def test_stale_before_drops_one_variants_old_measurements():
    """A split-K config timed before its kernel changed (same name, old kernel): with --stale-before its old rows,
    and the gemmrl rows it served then, are left out, so the median is the new kernel's alone; other variants'
    rows, vendor rows and the config's new rows stay."""
    old, new = "2026-11-25T10:00:00Z", "2026-11-26T12:00:00Z"
    served_old = _row(S, "gemmrl", 1.3, timestamp=old,
                      algo=f"eager=triton:{SK} (offline entry {S}); graph=vendor:cublas_nn (graph entry {S}); hot=torch")
    rows = [_row(S, "cublas_nn", 1.0, timestamp=old), _row(S, "cublas_nn", 1.0, timestamp=new),
            _row(S, f"triton:{SK}", 1.3, algo=SK, timestamp=old), _row(S, f"triton:{SK}", 1.3, algo=SK, timestamp=old),
            served_old, _row(S, f"triton:{SK}", 0.8, algo=SK, timestamp=new),
            _row(S, f"triton:{CFG}", 1.1, algo=CFG, timestamp=old)]
    e = _by(build_entries(rows, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl) == ("vendor", "cublas_nn")  # median 1.3 of four rows: the old kernel outvotes the new
    kept, dropped = L.stale_before(rows, {"splitk": "2026-11-26T09:00:00Z"})
    assert dropped == 3 and served_old not in kept and all(r in kept for r in rows[:2] + rows[5:])
    e = _by(build_entries(kept, buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl, e.time_ms) == ("triton", SK, 0.8)
    assert L.stale_before(rows, {"tiled": "2026-11-26T09:00:00Z"})[1] == 1  # only the tiled row
    for bad in ({"split-k": "2026-11-26T09:00:00Z"}, {"splitk": "2026-11-26"}, {"splitk": "yesterday"}):
        with pytest.raises(L.LibraryError, match="VARIANT=YYYY-MM-DDTHH:MM:SSZ.*tiled, persistent, splitk, smallm"):
            L.stale_before(rows, bad)


def test_cli_build_stale_before(env, capsys, tmp_path):
    tmp, csv = env
    assert main(["lib", "build", csv, "--out", str(tmp / "S.json"), "--trials", str(tmp / "T.sqlite"),
                 "--stale-before", "tiled=2030-01-01T00:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "rows left out" in out and not any(e.family == "triton" for e in Library.load(tmp / "S.json").entries)
    assert main(["lib", "build", csv, "--out", str(tmp / "S.json"), "--trials", str(tmp / "T.sqlite"),
                 "--stale-before", "splitk=now"]) == 2
    assert "VARIANT=YYYY-MM-DDTHH:MM:SSZ" in capsys.readouterr().err


def test_build_entries_cutlass_winners():
    """A CUTLASS config wins where it is fastest, keyed by its algo: a ``cutlass-sel:graph`` row and a ``cutlass:``
    row of one config are one candidate (judged by their median), and a faster vendor path still beats it."""
    rows = [_row(S, f"cutlass:{CUT}", 0.9, algo=CUT), _row(S, f"triton:{CFG}", 0.95, algo=CFG), _row(S, "cublas_nn", 1.0),
            _row(S, "cutlass-sel:graph", 0.4, protocol="graph", algo=CUT2),
            _row(S, f"cutlass:{CUT2}", 0.6, protocol="graph", algo=CUT2),  # CUT2: median 0.5
            _row(S, f"cutlass:{CUT}", 0.45, protocol="graph", algo=CUT), _row(S, "cublas_nn", 0.8, protocol="graph")]
    got = _by(build_entries(rows, buckets=False))
    off, g = got[(S, "nn", "offline", 64, 64)], got[(S, "nn", "graph", 64, 64)]
    assert (off.family, off.impl, off.algo, off.time_ms, off.vendor_best) == ("cutlass", CUT, CUT, 0.9, "cublas_nn")
    assert (g.family, g.impl, g.time_ms) == ("cutlass", CUT, 0.45)
    sel_only = [r for r in rows if r["candidate"] != f"cutlass:{CUT}"]  # the selection row alone: it wins graph
    g = _by(build_entries(sel_only, buckets=False))[(S, "nn", "graph", 64, 64)]
    assert (g.family, g.impl, g.time_ms) == ("cutlass", CUT2, 0.5)
    lose = _by(build_entries(rows + [_row(S, "cublas_nn", 0.3, protocol="graph"), _row(S, "cublas_nn", 0.3,
                                                                                     protocol="graph")],
                             buckets=False))[(S, "nn", "graph", 64, 64)]
    assert (lose.family, lose.impl) == ("vendor", "cublas_nn")
    tn = _by(build_entries([_row(S, "cutlass-sel:cold+graph", 0.9, layout="tn", algo=CUT.replace("_nn_", "_tn_")),
                            _row(S, "cublas_tn", 1.0, layout="tn")]))[(S, "tn", "offline", 64, 64)]
    assert (tn.family, tn.impl) == ("cutlass", CUT.replace("_nn_", "_tn_"))


@pytest.mark.parametrize("bad", [
    _row(S, "cutlass-sel:graph", 0.1),                           # which config it was is not said
    _row(S, f"cutlass:{CUT}", 0.1, algo=CUT.replace("_nn_", "_tn_")),  # a tn config in an nn row: cannot serve it
    _row(S, "cutlass:coop_128x128", 0.1, algo="coop_128x128"),   # not a CUTLASS config name
    _row(S, f"cutlass:{CUT}", 0.1, algo=CUT, verified="false"),
])
def test_build_entries_ignores_cutlass_rows_it_cannot_serve(bad):
    base = [_row(S, f"cutlass:{CUT}", 0.9, algo=CUT), _row(S, "cublas_nn", 1.0)]
    assert _by(build_entries(base + [bad])) == _by(build_entries(base))


def test_build_entries_counts_what_gemmrl_served_cutlass():
    """A ``gemmrl`` row served by a CUTLASS entry (dispatch's description ``cutlass:<config>:<knobs> (...)``) is one
    more measurement of that config, in the protocol's part of the row; two slow ones cost it its entry."""
    def served(t, protocol="offline", eager=f"cutlass:{CUT}", graph=f"cutlass:{CUT2}", hot="torch"):
        return _row(S, "gemmrl", t, protocol=protocol,
                    algo=f"eager={eager} (offline entry {S}); graph={graph} (graph entry {S}); hot={hot}")

    got = L._served_kernel(served(1.0))
    assert (got["candidate"], got["algo"], got["time_ms"]) == (f"cutlass:{CUT}", CUT, "1.0")
    assert L._served_kernel(served(1.0, protocol="graph"))["algo"] == CUT2
    assert L._served_kernel(served(1.0, hot="c")) is None  # host time of another hot path
    assert L._served_kernel(served(1.0, eager="vendor:cublas_nn")) is None
    assert L._served_kernel(served(1.0, eager="torch.matmul (entry cutlass:x not served: RuntimeError)")) is None
    sel = [_row(S, "cutlass-sel:offline", 0.9, algo=CUT), _row(S, "cublas_nn", 1.0), _row(S, "cublas_nn", 1.0)]
    assert _by(build_entries(sel, buckets=False))[(S, "nn", "offline", 64, 64)].impl == CUT
    e = _by(build_entries(sel + [served(1.2), served(1.1)], buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl) == ("vendor", "cublas_nn")
    e = _by(build_entries(sel + [served(0.7)], buckets=False))[(S, "nn", "offline", 64, 64)]
    assert (e.family, e.impl, e.time_ms) == ("cutlass", CUT, pytest.approx(0.8))  # median of 0.9 and 0.7


def test_bucketize():
    ms = {64: (CFG, 1.0, 2.0), 128: (CFG, 1.0, 1.5), 256: (None, 0, 1.0), 384: (None, 0, 1.0),
          512: (CFG, 1.0, 3.0), 1024: (CFG, 2.0, 3.0), 2048: (CFG2, 1.0, 2.0)}
    rows = []
    for M, (cfg, t, v) in ms.items():
        mnk = f"{M}_256_256"
        rows += [_row(mnk, "cublas_nn", v)] + ([_row(mnk, f"triton:{cfg}", t, algo=cfg)] if cfg else [])
    exact = build_entries(rows, buckets=False)
    assert len(exact) == 7 and all(e.m_lo == e.m_hi for e in exact)
    ents = build_entries(rows)
    assert set(ents) >= set(exact)
    buckets = {(e.m_lo, e.m_hi): e for e in ents if e.m_hi > e.m_lo}
    assert set(buckets) == {(64, 128), (512, 1024)}  # not across vendor winners or configs
    lo, hi = buckets[(64, 128)], buckets[(512, 1024)]
    assert lo.members == ("64_256_256", "128_256_256") and lo.impl == CFG
    assert lo.speedup == pytest.approx(1.5) and hi.speedup == pytest.approx(1.5)  # the worst member's
    lib = Library(ents)
    assert _look(lib, 100, N=256) is lo and _look(lib, 700, N=256) is hi
    assert _look(lib, 200, N=256) is None and _look(lib, 1500, N=256) is None
    assert _look(lib, 256, N=256).family == "vendor"


def test_cutlass_winners_stay_exact():
    """Neighbouring M won by one CUTLASS config make no bucket (its knobs were picked for the measured grid)."""
    rows = []
    for M in (64, 128, 256):
        rows += [_row(f"{M}_256_256", "cublas_nn", 2.0), _row(f"{M}_256_256", f"cutlass:{CUT}", 1.0, algo=CUT)]
    ents = build_entries(rows)
    assert len(ents) == 3 and all(e.family == "cutlass" and e.m_lo == e.m_hi for e in ents)
    assert _look(Library(ents), 100, N=256) is None


# -- trials -----------------------------------------------------------------------------------------------
def test_trials_store(tmp_path):
    rows = [_row(S, "cublas_nn", 1.0), _row(S, f"triton:{CFG}", 0.9), _row(S, "cublas_nn", 1.1, gpu=GPU2)]
    st = TrialsStore(tmp_path / "t.sqlite")
    assert TrialsStore(tmp_path / "new" / "dir" / "t.sqlite").count() == 0  # parent folders are made
    assert st.ingest(rows, "a.csv") == 3 and st.ingest(rows, "a.csv") == 0 and st.ingest(rows[:1], "a.csv") == 0
    assert st.ingest(rows[:2], "b.csv") == 2 and st.count() == 5
    st.close()
    st = TrialsStore(tmp_path / "t.sqlite")  # persisted
    h100 = st.rows(gpu=GPU)
    assert len(h100) == 4 and {r["gpu"] for r in h100} == {GPU}
    assert {r["source"] for r in h100} == {"a.csv", "b.csv"}
    assert [r["gpu"] for r in st.rows(gpu=GPU2)] == [GPU2] and st.rows(gpu="other") == []
    assert len(st.rows(sources=["b.csv"])) == 2 and len(st.rows()) == 5
    assert {k: v for k, v in st.rows(gpu=GPU2)[0].items() if k != "source"} == rows[2]
    st.close()


# -- gemmrl lib -------------------------------------------------------------------------------------------
@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GEMMRL_LIBRARY", raising=False)
    csv = tmp_path / "r.csv"
    ResultsWriter(csv).write_batch(BASE)
    return tmp_path, str(csv)


def test_cli_build_list_show_export_import(env, capsys):
    tmp, csv = env
    lib_p, trials = str(tmp / "L.json"), str(tmp / "T.sqlite")
    assert main(["lib", "build", csv, "--out", lib_p, "--trials", trials]) == 0
    assert f"{len(BASE)} new" in capsys.readouterr().out
    lib = Library.load(lib_p)
    assert set(lib.entries) == set(build_entries([dict(r, source="r.csv") for r in BASE]))
    assert main(["lib", "build", csv, "--out", lib_p, "--trials", trials]) == 0
    assert "(0 new" in capsys.readouterr().out and set(Library.load(lib_p).entries) == set(lib.entries)

    assert main(["lib", "list", "--library", lib_p]) == 0
    out = capsys.readouterr().out
    assert GPU in out and lib_p in out and f"{len(lib.entries)} entries; 2 serve a generated kernel" in out

    assert main(["lib", "show", S, "--library", lib_p]) == 0
    out = capsys.readouterr().out.splitlines()
    nn_graph = [ln for ln in out if f"{S} nn graph" in ln]
    assert len(nn_graph) == 1 and f"triton:{CFG2}" in nn_graph[0] and "[graph entry" in nn_graph[0]
    nn_eager = [ln for ln in out if f"{S} nn eager" in ln]
    assert f"triton:{CFG}" in nn_eager[0] and "[offline entry" in nn_eager[0]
    assert "vendor:cublas_tn" in next(ln for ln in out if f"{S} tn eager" in ln)
    assert main(["lib", "show", "4096_4096_4096", "--library", lib_p]) == 0
    out = capsys.readouterr().out
    assert "vendor fallback" in out and "triton:" not in out

    exp = str(tmp / "E.json")
    assert main(["lib", "export", exp, "--library", lib_p]) == 0
    assert set(Library.load(exp).entries) == set(lib.entries)
    assert main(["lib", "export", str(tmp / "E2.json"), "--library", lib_p, "--gpu", GPU2]) == 2  # no H200 entries
    assert "no entries for GPU 'NVIDIA H200'" in capsys.readouterr().err and not (tmp / "E2.json").exists()

    up = L.user_library_path()
    assert str(up).startswith(str(tmp / "cache")) and not up.exists()
    assert main(["lib", "import", exp]) == 0
    assert set(Library.load(up).entries) == set(lib.entries)
    capsys.readouterr()
    assert main(["lib", "show", S]) == 0  # the default library now includes the user's
    assert f"triton:{CFG}" in capsys.readouterr().out
    assert set(L.load_default().entries) == set(lib.entries) | set(L.packaged().entries)
    assert set(L.load_default(user=False).entries) == set(L.packaged().entries)


@pytest.mark.parametrize("gz", [False, True])
def test_cli_export_as_gpu(env, capsys, gz):
    """An H100 library relabelled for an H200: the same kernels and measured times, served by the H200's lookup."""
    tmp, _ = env
    src = Library([_entry(), _entry(M=128, family="cutlass", impl=CUT, algo=CUT), _bucket(1, 16, protocol="graph")])
    lib_p = str(src.save(tmp / "L.json"))
    out = tmp / ("H200.json.gz" if gz else "H200.json")
    assert main(["lib", "export", str(out), "--library", lib_p, "--as-gpu", GPU2]) == 0
    assert f"3 entries -> {out} (as {GPU2})" in capsys.readouterr().out
    got = Library.load(out)
    assert {e.gpu for e in got.entries} == {GPU2}
    assert all(e.source.startswith(f"as-gpu from {GPU}") for e in got.entries)
    strip = lambda e: (e.mnk, e.m_lo, e.m_hi, e.protocol, e.family, e.impl, e.time_ms, e.vendor_best_ms)  # noqa: E731
    assert sorted(map(strip, got.entries)) == sorted(map(strip, src.entries))
    for M, proto in ((64, "offline"), (128, "offline"), (9, "graph")):
        assert _look(got, M, gpu=GPU2, protocol=proto) is not None and _look(got, M, protocol=proto) is None
        assert _look(src, M, protocol=proto) is not None and _look(src, M, gpu=GPU2, protocol=proto) is None


def test_cli_export_as_gpu_needs_one_source_gpu(env, capsys):
    tmp, _ = env
    both = Library([_entry(), _entry(gpu=GPU2, M=32)])
    lib_p, x = str(both.save(tmp / "L.json")), tmp / "x.json"
    assert main(["lib", "export", str(x), "--library", lib_p, "--as-gpu", "NVIDIA H20"]) == 2
    err = capsys.readouterr().err
    assert "this library has 2" in err and "--gpu" in err and not x.exists()
    assert main(["lib", "export", str(x), "--library", lib_p, "--gpu", GPU, "--as-gpu", "NVIDIA H20"]) == 0
    assert [(e.gpu, e.M) for e in Library.load(x).entries] == [("NVIDIA H20", 64)]


def test_cli_build_list_show_cutlass(env, capsys):
    """`gemmrl lib build` takes CUTLASS winners, and list and show name them as such."""
    tmp, _ = env
    csv = tmp / "c.csv"
    ResultsWriter(csv).write_batch(BASE + [_row(S, "cutlass-sel:offline", 0.7, algo=CUT)])
    lib_p = str(tmp / "C.json")
    assert main(["lib", "build", str(csv), "--out", lib_p, "--trials", str(tmp / "C.sqlite")]) == 0
    assert "3 entries (2 generated: 1 triton, 1 cutlass; 1 vendor)" in capsys.readouterr().out
    assert main(["lib", "list", "--library", lib_p]) == 0
    out = capsys.readouterr().out
    assert "3 entries; 2 serve a generated kernel (1 triton, 1 cutlass), 1 a vendor path" in out
    assert any(" offline  cutlass " in ln for ln in out.splitlines())
    assert main(["lib", "show", S, "--library", lib_p]) == 0
    nn_eager = [ln for ln in capsys.readouterr().out.splitlines() if f"{S} nn eager" in ln]
    assert len(nn_eager) == 1 and f"cutlass:{CUT}  [offline entry" in nn_eager[0]


CUT_TN = CUT.replace("_nn_", "_tn_")


def test_cli_build_generated_only_keeps_the_cells_a_family_rescreen_did_not_judge(env, capsys):
    """A re-screen of one family (CUTLASS here) times vendor paths but not the library's Triton kernels: with
    --generated-only its generated winners replace their cells, and a cell it gave a vendor path keeps the library's
    entry (nn offline: the Triton CFG stays) instead of being re-pinned to a vendor path that never faced it."""
    tmp, csv = env
    lib_p = str(tmp / "G.json")
    assert main(["lib", "build", csv, "--out", lib_p, "--trials", str(tmp / "G.sqlite")]) == 0
    new = tmp / "cut.csv"
    ResultsWriter(new).write_batch([_row(S, "cublas_tn", 1.2, layout="tn"), _row(S, "cutlass-sel:offline", 0.9,
                                                                               layout="tn", algo=CUT_TN),
                                    _row(S, "cublas_nn", 1.9)])
    capsys.readouterr()
    assert main(["lib", "build", str(new), "--out", lib_p, "--trials", str(tmp / "G.sqlite"), "--generated-only"]) == 0
    assert "1 vendor entries of these rows left out" in capsys.readouterr().out
    got = _by(Library.load(lib_p).entries)
    assert (got[(S, "tn", "offline", 64, 64)].family, got[(S, "tn", "offline", 64, 64)].impl) == ("cutlass", CUT_TN)
    assert (got[(S, "nn", "offline", 64, 64)].family, got[(S, "nn", "offline", 64, 64)].impl) == ("triton", CFG)
    assert got[(S, "nn", "graph", 64, 64)].impl == CFG2  # a cell the new rows do not hold at all
    assert main(["lib", "build", str(new), "--out", lib_p, "--trials", str(tmp / "G.sqlite")]) == 0
    assert _by(Library.load(lib_p).entries)[(S, "nn", "offline", 64, 64)].family == "vendor"  # without the flag
    warned = capsys.readouterr().out
    assert "warning: 1 cell(s)" in warned and f"{S} nn offline: triton:{CFG} -> cublas_nn" in warned, warned
    assert "--generated-only" in warned
    for argv, word in ((["--generated-only", "--replace"], "drop --replace"), (["--generated-only"], "nothing to merge")):
        only_vendor = tmp / "v.csv"
        ResultsWriter(only_vendor).write_batch([_row(S, "cublas_nn", 1.9), _row(S, "torch", 2.5)])
        before = Path(lib_p).read_text()
        assert main(["lib", "build", str(only_vendor), "--out", lib_p, "--trials", str(tmp / "G.sqlite"), *argv]) == 2
        assert word in capsys.readouterr().err and Path(lib_p).read_text() == before  # nothing written


def test_unjudged_repins_only_where_the_rows_never_timed_the_kernel():
    """A vendor winner replacing a generated entry is flagged only where the rows hold no row of that kernel in that
    cell: where the kernel was timed and lost, the re-pin is a judgement, not an omission."""
    base = Library(build_entries(BASE, buckets=False))
    lost = [_row(S, "cublas_nn", 0.5), _row(S, f"triton:{CFG}", 0.9, algo=CFG)]  # timed again, and lost
    assert L.unjudged_repins(base, build_entries(lost, buckets=False), lost) == []
    unjudged = [_row(S, "cublas_nn", 0.5), _row(S, "torch", 0.6)]
    got = L.unjudged_repins(base, build_entries(unjudged, buckets=False), unjudged)
    assert [(o.impl, n.impl, n.layout, n.protocol) for o, n in got] == [(CFG, "cublas_nn", "nn", "offline")]


def test_load_default_env_replaces(env, monkeypatch):
    tmp, _ = env
    Library([_entry()]).save(L.user_library_path())
    other = Library([_entry(M=999)]).save(tmp / "other.json")
    monkeypatch.setenv("GEMMRL_LIBRARY", str(other))
    assert L.load_default().entries == [_entry(M=999)]


@pytest.mark.parametrize("argv", [
    ["lib", "list", "--library", "{bad}"], ["lib", "show", S, "--library", "{bad}"],
    ["lib", "export", "{tmp}/x.json", "--library", "{bad}"], ["lib", "import", "{bad}"],
    ["lib", "list"], ["lib", "import", "{good}"], ["lib", "build", "{csv}", "--trials", "{tmp}/t.sqlite"],
])
def test_cli_corrupt_library_exit_2(env, capsys, argv):
    tmp, csv = env
    bad, good = tmp / "bad.json", Library([_entry()]).save(tmp / "good.json")
    bad.write_text('{"format": "gemmrl-library", "schema": 1, "sha256": "x", "entries": []}')
    L.user_library_path().write_text("{corrupt")  # the default (user) library is broken too
    argv = [a.format(bad=bad, good=good, csv=csv, tmp=tmp) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and ("checksum" in err or "gemmrl lib build" in err)
    assert L.user_library_path().read_text() == "{corrupt"  # nothing overwritten


@pytest.mark.parametrize("rows, text, word", [
    ([_row(S, f"triton:{CFG}", 1.0, algo=CFG)], None, "no winners"),
    (None, "a,b\n1,2\n", "not a gemmrl results file"),
])
def test_cli_build_refuses(env, capsys, rows, text, word):
    tmp, _ = env
    p = tmp / "x.csv"
    if rows:
        ResultsWriter(p).write_batch(rows)
    else:
        p.write_text(text)
    assert main(["lib", "build", str(p), "--out", str(tmp / "o.json"), "--trials", str(tmp / "t.sqlite")]) == 2
    assert word in capsys.readouterr().err and not (tmp / "o.json").exists()


@pytest.mark.gpu
def test_lib_verify_runs_the_battery_on_this_gpus_entries(tmp_path, capsys):
    """`gemmrl lib verify` builds every exact entry of this GPU (a Triton config, a cuBLASLt plan) and runs the
    battery on it: both pass; an entry of another GPU is not looked at."""
    import torch

    gpu = torch.cuda.get_device_properties(0).name
    cfg = "tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)"
    lib = Library([_entry(M=128, N=256, K=512, gpu=gpu, family="triton", impl=cfg, torch=""),
                   _entry(M=64, N=256, K=512, gpu=gpu, layout="tn", family="vendor", impl="cublaslt_heuristic_tn",
                          algo="", torch=""),
                   _entry(M=64, N=256, K=512, gpu="another GPU", layout="tn", family="vendor", impl="cublas_tn",
                          algo="", torch="")])
    path = lib.save(tmp_path / "lib.json")
    assert main(["lib", "verify", "--library", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 entries pass the battery" in out and out.count("ok  ") == 2, out


def test_cli_build_warns_where_torch_is_the_only_vendor_path(env, capsys):
    """Rows whose only vendor path is torch (a run whose cuBLAS baselines failed) still build, with a warning
    naming the shapes: their entries are judged against torch, not vendor_best."""
    tmp, csv = env
    only = tmp / "torch_only.csv"
    T = "128_256_512"
    ResultsWriter(only).write_batch([_row(T, "torch", 1.0), _row(T, f"triton:{CFG}", 0.9, algo=CFG)])
    assert main(["lib", "build", str(only), "--out", str(tmp / "a.json"), "--trials", str(tmp / "t.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "warning: 1 shape(s) have torch as their only vendor path" in out and T in out
    assert main(["lib", "build", csv, "--out", str(tmp / "b.json"), "--trials", str(tmp / "t2.sqlite")]) == 0
    assert "warning" not in capsys.readouterr().out


def test_library_plot_takes_exact_entries_per_shape(tmp_path, capsys):
    """benchmarks/acceptance/library_plot.py: per (shape, protocol) the fastest exact entry over the layouts (a bucket's time was
    measured at its own shapes, not between them), its speedup over vendor_best, and a PNG."""
    mod = script_module("library_plot")
    lib = Library([_entry(time_ms=0.01, vendor_best_ms=0.02),
                   _entry(layout="tn", family="vendor", impl="cublas_tn", algo="", time_ms=0.02, vendor_best_ms=0.02),
                   _entry(M=32, family="vendor", impl="cublas_nn", algo="", time_ms=0.03, vendor_best_ms=0.03),
                   _bucket(64, 128, time_ms=0.001, vendor_best_ms=0.02),
                   _entry(gpu=GPU2, M=16, time_ms=0.01, vendor_best_ms=0.05)])
    got = mod.served(lib, GPU)
    assert set(got["offline"]) == {"64_128_256", "32_128_256"}
    assert got["offline"]["64_128_256"] == (2.0 * 64 * 128 * 256, 2.0, "triton")
    assert got["offline"]["32_128_256"][1:] == (1.0, "vendor")
    p = lib.save(tmp_path / "lib.json.gz")
    assert mod.main([str(p), "--out", str(tmp_path / "p.png"), "--gpu", GPU]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "offline: 2 shapes, geomean 1.4142, generated served on 1" in capsys.readouterr().out
    assert mod.main([str(p), "--out", str(tmp_path / "q.png"), "--gpu", "nope"]) == 2
    assert "no entries for nope" in capsys.readouterr().err


def test_library_plot_keeps_dtypes_apart(tmp_path, capsys):
    """An fp16 and a bf16 entry of one shape are two problems (the model shapes are tuned in both): the faster
    bf16 entry must not stand for the fp16 shape; --dtype picks one."""
    mod = script_module("library_plot")
    lib = Library([_entry(family="vendor", impl="cublas_nn", algo="", time_ms=0.02, vendor_best_ms=0.02),
                   _entry(dtype="bf16", time_ms=0.005, vendor_best_ms=0.01)])
    got = mod.served(lib, GPU)["offline"]
    assert got == {"64_128_256": (2.0 * 64 * 128 * 256, 1.0, "vendor"),
                   "64_128_256:bf16:fp32": (2.0 * 64 * 128 * 256, 2.0, "triton")}
    assert set(mod.served(lib, GPU, "bf16")["offline"]) == {"64_128_256:bf16:fp32"}
    p = lib.save(tmp_path / "lib.json")
    assert mod.main([str(p), "--out", str(tmp_path / "p.png"), "--dtype", "fp16"]) == 0
    assert "offline: 1 shapes, geomean 1.0000, generated served on 0" in capsys.readouterr().out
    assert mod.main([str(p), "--out", str(tmp_path / "q.png"), "--dtype", "fp8"]) == 2
    assert "no entries for fp8" in capsys.readouterr().err


TINY = "32x32_s8_st4_fp16"  # a tiny-family config (kernels/tiny_gemm.py)


def test_build_entries_tiny_winners():
    """A tiny-family selection re-measured (``tiny-sel:graph``, keyed by its algo) wins the cells where it is fastest,
    in layout tn only, and stays an exact entry; a ``gemmrl`` row it served counts as one more measurement of it."""
    rows = [_row(S, "tiny-sel:graph", 0.4, layout="tn", protocol="graph", algo=TINY),
            _row(S, "cublas_tn", 0.8, layout="tn", protocol="graph"),
            _row("128_128_256", "tiny-sel:graph", 0.4, layout="tn", protocol="graph", algo=TINY),
            _row("128_128_256", "cublas_tn", 0.8, layout="tn", protocol="graph")]
    ents = build_entries(rows)
    g = _by(ents)[(S, "tn", "graph", 64, 64)]
    assert (g.family, g.impl, g.time_ms, g.vendor_best) == ("tiny", TINY, 0.4, "cublas_tn")
    assert all(e.m_lo == e.m_hi for e in ents)  # no bucket across the two M it won
    served = _row(S, "gemmrl", 1.2, layout="tn", protocol="graph",
                  algo=f"eager=vendor:cublas_tn (offline entry {S}); graph=tiny:{TINY} (graph entry {S}); hot=c")
    assert L._served_kernel(served)["candidate"] == f"tiny:{TINY}"
    lose = _by(build_entries(rows + [served, served]))[(S, "tn", "graph", 64, 64)]
    assert (lose.family, lose.impl) == ("vendor", "cublas_tn")  # median of 0.4, 1.2, 1.2


@pytest.mark.parametrize("bad", [
    _row(S, "tiny-sel:graph", 0.1, layout="nn", algo=TINY),                  # the family reads B^T: no nn entry
    _row(S, "tiny-sel:graph", 0.1, layout="tn", algo="32x32_s8_st4_bf16"),   # a bf16 config in an fp16 row
    _row(S, "tiny:48x32", 0.1, layout="tn", algo="48x32"),                   # not a tiny config name
])
def test_build_entries_ignores_tiny_rows_it_cannot_serve(bad):
    base = [_row(S, "cublas_tn", 1.0, layout="tn"), _row(S, "cublas_nn", 1.0)]
    assert _by(build_entries(base + [bad])) == _by(build_entries(base))


def test_tiny_entry_validates_its_config():
    e = Entry(gpu="H100", cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=64, N=64, K=1024,
              family="tiny", impl=TINY, algo=TINY, time_ms=0.003, vendor_best_ms=0.0034, vendor_best="cublas_nn",
              m_lo=64, m_hi=64, members=("64_64_1024",), verified=True)
    assert Entry.from_dict(e.to_dict()) == e
    for impl, layout, why in ((TINY, "nn", "tn/fp16 config for a nn/fp16"), ("32x32_s8", "tn", "cannot read tiny")):
        with pytest.raises(L.LibraryError, match=why):
            Entry.from_dict(dict(e.to_dict(), impl=impl, layout=layout))


def test_known_gpus_are_those_with_datasheet_peaks():
    """What `gemmrl lib import` accepts: a GPU model gemmrl has peaks for (problem.GPU_PEAKS). Library.load itself
    keeps loading entries of any GPU name (a user library holding such entries is not lost); the shipped
    libraries are all for known models."""
    for name in (GPU, GPU2, "NVIDIA H100 PCIe"):
        assert L.known_gpu(name), name
    for name in ("NVIDIA Z9000", "NVIDIA H20", "", "cpu"):
        assert not L.known_gpu(name), name
    assert L.packaged().entries and all(L.known_gpu(e.gpu) for e in L.packaged().entries)
    lib = Library([_entry(), _entry(M=32, gpu="NVIDIA Z9000")])
    with pytest.raises(LibraryError, match=r"^x\.json: 1 entry is for GPU 'NVIDIA Z9000', no GPU model") as ei:
        L.require_known_gpus(lib, "x.json")
    assert "\n" not in str(ei.value) and "--as-gpu" in str(ei.value)
    L.require_known_gpus(Library([_entry()]), "y.json")


def test_cli_import_of_an_unknown_gpu_keeps_the_user_library(env, capsys):
    tmp, _ = env
    up = L.user_library_path()
    mine = Library([_entry(), _entry(M=128, gpu=GPU2)])
    up.parent.mkdir(parents=True, exist_ok=True)
    mine.save(up)
    before = up.read_bytes()
    z = Library([_entry(M=32, gpu="NVIDIA Z9000")]).save(tmp / "z.json")
    assert main(["lib", "import", str(z)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(z) in err and "'NVIDIA Z9000'" in err and "H100 or H200" in err
    assert up.read_bytes() == before and set(Library.load(up).entries) == set(mine.entries)
    # the way out the message names: relabel for a known model, then the import goes through
    x = tmp / "relabelled.json"
    assert main(["lib", "export", str(x), "--library", str(z), "--gpu", "NVIDIA Z9000", "--as-gpu", GPU2]) == 0
    assert main(["lib", "import", str(x)]) == 0
    assert {e.gpu for e in Library.load(up).entries} == {GPU, GPU2} and len(Library.load(up).entries) == 3


def test_cli_export_as_an_unknown_gpu_warns_that_import_will_refuse_it(env, capsys):
    tmp, _ = env
    lib_p = str(Library([_entry()]).save(tmp / "L.json"))
    assert main(["lib", "export", str(tmp / "x.json"), "--library", lib_p, "--as-gpu", "NVIDIA Z9000"]) == 0
    assert "'NVIDIA Z9000' is no GPU model gemmrl knows" in capsys.readouterr().err
    assert main(["lib", "export", str(tmp / "y.json"), "--library", lib_p, "--as-gpu", GPU2]) == 0
    assert "warning" not in capsys.readouterr().err


# -- the user library a tuning run writes, and the package's compressed libraries ----------------------------------
def _ue(gpu, M, t=0.01):
    return Entry(gpu=gpu, cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=M, N=64, K=64,
                 family="triton", impl="tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)",
                 algo="tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)", time_ms=t, vendor_best_ms=0.012,
                 vendor_best="cublas_tn", m_lo=M, m_hi=M, members=(f"{M}_64_64",), verified=True)


def test_a_tuned_gpus_entries_replace_its_old_ones_in_the_user_library_and_are_served_by_default():
    add_to_user_library([_ue("NVIDIA H100 80GB HBM3", 1), _ue("NVIDIA H200", 2)], "NVIDIA H200")
    path, mine = add_to_user_library([_ue("NVIDIA H200", 16), _ue("NVIDIA H200", 64)], "NVIDIA H200")
    assert path == user_library_path() and len(mine.entries) == 2
    lib = load_default()
    got = {(e.gpu, e.M) for e in lib.entries if e.N == 64 and e.K == 64}
    assert got == {("NVIDIA H100 80GB HBM3", 1), ("NVIDIA H200", 16), ("NVIDIA H200", 64)}
    assert lib.lookup("NVIDIA H200", "fp16", "fp32", "tn", "graph", 16, 64, 64) is not None


def test_an_unreadable_user_library_is_set_aside_not_lost():
    p = user_library_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("{not json")
    add_to_user_library([_ue("NVIDIA H200", 16)], "NVIDIA H200")
    assert p.with_name(p.name + ".unreadable").read_text() == "{not json"
    assert len(Library.load(p).entries) == 1


def test_the_package_reads_gzipped_libraries_beside_plain_ones(tmp_path):
    Library([_ue("NVIDIA H200", 16)]).save(tmp_path / "a.json")
    (tmp_path / "h200.json.gz").write_bytes(gzip.compress(Library([_ue("NVIDIA H200", 64)]).to_json().encode()))
    assert sorted(e.M for e in packaged(tmp_path).entries) == [16, 64]


DECODE = "r1_w1x8_u4_st4_s1_fp16"  # a decode-family config (kernels/decode_gemm.py)


def test_build_entries_decode_winners_are_exact_tn_entries():
    """A decode selection re-measured (``decode-sel:graph``, keyed by its algo) wins where it is fastest, layout tn
    only, each an exact entry (a config's shared memory depends on M's token tile: no bucket across M)."""
    rows = [_row("1_4096_4096", "decode-sel:graph", 0.020, layout="tn", protocol="graph", algo=DECODE),
            _row("1_4096_4096", "cublas_tn", 0.024, layout="tn", protocol="graph"),
            _row("8_4096_4096", "decode-sel:graph", 0.021, layout="tn", protocol="graph", algo=DECODE),
            _row("8_4096_4096", "cublas_tn", 0.025, layout="tn", protocol="graph"),
            _row("8_4096_4096", "decode-sel:graph", 0.001, layout="nn", protocol="graph", algo=DECODE)]
    ents = build_entries(rows)
    got = {(e.mnk, e.layout): (e.family, e.impl, e.m_lo, e.m_hi) for e in ents if e.protocol == "graph"}
    assert got[("1_4096_4096", "tn")] == ("decode", DECODE, 1, 1)
    assert got[("8_4096_4096", "tn")] == ("decode", DECODE, 8, 8)
    assert ("8_4096_4096", "nn") not in got or got[("8_4096_4096", "nn")][0] != "decode"
    e = next(x for x in ents if x.family == "decode")
    assert Entry.from_dict(e.to_dict()) == e
    with pytest.raises(L.LibraryError, match="tn/fp16 config for a nn/fp16"):
        Entry.from_dict(dict(e.to_dict(), layout="nn"))
