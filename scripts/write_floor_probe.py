"""How far the vendor's GEMM is from the device's own write floor on shapes where writing C dominates (K <= 512,
large M x N): per shape, ``c.fill_`` of the same C (a pure write of 2MN bytes) against torch.matmul into that C, in
graph and cold, interleaved in one run. ``fill`` bounds any GEMM that writes C once; ``matmul / fill`` is the room
a kernel that overlaps its epilogue with its main loop could reach at most.

Rows are in the results schema (candidates ``write-floor:fill`` and ``write-floor:torch``); a table is printed
last, with the write bandwidth the fill reached.

    PYTHONPATH=src python3 scripts/write_floor_probe.py --out write_floor.csv [--shapes 16384_16384_256 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPES = ("16384_16384_64", "16384_16384_128", "16384_16384_256", "16384_16384_512", "8192_16384_256",
          "8192_8192_256", "4096_4096_256")


def checked_shape(mnk: str) -> str:
    """An M_N_K whose C (2MN bytes) outweighs its operands (2K(M+N)): the shapes this probe is about."""
    from gemmrl.problem import parse_mnk

    p = parse_mnk(mnk)
    if p.M * p.N <= p.K * (p.M + p.N):
        raise argparse.ArgumentTypeError(f"{mnk}: C ({2 * p.M * p.N} B) does not outweigh A and B "
                                         f"({2 * p.K * (p.M + p.N)} B); this probe is for C-write-bound shapes "
                                         "(K well below min(M, N))")
    return mnk


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), type=checked_shape)
    ap.add_argument("--protocols", default="graph,cold")
    args = ap.parse_args(argv)
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.problem import parse_mnk
    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.timing import TimingConfig, floor_ms, l2_bytes, measure

    torch.cuda.init()
    meta = collect_meta().row()
    writer = ResultsWriter(args.out) if args.out else None
    cfg = TimingConfig()  # the full statistics: these shapes run at the power-capped clock
    print(f"{'shape':18} {'protocol':8} {'fill us':>9} {'matmul us':>10} {'matmul/fill':>11} {'fill TB/s':>9}",
          flush=True)
    for mnk in args.shapes:
        p = parse_mnk(mnk).with_(layout="tn")
        bufs = make_buffers(p, "cuda")
        a, b, bt, c = bufs.args()
        fns = {"fill": lambda: c.fill_(0.0), "torch": lambda: torch.matmul(a, bt.t(), out=c)}
        for proto in [x for x in args.protocols.split(",") if x]:
            ts = measure(fns, bufs, proto, cfg)
            f, m = ts["fill"].time_ms, ts["torch"].time_ms
            print(f"{mnk:18} {proto:8} {f * 1e3:9.1f} {m * 1e3:10.1f} {m / f:11.3f} {2 * p.M * p.N / (f * 1e9):9.2f}",
                  flush=True)
            if writer:
                fl = floor_ms(p, meta.get("gpu", ""), proto, l2_bytes())
                writer.write_batch([{"mnk": mnk, "dtype": p.dtype, "acc": p.acc, "layout": "tn",
                                     "candidate": f"write-floor:{k}", "protocol": proto, "time_ms": t.time_ms,
                                     "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                                     "reason": t.reason, **meta, "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(),
                                     "M": p.M, "N": p.N, "K": p.K, "floor_ms": fl if k == "torch" else "",
                                     "info": f"c_bytes={2 * p.M * p.N};write_floor_probe"}
                                    for k, t in ts.items()])
        del bufs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
