"""What programmatic dependent launch (PDL) changes for the Triton family: each config timed without and with
``pdl`` beside torch.matmul, in three settings.

  graph          the graph protocol: calls captured back to back in one CUDA graph (each launch overlaps the
                 previous call of the same kernel, which lets it launch as soon as it starts)
  graph_foreign  the same graph with a small elementwise kernel (torch's, no PDL) before every call, as in a model
                 where the GEMM follows a norm or an activation; reported per call, the foreign kernel included,
                 so only differences between candidates mean anything
  cold           the cold protocol: one call after the L2 flush, between events

Cases are (M_N_K, layout, config) triples: ``--from-remeasure CSV`` takes the configs a re-measure run served in
``--select-protocol`` (candidate ``triton-sel:<protocols>``, e.g. ``triton-sel:cold+graph``), ``--cases`` gives them by hand, else a built-in list.
Rows are in the results schema; candidates ``pdl-probe:<setting>:<off|on>:<config>:<layout>`` and
``pdl-probe:<setting>:torch``; ``info`` holds the setting.

    PYTHONPATH=src python3 benchmarks/acceptance/pdl_probe.py --out pdl.csv                       # on the GPU machine
    PYTHONPATH=src python3 benchmarks/acceptance/pdl_probe.py --from-remeasure R.csv.gz --shapes S.txt --out pdl.csv
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.kernels.triton_gemm.configs import parse_config  # noqa: E402
from gemmrl.problem import parse_mnk, read_shapes  # noqa: E402

SETTINGS = ("graph", "graph_foreign", "cold")
CASES = [  # (mnk, layout, config): tiny, few-tile long K, decode, mid-size persistent
    ("64_64_256", "tn", "tiled(BM=32,BN=16,BK=32,warps=2,stages=5,group_m=8)"),
    ("128_256_64", "tn", "tiled(BM=16,BN=32,BK=64,warps=2,stages=5,group_m=4)"),
    ("256_256_1024", "nn", "tiled(BM=16,BN=32,BK=128,warps=2,stages=5,group_m=1)"),
    ("512_256_2048", "nn", "persistent(BM=64,BN=64,BK=128,warps=4,stages=5,group_m=1,order=m,tma=False,"
                           "flatten=False,ws=False,subtile=False,ctas_per_sm=1)"),
    ("64_256_4096", "nn", "splitk(BM=32,BN=32,BK=256,warps=4,stages=4,group_m=8,split=8,reduction=fused,tma=False,"
                          "nondeterministic=False)"),
    ("256_1024_12288", "nn", "splitk(BM=64,BN=128,BK=128,warps=4,stages=4,group_m=8,split=4,reduction=fused,"
                             "tma=False,nondeterministic=False)"),
    ("1_4096_4096", "tn", "splitk(BM=16,BN=64,BK=128,warps=4,stages=4,group_m=8,split=2,reduction=fused,tma=True,"
                          "nondeterministic=False)"),
    ("16384_256_512", "tn", "persistent(BM=128,BN=256,BK=64,warps=4,stages=3,group_m=1,order=n,tma=True,"
                            "flatten=False,ws=True,subtile=False,ctas_per_sm=1)"),
]


def cases_from_remeasure(path: str, protocol: str, shapes: set[str] | None) -> list[tuple[str, str, str]]:
    from gemmrl.results import read_rows

    out = {}
    for r in read_rows([Path(path)]):
        sel, _, picked_in = r["candidate"].partition(":")  # triton-sel:graph, triton-sel:cold+graph, ...
        if sel == "triton-sel" and protocol in picked_in.split("+") and r["protocol"] == protocol and r.get("algo"):
            if shapes is None or r["mnk"] in shapes:
                out[r["mnk"]] = (r["mnk"], r["layout"], r["algo"])
    return list(out.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--cases", nargs="*", help="M_N_K:layout:config (default: the built-in list)")
    ap.add_argument("--from-remeasure", help="a re-measure CSV: the configs it served (triton-sel:<protocol>)")
    ap.add_argument("--select-protocol", default="graph")
    ap.add_argument("--shapes", help="with --from-remeasure: only these shapes (a shapes file)")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    args = ap.parse_args(argv)
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels.triton_gemm import TritonGemm
    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.search.screen import SCREEN_TIMING
    from gemmrl.timing import floor_ms, l2_bytes, measure

    if args.from_remeasure:
        shapes = {p.mnk for p in read_shapes(args.shapes)} if args.shapes else None
        cases = cases_from_remeasure(args.from_remeasure, args.select_protocol, shapes)
    elif args.cases:
        cases = [tuple(c.split(":", 2)) for c in args.cases]
    else:
        cases = CASES
    settings = [s for s in args.settings.split(",") if s]
    bad = set(settings) - set(SETTINGS)
    if bad:
        raise SystemExit(f"unknown settings {sorted(bad)}; use {', '.join(SETTINGS)}")
    torch.cuda.init()
    meta = collect_meta().row()
    writer = ResultsWriter(args.out) if args.out else None
    timing = replace(SCREEN_TIMING, graph_replays=10, cold_calls=15)
    foreign = torch.zeros(1 << 14, device="cuda")
    for mnk, layout, text in cases:
        base = parse_config(text)
        p = parse_mnk(mnk).with_(layout=layout)
        bufs = make_buffers(p, "cuda")
        a, b, bt, c = bufs.args()
        cands = {}
        for pdl in (False, True):
            cand = TritonGemm(replace(base, pdl=pdl), layout)
            cand.prepare(p, bufs, "graph", None)
            cands["on" if pdl else "off"] = cand
        torch_fn = (lambda: torch.matmul(a, bt.t(), out=c)) if layout == "tn" else (lambda: torch.matmul(a, b, out=c))
        plain = {"torch": torch_fn, **{k: (lambda f=f: f(a, b, bt, c)) for k, f in cands.items()}}
        line = [f"{mnk:>16} {layout}"]
        for setting in settings:
            fns = plain
            if setting == "graph_foreign":
                fns = {k: (lambda f=f: (foreign.add_(1.0), f())) for k, f in plain.items()}
            proto = "cold" if setting == "cold" else "graph"
            ts = measure(fns, bufs, proto, timing)
            fl = floor_ms(p, meta.get("gpu", ""), proto, l2_bytes())
            us = {k: t.time_ms * 1e3 for k, t in ts.items()}
            line.append(f"{setting}: torch {us['torch']:.2f} off {us['off']:.2f} on {us['on']:.2f} us")
            if writer:
                rows = []
                for k, t in ts.items():
                    name = "torch" if k == "torch" else f"{k}:{replace(base, pdl=k == 'on')}:{layout}"
                    rows.append({"mnk": mnk, "dtype": p.dtype, "acc": p.acc, "layout": layout,
                                 "candidate": f"pdl-probe:{setting}:{name}", "protocol": proto,
                                 "time_ms": t.time_ms, "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms,
                                 "p80_ms": t.p80_ms, "verified": "", "reason": t.reason,
                                 "algo": "" if k == "torch" else str(replace(base, pdl=k == "on")), **meta,
                                 "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(), "M": p.M, "N": p.N, "K": p.K,
                                 "floor_ms": fl if setting != "graph_foreign" else "",
                                 "info": f"setting={setting};pdl_probe"})
                writer.write_batch(rows)
        print("  ".join(line), flush=True)
        del cands, bufs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
