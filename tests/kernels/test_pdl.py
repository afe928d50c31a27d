"""Programmatic dependent launch (PDL) in the Triton family: the ``pdl`` config field, its plans and launch
option, the screen's ``--pdl`` twins, the cost model's term.

CPU tier: names (old ones unchanged), the predicate, the plan's launch option (off under the interpreter), the
interpreter battery with ``pdl=True``, the screen's entries and the cost model. Compile-only checks (every kernel
of a PDL plan waits on the previous grid) are in test_triton_gemm.py's COMPILE_CASES.
GPU tier: every variant with ``pdl=True`` through the battery on the direct path, and a chain of dependent calls
(each call's A is the previous call's C, two buffers in turn) eagerly and replayed from a CUDA graph, bit for bit
equal to the same chain without PDL: a kernel that touched memory before the previous grid finished would read a
half-written A or overwrite an A still being read.
"""

from __future__ import annotations

import dataclasses

import pytest

from gemmrl import verify as V
from gemmrl.candidate import make_buffers
from gemmrl.kernels.triton_gemm import (A100, H100, INTERPRETER, PersistentConfig, SmallMConfig, SplitKConfig,
                                        TiledConfig, TritonGemm, parse_config, valid)
from gemmrl.kernels.triton_gemm import plans
from gemmrl.problem import GemmProblem, parse_mnk
from gemmrl.search import costmodel as CM
from gemmrl.search.screen import ScreenSpec, entries_for, exploration_pool
from conftest import script_module

CONFIGS = [
    TiledConfig(BM=64, BN=64, BK=32, warps=4, stages=3, pdl=True),
    PersistentConfig(BM=64, BN=64, BK=32, warps=4, stages=2, tma=True, pdl=True),
    SplitKConfig(BM=32, BN=64, BK=16, warps=4, stages=2, split=2, reduction="two_pass", pdl=True),
    SplitKConfig(BM=32, BN=64, BK=16, warps=4, stages=2, split=3, reduction="fused", pdl=True),
    SmallMConfig(BM=16, BN=64, BK=16, warps=4, stages=2, pdl=True),
]


def test_pdl_names_round_trip_and_earlier_names_stay():
    for cfg in CONFIGS:
        text = str(cfg)
        assert text.endswith(",pdl=True)") and parse_config(text) == cfg
        off = dataclasses.replace(cfg, pdl=False)
        assert "pdl" not in str(off) and parse_config(str(off)) == off  # the names of every earlier CSV and library
    assert str(TiledConfig()) == "tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)"


def _problem(cfg, **kw) -> GemmProblem:
    return GemmProblem(1 if cfg.variant == "smallm" else 33, kw.pop("N", 64), kw.pop("K", 128), **kw)


def test_pdl_needs_hopper():
    for cfg in CONFIGS:
        p = _problem(cfg)
        assert valid(cfg, p, H100)[0], valid(cfg, p, H100)
        ok, why = valid(cfg, p, A100)
        assert not ok and "pdl (programmatic dependent launch) needs sm_90+" in why, why


def test_plan_carries_the_launch_option_except_under_the_interpreter():
    import torch

    for cfg in CONFIGS:
        pl = _problem(cfg)
        gpu = plans.build(cfg, pl, torch.device("meta"), H100)
        assert all(L.pdl and L.options()["launch_pdl"] is True for L in gpu.launches), cfg
        assert all(L.args[L.kernel.arg_names.index("PDL")] is True for L in gpu.launches)
        cpu = plans.build(cfg, pl, torch.device("cpu"), INTERPRETER)
        assert not any(L.pdl or "launch_pdl" in L.options() for L in cpu.launches), cfg
        off = plans.build(dataclasses.replace(cfg, pdl=False), pl, torch.device("meta"), H100)
        assert all("launch_pdl" not in L.options() for L in off.launches)  # the cache key of earlier builds
    two_pass = plans.build(CONFIGS[2], _problem(CONFIGS[2]), torch.device("meta"), H100)
    assert len(two_pass.launches) == 2  # the reduction waits on the split kernel too


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.variant + getattr(c, "reduction", ""))
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_pdl_configs_pass_the_battery_interpreter(cfg, layout):
    p = _problem(cfg, N=72, K=136, layout=layout)
    cand = TritonGemm(cfg, layout)
    cand.prepare(p, make_buffers(p, "cpu"), "graph", None)
    v = V.verify(cand, p, "cpu", trials=1)
    assert v.passed, f"{cfg} {p}: {v.reason}"


def test_screen_twins_each_config_side_by_side():
    p = parse_mnk("256_512_1024")
    pool = exploration_pool(0, 8)
    spec = ScreenSpec(problems=(p,), out="x.csv", top=4, explore=2, layouts=("tn",), pdl="both")
    es = entries_for(p, spec, H100, pool)
    assert len(es) == 12 and len({e.name for e in es}) == 12
    for off, on in zip(es[::2], es[1::2]):
        assert not off.config.pdl and on.config.pdl
        assert dataclasses.replace(off.config, pdl=True) == on.config and on.algo == str(on.config)
    only = entries_for(p, dataclasses.replace(spec, pdl="on"), H100, pool)
    assert [e.name for e in only] == [e.name for e in es[1::2]]
    assert [e.name for e in entries_for(p, dataclasses.replace(spec, pdl="off"), H100, pool)] == \
        [e.name for e in es[::2]]
    with pytest.raises(ValueError, match="use off, on, both"):
        ScreenSpec(problems=(p,), out="x.csv", pdl="yes")
    with pytest.raises(ValueError, match="Triton launch option"):
        ScreenSpec(problems=(p,), out="x.csv", pdl="on", family="cutlass")


def test_costmodel_credits_pdl_in_graph_only():
    p = parse_mnk("256_256_1024")
    for cfg in CONFIGS[:3]:
        off = dataclasses.replace(cfg, pdl=False)
        warm_on, warm_off = (CM.estimate(c, p, H100, warm_l2=True) for c in (cfg, off))
        launches = 2 if getattr(cfg, "reduction", "") == "two_pass" else 1
        assert warm_off.seconds - warm_on.seconds == pytest.approx(launches * CM.DEFAULT.pdl_us * 1e-6)
        assert CM.estimate(cfg, p, H100).seconds == CM.estimate(off, p, H100).seconds  # one call after a flush


# ----------------------------------------------------------------------------------------------------
# GPU tier
# ----------------------------------------------------------------------------------------------------
GPU_CASES = [  # (shape, config): tiny, odd, few-tile long K, decode, a full wave of persistent TMA
    ((64, 64, 64), TiledConfig(BM=16, BN=32, BK=64, warps=2, stages=5, group_m=4, pdl=True)),
    ((33, 65, 129), TiledConfig(BM=64, BN=64, BK=32, warps=4, stages=3, pdl=True)),
    ((512, 256, 2048), PersistentConfig(BM=64, BN=64, BK=128, warps=4, stages=5, group_m=1, tma=False, pdl=True)),
    ((1024, 1024, 1024), PersistentConfig(BM=128, BN=128, BK=64, warps=4, stages=3, ws=True, pdl=True)),
    ((2048, 2048, 512), PersistentConfig(BM=128, BN=256, BK=64, warps=8, stages=3, subtile=True, pdl=True)),
    ((256, 256, 8192), SplitKConfig(BM=64, BN=32, BK=256, warps=4, stages=4, split=4, reduction="fused", pdl=True)),
    ((64, 256, 4096), SplitKConfig(BM=32, BN=32, BK=256, warps=4, stages=4, split=8, reduction="two_pass",
                                   pdl=True)),
    ((64, 512, 2048), SplitKConfig(BM=64, BN=64, BK=64, warps=4, stages=4, split=4, reduction="fused", tma=True,
                                   pdl=True)),
    ((1, 4096, 4096), SmallMConfig(BM=16, BN=64, BK=128, warps=4, stages=4, split=2, reduction="fused", pdl=True)),
    ((32, 4096, 4096), SmallMConfig(BM=32, BN=32, BK=128, warps=2, stages=6, pdl=True)),
]


def _cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return "cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("case", range(len(GPU_CASES)), ids=lambda i: "x".join(map(str, GPU_CASES[i][0])))
def test_gpu_pdl_battery(case, layout):
    pytest.importorskip("triton")
    dev = _cuda()
    shape, cfg = GPU_CASES[case]
    p = GemmProblem(*shape, layout=layout)
    assert valid(cfg, p, H100)[0], valid(cfg, p, H100)
    cand = TritonGemm(cfg, layout)
    cand.prepare(p, make_buffers(p, dev), "graph", None)
    assert cand.info()["launch"] == "direct", cand.info()
    assert all(d.head[6] for d in cand._direct)  # the launcher is asked for programmatic serialization
    v = V.verify(cand, p, dev, trials=2)
    assert v.passed, f"{cfg} {p}: {v.reason}"


def _chain(cand, x0, w, n: int, graph: bool):
    """x_{i+1} = x_i @ w through ``cand`` (layout tn: w given as w^T), ``n`` calls over two buffers in turn."""
    import torch

    xs = [x0.clone(), torch.empty_like(x0)]

    def run():
        for i in range(n):
            cand(xs[i % 2], None, w, xs[(i + 1) % 2])

    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                run()
        torch.cuda.current_stream().wait_stream(s)
        xs[0].copy_(x0)
        g.replay()
    else:
        run()
    torch.cuda.synchronize()
    return xs[n % 2].clone()


@pytest.mark.gpu
@pytest.mark.parametrize("case", [0, 2, 5, 6], ids=lambda i: "x".join(map(str, GPU_CASES[i][0])))
def test_gpu_pdl_dependent_chain_eager_and_graph(case):
    """Each call reads what the previous one wrote and overwrites what the one before read: with PDL, bit for bit
    what the same config computes without it, eagerly and in a graph (where the calls overlap their launches)."""
    pytest.importorskip("triton")
    import torch

    _cuda()
    (M, N, K), cfg = GPU_CASES[case]
    if cfg.variant == "smallm":
        pytest.skip("a chain needs a square x @ w")
    n = 40
    p = GemmProblem(M, K, K, layout="tn")  # x [M,K] @ w [K,K]: the output feeds the next call
    g = torch.Generator(device="cuda").manual_seed(3)
    x0 = torch.randn(M, K, device="cuda", generator=g).half()
    w = (torch.randn(K, K, device="cuda", generator=g) / K ** 0.5).half()  # keeps the chain's scale near 1
    outs = {}
    for pdl in (False, True):
        c = dataclasses.replace(cfg, pdl=pdl)
        if not valid(c, p, H100)[0]:
            pytest.skip(f"{c} invalid at {p.mnk}: {valid(c, p, H100)[1]}")
        cand = TritonGemm(c, "tn")
        cand.prepare(p, make_buffers(p, "cuda"), "graph", None)
        assert cand.info()["launch"] == "direct"
        outs[pdl] = [_chain(cand, x0, w, n, graph) for graph in (False, True)]
    ref = outs[False][0]
    assert torch.isfinite(ref).all() and ref.abs().max() > 0
    for pdl in (False, True):
        for graph, y in zip((False, True), outs[pdl]):
            assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), (pdl, graph)


def test_pdl_probe_takes_the_configs_a_remeasure_served():
    """benchmarks/acceptance/pdl_probe.py --from-remeasure: per shape, the config served in the protocol asked (parseable), only
    the shapes of the file; its built-in cases parse too."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    probe = script_module("pdl_probe")
    rem = root / "benchmarks" / "results" / "h100" / "h100_decode-grid120_triton-selected-remeasure_graph-cold_2026-11-22.csv.gz"
    shapes = {"512_256_2048", "256_512_4096", "1_4096_4096"}
    cases = probe.cases_from_remeasure(str(rem), "graph", shapes)
    assert {m for m, _, _ in cases} == shapes
    for mnk, layout, text in cases + probe.CASES:
        cfg = parse_config(text)
        assert layout in ("tn", "nn") and not cfg.pdl
        assert valid(dataclasses.replace(cfg, pdl=True), parse_mnk(mnk).with_(layout=layout), H100)[0], (mnk, text)
