"""benchmarks/acceptance/splitk_anatomy.py: the parts it times beside a fused split-K config (CPU; the timing itself is GPU work)."""
import gzip
import json
from pathlib import Path

import pytest
import torch

from gemmrl.kernels.triton_gemm import plans
from gemmrl.kernels.triton_gemm.configs import H100, SplitKConfig, TiledConfig, parse_config, valid
from gemmrl.problem import parse_mnk
from conftest import script_module

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "benchmarks" / "results" / "h100" / "libraries" / "h100_grid1000_library_selection-every-vendor_2026-11-26.json.gz"


def _probe():
    return script_module("splitk_anatomy")


@pytest.mark.parametrize("K", [64, 1000, 2048, 4095, 4096, 12288, 16384])
@pytest.mark.parametrize("BK,split", [(32, 2), (64, 3), (128, 4), (256, 16), (256, 24)])
def test_slice_is_one_programs_share_of_k(K, BK, split):
    """The slice's K is what one split-K program covers, as the plan cuts it (k_per_split): whole BK steps."""
    p = parse_mnk(f"64_64_{K}")
    cfg = SplitKConfig(BM=32, BN=32, BK=BK, warps=4, stages=3, group_m=8, split=split, reduction="fused")
    ks = _probe().slice_k(K, BK, split)
    plan = plans.build(cfg, p, torch.device("cpu"), H100) if valid(cfg, p, H100)[0] else None
    assert ks % BK == 0 and ks * split >= K and (ks - BK) * split < K
    if plan is not None:
        names = list(plan.launches[0].kernel.arg_names)
        assert plan.launches[0].args[names.index("k_per_split")] == ks


def test_default_cases_are_the_librarys_and_every_part_is_valid():
    """Each built-in case is a fused split-K config the grid library serves on that shape in graph; its two-pass twin
    and its slice are valid where they run, the slice is the same tile, and the unrolled sum groups more than one
    partial (else fused and group1 would be the same kernel)."""
    probe = _probe()
    lib = json.loads(gzip.decompress(LIBRARY.read_bytes()))["entries"]
    served = {(e["M"], e["N"], e["K"]): e["algo"] for e in lib if e["family"] == "triton" and e["protocol"] == "graph"}
    for mnk, layout, text in probe.CASES:
        cfg = parse_config(text)
        p = parse_mnk(mnk).with_(layout=layout)
        assert parse_config(served[(p.M, p.N, p.K)]) == cfg, mnk
        parts = probe.parts(cfg)
        assert cfg.reduction == "fused" and parts["twopass"].reduction == "two_pass"
        assert valid(cfg, p, H100)[0] and valid(parts["twopass"], p, H100)[0]
        sl = parts["slice"]
        assert isinstance(sl, TiledConfig) and (sl.BM, sl.BN, sl.BK, sl.warps) == (cfg.BM, cfg.BN, cfg.BK, cfg.warps)
        ps = parse_mnk(f"{p.M}_{p.N}_{probe.slice_k(p.K, cfg.BK, cfg.split)}").with_(layout=layout)
        assert valid(sl, ps, H100)[0], mnk
        assert plans.red_group(cfg.BM * cfg.BN, cfg.warps, cfg.split) > 1, mnk


@pytest.mark.parametrize("text", ["64_64_4096:xx:splitk(BM=16,BN=64,BK=256,split=4)", "64_64:tn:splitk(split=4)",
                                  "64_64_4096"])
def test_bad_cases_are_refused_with_the_form(text):
    with pytest.raises(SystemExit, match="M_N_K|mnk|M, N, K|shape"):
        _probe().parse_case(text)


def test_a_config_that_is_not_split_k_is_refused():
    with pytest.raises(SystemExit, match="splitk"):
        _probe().parts(parse_config("tiled(BM=32,BN=32,BK=64,warps=4,stages=3,group_m=8)"))
