"""Where a fused split-K call's time goes on few-tile long-K shapes: the same config timed whole and in parts.

Per case (M_N_K, layout, a ``splitk(...)`` config), interleaved in one run per protocol (graph, cold), each
per call:

  torch     torch.matmul, the reference every gemmrl figure is against
  fused     the config as the library serves it (its split-K sum loads RED_GROUP partials at a time)
  group1    the same kernel with RED_GROUP = 1: one partial a load, a dependent L2 round trip per partial, as the
            sum was before the measure pass to 934 shapes' unroll
  twopass   the same tile and split with reduction=two_pass (workspace, then a second reduction kernel)
  slice     the same tile as ``tiled(...)`` on (M, N, ceil(K / split) rounded up to BK): one program's share of
            K alone, no partials, no reduction (same BM x BN tiles, split-fold fewer programs)
  launch    a one-element torch add: what one more launch costs in this protocol, the floor of any call

So fused - slice is the cost of splitting (partials out, counter, the last program's sum), fused - group1 what
the unroll bought, and slice - launch what one program's mainloop costs beyond a launch. Every C-writing variant
is checked by the battery's accuracy check (fp64 product, K-scaled tolerance) before it is timed.

    PYTHONPATH=src python3 benchmarks/acceptance/splitk_anatomy.py --out anatomy.csv            # on the GPU machine
    PYTHONPATH=src python3 benchmarks/acceptance/splitk_anatomy.py --cases 64_64_4096:tn:"splitk(...)" --out anatomy.csv
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.kernels.triton_gemm.configs import SplitKConfig, TiledConfig, parse_config  # noqa: E402
from gemmrl.problem import parse_mnk  # noqa: E402

VARIANTS = ("torch", "fused", "group1", "twopass", "slice", "launch")
PROTOCOLS = ("graph", "cold")
_SK = "warps=4,group_m=8,reduction=fused,tma=False,nondeterministic=False"
CASES = [  # the grid library's fused split-K configs (graph entries) on six of the 39 shapes it serves with one
    ("64_64_2048", "tn", f"splitk(BM=32,BN=32,BK=256,stages=4,split=8,{_SK})"),
    ("64_64_4096", "tn", f"splitk(BM=16,BN=64,BK=256,stages=4,split=16,{_SK})"),
    ("128_64_4096", "tn", f"splitk(BM=16,BN=64,BK=256,stages=3,split=16,{_SK})"),
    ("128_128_4096", "tn", f"splitk(BM=32,BN=32,BK=256,stages=4,split=8,{_SK})"),
    ("64_64_12288", "tn", f"splitk(BM=16,BN=64,BK=256,stages=4,split=24,{_SK})"),
    ("128_1024_16384", "tn", f"splitk(BM=64,BN=64,BK=128,stages=5,split=4,{_SK})"),
]


def slice_k(K: int, BK: int, split: int) -> int:
    """One split-K program's share of K as the kernel cuts it: whole BK steps, ceil(k_tiles / split) of them."""
    k_tiles = -(-K // BK)
    return -(-k_tiles // split) * BK


def parts(cfg: SplitKConfig) -> dict[str, object]:
    """The configs a case times beside ``cfg`` (fused): twopass (same tile and split) and the slice's tiled config."""
    if not isinstance(cfg, SplitKConfig):
        raise SystemExit(f"{cfg}: the anatomy is of a splitk(...) config; give one")
    return {"twopass": replace(cfg, reduction="two_pass"),
            "slice": TiledConfig(BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, warps=cfg.warps, stages=cfg.stages,
                                 group_m=cfg.group_m)}


def parse_case(text: str) -> tuple[str, str, str]:
    bits = text.split(":", 2)
    if len(bits) != 3 or bits[1] not in ("tn", "nn"):
        raise SystemExit(f"--cases {text!r}: use M_N_K:tn|nn:splitk(...)")
    try:
        parse_mnk(bits[0])
    except ValueError as e:
        raise SystemExit(f"--cases {text!r}: {e}; use M_N_K:tn|nn:splitk(...)") from None
    return bits[0], bits[1], bits[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--cases", nargs="*", help="M_N_K:layout:splitk(...) (default: six of the library's)")
    args = ap.parse_args(argv)
    cases = [parse_case(c) for c in args.cases] if args.cases else CASES
    for _, _, text in cases:
        parts(parse_config(text))  # every config checked before the GPU is touched
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels.triton_gemm import TritonGemm, plans
    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.search.screen import SCREEN_TIMING
    from gemmrl.timing import floor_ms, l2_bytes, time_cold, time_graph
    from gemmrl.verify import check_accuracy

    torch.cuda.init()
    meta = collect_meta().row()
    writer = ResultsWriter(args.out) if args.out else None
    timing = replace(SCREEN_TIMING, graph_replays=15, cold_calls=25)
    one = torch.zeros(1, device="cuda")
    print(f"{'':>16} {'':5} " + " ".join(f"{v:>8}" for v in VARIANTS) + "   (us per call)")
    for mnk, layout, text in cases:
        fused = parse_config(text)
        extra = parts(fused)
        p = parse_mnk(mnk).with_(layout=layout)
        bufs = make_buffers(p, "cuda")
        a, b, bt, c = bufs.args()
        ks = slice_k(p.K, fused.BK, fused.split)
        ps = parse_mnk(f"{p.M}_{p.N}_{ks}").with_(layout=layout)
        sbufs = make_buffers(ps, "cuda")
        sa, sb, sbt, sc = sbufs.args()
        cands = {}
        saved = plans.RED_REGS
        try:
            for name, cfg, pr, bf in (("fused", fused, p, bufs), ("twopass", extra["twopass"], p, bufs),
                                      ("slice", extra["slice"], ps, sbufs)):
                cands[name] = TritonGemm(cfg, layout)
                cands[name].prepare(pr, bf, "graph", None)
            plans.RED_REGS = 1  # red_group -> 1: one partial a load (the plan binds RED_GROUP when prepared)
            cands["group1"] = TritonGemm(fused, layout)
            cands["group1"].prepare(p, bufs, "graph", None)
        finally:
            plans.RED_REGS = saved
        torch_fn = (lambda: torch.matmul(a, bt.t(), out=c)) if layout == "tn" else (lambda: torch.matmul(a, b, out=c))
        fns = {"torch": torch_fn,
               **{k: (lambda f=cands[k]: f(a, b, bt, c)) for k in ("fused", "group1", "twopass")},
               "slice": lambda f=cands["slice"]: f(sa, sb, sbt, sc),
               "launch": lambda: one.add_(1.0)}
        for k in ("fused", "group1", "twopass"):  # the battery's accuracy check (fp64 product, K-scaled tolerance)
            chk = check_accuracy(cands[k], p, "cuda", seeds=(0,))
            if not chk.passed:
                raise SystemExit(f"{mnk} {k} ({cands[k].cfg}): {chk.reason}; not timed")
        groups = {"fused": plans.red_group(fused.BM * fused.BN, fused.warps, fused.split), "group1": 1}
        res = {"graph": time_graph(fns, p, timing), "cold": time_cold(fns, p, timing)}
        for proto in PROTOCOLS:
            us = {k: t.time_ms * 1e3 for k, t in res[proto].items()}
            print(f"{mnk:>16} {proto:5} " + " ".join(f"{us[v]:8.2f}" for v in VARIANTS), flush=True)
            if writer:
                fl = floor_ms(p, meta.get("gpu", ""), proto, l2_bytes())
                rows = []
                for k, t in res[proto].items():
                    cfg = {"torch": "", "launch": "", "fused": fused, "group1": fused, **extra}[k]
                    rows.append({"mnk": mnk, "dtype": p.dtype, "acc": p.acc, "layout": layout,
                                 "candidate": f"splitk-anatomy:{k}", "protocol": proto, "time_ms": t.time_ms,
                                 "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                                 "verified": "true" if k in ("fused", "group1", "twopass") else "",
                                 "reason": t.reason, "algo": str(cfg), **meta, "sm_clock_mhz": sm_clock_mhz(),
                                 "timestamp": now(), "M": p.M, "N": p.N, "K": p.K,
                                 "floor_ms": fl if k in ("torch", "fused", "group1", "twopass") else "",
                                 "info": f"variant={k};case={text}" + (f";slice_K={ks}" if k == "slice" else "")
                                         + (f";red_group={groups[k]}" if k in groups else "")})
                writer.write_batch(rows)
        del cands, bufs, sbufs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
