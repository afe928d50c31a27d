"""The false-rejection sweep (gemmrl.adversarial.false_rejections) and its GPU script's choices (benchmarks/acceptance/false_rejections.py).

Interpreter tier (CPU tensors, TRITON_INTERPRET=1 from conftest): a correct planted Triton kernel and small
configs of the Triton family pass every call over 10 seeds on odd shapes (zero false rejections, every call
counted); wrong kernels (fp16 accumulation at K >= 64, a partial write) fail with the battery's reason, so the
sweep can report a rejection; a candidate whose ``prepare`` fails is reported as not run, not as a rejection.
CPU tier: the summary's counts; the 30-shape file and the script's per-shape Triton, CUTLASS, tiny and wgmma choices
are accepted by the families' validity predicates at every shape (so nothing fails ``prepare`` on the GPU); tiny and
wgmma candidates are in the sweep exactly where their shared object is in the build cache (or --build builds it), a
warning line naming what was left out otherwise (a fake nvcc fills a temporary build cache).
"""

from __future__ import annotations

import math
import stat
from pathlib import Path

import pytest

from gemmrl import verify as V
from gemmrl.adversarial import false_rejections as S
from gemmrl.adversarial.planted import planted_candidates
from gemmrl.kernels.triton_gemm import H100, SmallMConfig, SplitKConfig, TiledConfig, TritonGemm, valid
from gemmrl.kernels.triton_gemm.configs import next_pow2
from gemmrl.problem import GemmProblem
from conftest import script_module

CPU = "cpu"
SEEDS = range(10)
BLOCK = (64, 128, 64)  # one program for the small shapes: the interpreter runs programs one after another


def _planted(mode: str, layout: str = "nn", block=BLOCK):
    return next(c for c in planted_candidates(layout, block=block) if c.mode == mode)


def _correct_candidates(p: GemmProblem) -> list:
    """The correct planted kernel and small Triton configs (tiled, split-K, smallm where M <= 63) that the family's
    predicate accepts at ``p`` (split-K has no two slices of K = 13)."""
    triton = [TritonGemm(TiledConfig(BM=64, BN=128, BK=64, warps=8, stages=2, group_m=1), "tn"),
              TritonGemm(SplitKConfig(BM=64, BN=128, BK=32, warps=8, stages=2, split=2), "nn"),
              TritonGemm(SmallMConfig(BM=next_pow2(max(p.M, 16)), BN=128, BK=64, warps=8, stages=2), "tn")]
    triton = [c for c in triton if valid(c.cfg, p.with_(layout=c.layout), H100)[0]]
    assert len(triton) >= 2
    return [_planted("correct", "nn")] + triton


# nan_fill 1, stream_order 0 on CPU tensors, exact_int 2, accuracy 1 (one seed), second_call 2, memo 8 + 5
BATTERY_CALLS_CPU = 19


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("shape,dtype", [((1, 7, 13), "fp16"), ((33, 65, 129), "fp16"), ((17, 33, 72), "bf16")])
def test_correct_kernels_zero_false_rejections(shape, dtype):
    p = GemmProblem(*shape, dtype=dtype)
    cands = _correct_candidates(p)
    rows = S.false_rejection_rows([p], cands, SEEDS, CPU, full_battery_seeds=1)
    assert len(rows) == len(cands)
    for r in rows:
        assert r["status"] == "passed" and r["failures"] == 0 and r["reason"] == "", r
        assert r["seeds"] == len(SEEDS) and r["battery_runs"] == 1
        # the battery (its accuracy check pools more seeds on a small output), then every seed: one accuracy, one
        # exact-int call
        assert r["trials"] == BATTERY_CALLS_CPU - 1 + len(V.accuracy_seeds(p, [0])) + 2 * len(SEEDS), r
        assert 0.99 <= r["r_max"] <= 1.1 and r["r_over_limit_max"] < 1.0 and r["elem_ratio_max"] < 1.0, r
        assert r["mnk"] == p.mnk and r["dtype"] == dtype and r["seconds"] > 0
    assert {r["family"] for r in rows} == {"planted", "triton"}
    summ = {g["family"]: g for g in S.summary(rows)}
    assert summ["all"]["false_rejections"] == 0 and summ["all"]["candidates"] == len(cands)
    assert summ["all"]["calls"] == sum(r["trials"] for r in rows)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_wrong_kernels_are_reported_with_their_reason():
    p = GemmProblem(33, 65, 129)  # fp16 accumulation in k16 steps at K = 129: R ~ 2.6 > 1.25 on every seed
    seeds = range(4)
    rows = {r["candidate"]: r for r in S.false_rejection_rows(
        [p], [_planted("fp16_acc", block=(64, 128, 16)), _planted("partial_write"), _planted("correct")], seeds, CPU)}
    acc, part, ok = rows["planted_fp16_acc_nn"], rows["planted_partial_write_nn"], rows["planted_correct_nn"]
    assert ok["status"] == "passed" and ok["failures"] == 0
    # fp16 accumulation: the battery's accuracy check first, then every seed's accuracy call (exact-int passes:
    # small integers are exact in an fp16 accumulator)
    assert acc["status"] == "rejected" and acc["failures"] == 1 + len(seeds), acc
    assert acc["first_fail_check"] == "battery/accuracy" and acc["reason"].startswith("accuracy:")
    assert "fp16 accumulation" in acc["reason"] and acc["r_over_limit_max"] > 1.5
    # partial write: the battery stops at nan_fill; every later call (accuracy and exact-int) fails nan_fill too
    assert part["status"] == "rejected" and part["failures"] == 1 + 2 * len(seeds), part
    assert part["first_fail_check"] == "battery/nan_fill" and part["reason"].startswith("nan_fill:")
    assert part["trials"] == 1 + 2 * len(seeds) and math.isnan(part["r_max"])
    summ = {g["family"]: g for g in S.summary(rows.values())}
    assert summ["planted"]["false_rejections"] == acc["failures"] + part["failures"]
    assert summ["planted"]["rejected_candidates"] == 2


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_per_seed_calls_catch_what_the_first_seed_misses():
    """A kernel right on the battery's seed but wrong on later ones is counted on each of those seeds."""
    p = GemmProblem(1, 7, 13)
    inner = _planted("correct")

    class LateBug:
        name, layout, acc = "late_bug", "nn", "fp32"
        n = 0

        def prepare(self, *a):
            return None

        def __call__(self, a, b, bt, c):
            inner(a, b, bt, c)
            self.n += 1
            if self.n > BATTERY_CALLS_CPU - 1 + len(V.accuracy_seeds(p, [0])) + 2 * 3:  # after the battery (its
                # accuracy check pools seeds on this small output) and 3 seeds (2 calls each)
                c[0, 0] = c[0, 0] + 1.0

    r = S.false_rejection_rows([p], [LateBug()], range(5), CPU)[0]
    assert r["status"] == "rejected" and r["first_fail_seed"] == 3 and r["failures"] == 4, r  # seeds 3, 4 x 2 calls
    assert r["first_fail_check"] == "accuracy" and r["family"] == "test_false_rejections"  # the candidate class's module


def test_prepare_failure_is_not_run_not_a_rejection():
    p = GemmProblem(33, 65, 129)
    bad = TritonGemm(SmallMConfig(BM=16), "tn")  # M=33 needs BM=64: the predicate refuses it in prepare
    rows = S.false_rejection_rows([p], [bad], range(3), CPU)
    (r,) = rows
    assert r["status"] == "not_run" and r["reason"].startswith("prepare: ConfigError") and "BM=64" in r["reason"]
    assert r["failures"] == 0 and r["trials"] == 0 and r["seeds"] == 0
    (fam, total) = S.summary(rows)
    assert fam["family"] == "triton" and fam["not_run"] == 1 and fam["candidates"] == 0
    assert total["false_rejections"] == 0 and total["calls"] == 0


def test_summary_counts():
    base = {"mnk": "1_2_3", "dtype": "fp16", "acc": "fp32", "seconds": 1.0, "battery_runs": 1}
    rows = [{**base, "family": "vendor", "status": "passed", "trials": 206, "failures": 0,
             "r_over_limit_max": 0.8, "elem_ratio_max": 0.3},
            {**base, "family": "vendor", "status": "rejected", "trials": 206, "failures": 2,
             "r_over_limit_max": 1.3, "elem_ratio_max": 2.0},
            {**base, "mnk": "4_5_6", "family": "cutlass", "status": "passed", "trials": 206, "failures": 0,
             "r_over_limit_max": 0.7, "elem_ratio_max": 0.2},
            {**base, "family": "cutlass", "status": "not_run", "trials": 0, "failures": 0,
             "r_over_limit_max": math.nan, "elem_ratio_max": math.nan}]
    summ = {g["family"]: g for g in S.summary(rows)}
    assert list(summ) == ["cutlass", "vendor", "all"]
    assert summ["vendor"]["calls"] == 412 and summ["vendor"]["false_rejections"] == 2
    assert summ["vendor"]["rejected_candidates"] == 1 and summ["vendor"]["r_over_limit_max"] == 1.3
    assert summ["cutlass"]["candidates"] == 1 and summ["cutlass"]["not_run"] == 1 and summ["cutlass"]["shapes"] == 1
    assert summ["all"]["calls"] == 618 and summ["all"]["false_rejections"] == 2 and summ["all"]["shapes"] == 2


# ----------------------------------------------------------------------------------------------------
# The GPU script's choices (CPU: predicates only, nothing launched)
# ----------------------------------------------------------------------------------------------------
def _script():
    return script_module("false_rejections")


def test_script_shapes_and_candidates_are_valid():
    F = _script()
    probs = F.load_shapes(F.SHAPES)
    assert len(probs) == 30 and len({(p.mnk, p.dtype) for p in probs}) == 30
    assert {p.dtype for p in probs} == {"fp16", "bf16"}
    assert max(p.M * p.N * p.K for p in probs) <= 4096 ** 3
    assert sum(1 <= p.M <= 63 for p in probs) >= 6
    assert any(p.M % 16 and p.N % 16 and p.K % 16 for p in probs)  # every dim a tail
    builds = {c: None for d in ("fp16", "bf16") for c in F.cutlass_configs(d)}
    assert len(builds) == 6
    from gemmrl.kernels import cutlass_sm90 as CS
    from gemmrl.kernels import tiny_gemm, wgmma_gemm
    from gemmrl.kernels.registry import FAMILIES

    OWN_VALID = {"tiny": tiny_gemm.valid, "wgmma": wgmma_gemm.valid}
    tiny_all, wgmma_all = [], []
    for p in probs:
        tri = F.triton_configs(p)
        variants = [c.variant for c, _ in tri]
        assert variants == ["tiled", "persistent", "splitk"] + (["smallm"] if p.M <= 63 else []), (p, variants)
        for cfg, layout in tri:
            assert valid(cfg, p.with_(layout=layout), H100)[0], (p, cfg)
        cut = F.cutlass_entries(p, builds)
        assert len(cut) == (3 if p.K % 8 == 0 and p.N % 8 == 0 else 0), (p, cut)
        for cfg, knobs in cut:
            assert CS.valid(cfg, knobs, p)[0] and cfg.dtype == p.dtype
        n = F.count_candidates(p, builds)
        assert 10 <= n <= 14 and F.shape_seconds(p, n, 100) > 0
        # tiny and wgmma (layout tn, K % 8 == 0; any M): two configs each, both accepted by the family's predicate
        # as the registry serves/selects it, at the H100/H200 SMs and at an H100 PCIe's 114 (their own choice there)
        for sms in (132, 114):
            for fam, cfgs in (("tiny", F.tiny_configs(p, sms)), ("wgmma", F.wgmma_configs(p, sms))):
                assert len(cfgs) == (2 if p.K % 8 == 0 else 0) and len(set(cfgs)) == len(cfgs), (p, fam, cfgs)
                for cfg in cfgs:
                    assert OWN_VALID[fam](cfg, p.with_(layout="tn"), sms)[0], (p, cfg, sms)
                    if sms == 132:
                        assert FAMILIES[fam].valid(cfg, p.with_(layout="tn"))[0], (p, cfg)
                    assert cfg.dtype == p.dtype and cfg.layout == "tn"
                    assert not FAMILIES[fam].mismatch(cfg, "tn", p.dtype)
                    assert FAMILIES[fam].parse(str(cfg)) == cfg  # a name the library and select read back
        tiny, wg = F.tiny_configs(p), F.wgmma_configs(p)
        tiny_all += tiny
        wgmma_all += wg
        if tiny:
            assert tiny[0].split == 1 and not tiny[0].staged and tiny[1].tile == tiny[0].tile
            assert tiny[0].bm == (16 if p.M <= 16 else 32 if p.M <= 32 else 64)
        own = {(f, d) for f in F.OWN for d in ("fp16", "bf16")}
        n_own = F.count_candidates(p, builds, own=own)
        assert n_own == n + len(tiny) + len(wg) and n_own <= 18 and F.shape_seconds(p, n_own, 100) > 0
        assert F.count_candidates(p, builds, own={("tiny", "other")}) == n
    assert F.cutlass_entries(probs[0], {}) == []  # nothing built: no CUTLASS candidates
    # over the file, every code path of the two families: tiny's cluster split and staged epilogue, wgmma's cluster
    # split, global split and two-warpgroup tile
    assert len(tiny_all) == len(wgmma_all) == 2 * 28
    assert any(c.split > 1 for c in tiny_all) and any(c.staged for c in tiny_all)
    assert any(c.split > 1 for c in wgmma_all) and any(c.g > 1 for c in wgmma_all) and any(c.wg == 2 for c in wgmma_all)


def _fake_nvcc(path: Path, fail: str = "") -> Path:
    """An nvcc that 'compiles' by writing its -o file (no CUDA here), or fails for sources whose flags contain
    ``fail``; counts its compiles in ``<path>.count``."""
    body = ['#!/bin/sh',
            'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 12.8, V12.8.93"; exit 0; fi',
            f'echo run >> "{path}.count"']
    if fail:
        body += [f'case "$*" in *{fail}*) echo "x.cu(1): error: boom" >&2; exit 1;; esac']
    body += ['out=""; prev=""', 'for a in "$@"; do if [ "$prev" = "-o" ]; then out="$a"; fi; prev="$a"; done',
             'echo so > "$out"']
    path.write_text("\n".join(body) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def nvcc_cache(tmp_path, monkeypatch):
    """A temporary build cache, a fake nvcc and sm_90a; the tiny/wgmma per-process build tables start empty and are
    restored after (so no later test loads a fake shared object)."""
    from gemmrl.kernels import tiny_gemm, wgmma_gemm

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")
    nvcc = _fake_nvcc(tmp_path / "nvcc")
    monkeypatch.setenv("GEMMRL_NVCC", str(nvcc))
    monkeypatch.setattr(tiny_gemm._FAMILY, "built", {})
    monkeypatch.setattr(wgmma_gemm._FAMILY, "built", {})
    return nvcc


def _compiles(nvcc: Path) -> int:
    count = Path(f"{nvcc}.count")
    return len(count.read_text().split()) if count.exists() else 0


def _own(cands) -> list[tuple[str, str]]:
    return [(S.family_of(c), c.name) for c in cands if S.family_of(c) in ("tiny", "wgmma")]


def test_script_tiny_wgmma_only_from_the_build_cache(nvcc_cache, capsys):
    """Without --build: nothing cached, nothing compiled, a warning naming the four (family, dtype) builds and
    --build, and no tiny/wgmma candidates; what is in the cache (as cuda_source.build leaves it) is found by the
    cache check and comes into the factory, the count and the family column."""
    from gemmrl.kernels import tiny_gemm, wgmma_gemm

    F = _script()
    probs = F.load_shapes(F.SHAPES)
    assert F.own_builds(probs, allow_build=False) == set() and _compiles(nvcc_cache) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("WARNING: 4 tiny/wgmma build(s)") and "--build" in out[0], out
    assert all(f"{f} {d}" in out[0] for f in ("tiny", "wgmma") for d in ("fp16", "bf16"))
    fac = F.make_factory({}, vendor=False, own=set())
    assert all(not _own(fac(p)) for p in probs)

    # what cuda_source.build leaves in the cache is what the check finds: fp16 of both families, not bf16
    tiny_gemm.build_dtype("fp16")
    wgmma_gemm.build_dtype("fp16")
    assert _compiles(nvcc_cache) == 2
    assert F.own_cached("tiny", "fp16", "90a") and F.own_cached("wgmma", "fp16", "90a")
    assert not F.own_cached("tiny", "bf16", "90a") and not F.own_cached("wgmma", "bf16", "90a")
    assert not F.own_cached("tiny", "fp16", "100a")  # another arch is another build
    tiny_gemm._FAMILY.built.clear()
    wgmma_gemm._FAMILY.built.clear()
    own = F.own_builds(probs, allow_build=False)
    assert own == {("tiny", "fp16"), ("wgmma", "fp16")} and _compiles(nvcc_cache) == 2  # loaded, not compiled
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("WARNING: 2 tiny/wgmma build(s)") and "tiny bf16, wgmma bf16" in out[0]
    fac = F.make_factory({}, vendor=False, own=own)
    for p in probs:
        cands = fac(p)
        got = _own(cands)
        want = ([("tiny", f"tiny:{c}") for c in F.tiny_configs(p)]
                + [("wgmma", f"wgmma:{c}") for c in F.wgmma_configs(p)])
        assert got == (want if p.dtype == "fp16" else []), (p, got)
        assert len(cands) == F.count_candidates(p, {}, vendor=False, own=own)
    p = next(p for p in probs if p.mnk == "64_64_16384")  # bf16: none
    assert not _own(fac(p)) and F.count_candidates(p, {}, vendor=False, own=own) == len(F.triton_configs(p))


def test_script_build_flag_builds_tiny_wgmma(nvcc_cache, tmp_path, monkeypatch, capsys):
    """--build (allow_build): every (family, dtype) the shapes need is compiled once, no warning, all candidates in;
    a build that fails is left out with its own warning line, the others stay."""
    F = _script()
    probs = F.load_shapes(F.SHAPES)
    own = F.own_builds(probs, allow_build=True)
    assert own == {(f, d) for f in ("tiny", "wgmma") for d in ("fp16", "bf16")} and _compiles(nvcc_cache) == 4
    assert capsys.readouterr().out == ""
    fac = F.make_factory({}, vendor=False, own=own)
    for p in probs:
        got = _own(fac(p))
        assert len(got) == (4 if p.K % 8 == 0 else 0), (p, got)
        assert [f for f, _ in got] == ["tiny"] * (len(got) // 2) + ["wgmma"] * (len(got) // 2)
    assert F.own_builds(probs, allow_build=False) == own and _compiles(nvcc_cache) == 4  # now all cached
    # a failing bf16 compile (fresh cache): its two builds are left out, each with a warning
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache2"))
    monkeypatch.setenv("GEMMRL_NVCC", str(_fake_nvcc(tmp_path / "nvcc_bad", fail="GEMMRL_BF16=1")))
    from gemmrl.kernels import tiny_gemm, wgmma_gemm

    tiny_gemm._FAMILY.built.clear()
    wgmma_gemm._FAMILY.built.clear()
    capsys.readouterr()
    own = F.own_builds(probs, allow_build=True)
    assert own == {("tiny", "fp16"), ("wgmma", "fp16")}
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 and all(ln.startswith("WARNING: ") and "bf16 skipped: did not build" in ln for ln in out)


def test_script_tiny_wgmma_skipped_without_nvcc_or_hopper(tmp_path, monkeypatch, capsys):
    F = _script()
    probs = F.load_shapes(F.SHAPES)
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "80")
    assert F.own_builds(probs, allow_build=True) == set()
    assert "needs sm_90a" in capsys.readouterr().out
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")
    from gemmrl.kernels import toolchain

    monkeypatch.setattr(toolchain, "find_nvcc", lambda *a, **k: "")
    assert F.own_builds(probs, allow_build=True) == set()
    assert "nvcc not found" in capsys.readouterr().out
    assert F.own_builds([p for p in probs if p.K % 8], allow_build=True) == set()  # no shape needs them: silent
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("flag", ["--build", "--cutlass-build"])
def test_script_build_flag_and_its_old_name(tmp_path, flag):
    """Both spellings parse (the script then stops: no GPU on this tier)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU this would run the sweep")
    assert _script().main(["--out", str(tmp_path), flag, "--no-cutlass"]) == 2


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_script_smoke_run_on_cpu(tmp_path, capsys):
    """The whole script, --device cpu (Triton family under the interpreter): CSVs written, table printed last."""
    F = _script()
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1_7_13  # bf16 tiny tail\n")
    rc = F.main(["--device", "cpu", "--out", str(tmp_path / "out"), "--seeds", "2", "--shapes", str(shapes)])
    assert rc == 0
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) == 3 and files[0].startswith("cpu_false-rejections-1shapes-2seeds_")
    assert "_summary_" in files[1] and "_timed-output-5seeds_" in files[2]
    import csv

    with open(tmp_path / "out" / files[0]) as fh:
        rows = list(csv.DictReader(fh))
    assert {r["family"] for r in rows} == {"triton"} and {r["dtype"] for r in rows} == {"bf16"}
    assert all(r["status"] == "passed" and r["failures"] == "0" for r in rows)
    with open(tmp_path / "out" / files[2]) as fh:
        timed = list(csv.DictReader(fh))
    assert timed and all(r["status"] == "passed" and r["protocol"] == "offline" and int(r["seeds"]) == 2
                         for r in timed)  # --seeds 2 caps the 5 timed seeds
    out = capsys.readouterr().out
    assert "| triton | offline |" in out and out.strip().splitlines()[-1].startswith("| all | offline |")
    last = out[:out.index("| family | protocol |")].strip().splitlines()
    assert last[-1].startswith("all ") and last[-3].startswith("family")


@pytest.mark.parametrize("shape", [(33, 65, 129), (1, 64, 256), (7, 8, 9)])
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_timed_output_check_zero_false_rejections(shape, layout):
    """The timed-output sweep: a correct kernel's C after timed calls matches the recompute at every seed (host
    protocols on CPU tensors), and every seed's checks are counted."""
    p = GemmProblem(*shape, layout=layout)
    rows = S.timed_output_rows([p], [_planted("correct", layout)], range(5), CPU)
    assert [r["protocol"] for r in rows] == ["offline"]  # graph and cold need CUDA
    (r,) = rows
    assert r["status"] == "passed" and r["failures"] == 0 and r["seeds"] == 5 and r["output_checks"] >= 5, r


def test_timed_output_check_reports_a_wrong_kernel():
    p = GemmProblem(33, 65, 129)
    (r,) = S.timed_output_rows([p], [_planted("skip_last_k")], range(2), CPU)
    assert r["status"] == "rejected" and r["failures"] == 2 and r["first_fail_seed"] == 0
    assert r["reason"].startswith("timed_output:")
