"""The decode family (kernels/decode_gemm.py) on the GPU in one invocation: the battery on odd, tiny and split shapes,
then every screened config of each decode shape timed beside the seven vendor paths by the package's own bench
(graph and cold, `--timing quick` statistics), with a time budget; a short table last.

    GEMMRL_OUT=$OUT GEMMRL_GIT_SHA=$(git rev-parse HEAD) python3 benchmarks/acceptance/decode_roofline.py \
        --shapes benchmarks/shapes/decode_models5_m1-32_weights100mb.txt --dtype fp16 --budget-s 150

Writes to $GEMMRL_OUT: decode_battery.csv (config, shape, dtype, passed, reason, repeat-bitwise), decode_bench_<dtype>.csv
(the results schema: vendor rows, aggregates, ``decode:<config>`` rows) and decode_table.txt (what is printed last).
TB/s counts the bytes a call must move (weight + activations + output); the floor is DESIGN.md's
max(2MNK / 989e12, bytes / 4.8e12) for the H200.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

PEAK_FLOPS, PEAK_BW = 989e12, 4.8e12
# odd N and K tails, M of 1..64, every (R, WR, WK) and splits that leave a short last split
BATTERY = [
    ("1_37_72", "r1_w1x8_st8_s1"), ("3_130_264", "r2_w1x8_st4_s1"), ("9_70_136", "r2_w2x4_st6_s2"),
    ("20_130_264", "r2_w4x2_st4_s3"), ("33_50_72", "r4_w2x2_st4_s2"), ("64_257_520", "r2_w4x1_st4_s1"),
    ("8_16_8", "r2_w4x1_st8_s1"), ("17_1000_1032", "r2_w2x4_u2_st3_s4"), ("5_8191_4104", "r1_w1x8_u4_st3_s1"),
    ("32_3584_18944", "r2_w4x1_u4_st2_s6"), ("1_4096_14336", "r1_w1x8_u4_st3_s1"), ("16_4100_4096", "r4_w2x2_u2_st4_s3"),
    ("1_40_392", "r1_w1x8_u4_st3_s1"), ("31_1000_1000", "r2_w2x4_u2_st3_s2"),
    # the deep rings (ST - 1 steps in flight a warp: 15, 7, 3)
    ("5_300_4104", "r1_w1x8_st16_s1"), ("8_200_2056", "r1_w1x8_u2_st8_s2"), ("2_129_1032", "r1_w1x8_u4_st4_s2"),
    ("12_70_1000", "r1_w1x8_st12_s1"), ("1_4096_14336", "r1_w1x8_u4_st4_s1"),
]


def nbytes(p) -> int:
    return 2 * (p.N * p.K + p.M * p.K + p.M * p.N)


def floor_us(p) -> float:
    return max(2 * p.M * p.N * p.K / PEAK_FLOPS, nbytes(p) / PEAK_BW) * 1e6


def battery(dtypes, out: Path) -> int:
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels import decode_gemm as dg
    from gemmrl.problem import parse_mnk
    from gemmrl.verify import verify

    rows, bad = [], 0
    for dtype in dtypes:
        for mnk, text in BATTERY:
            p = parse_mnk(mnk, dtype=dtype)
            cfg = dg.DecodeConfig.parse(f"{text}_{dtype}")
            row = {"mnk": mnk, "dtype": dtype, "config": str(cfg)}
            try:
                cand = dg.DecodeCandidate(cfg)
                bufs = make_buffers(p, "cuda", seed=1)
                cand.prepare(p, bufs, "graph", None)
                v = verify(cand, p, "cuda")
                row.update(passed=bool(v.passed), reason=v.reason)
                # deterministic: the same inputs give the same bits call after call (the split's reduction order)
                outs = []
                for _ in range(3):
                    bufs.c.fill_(float("nan"))
                    cand(*bufs.args())
                    outs.append(bufs.c.clone())
                torch.cuda.synchronize()
                row["repeat_bitwise"] = all(torch.equal(outs[0].view(torch.int16), o.view(torch.int16)) for o in outs)
            except Exception as e:  # noqa: BLE001 - a failure is a row, the run goes on
                row.update(passed=False, reason=f"{type(e).__name__}: {e}"[:300], repeat_bitwise="")
            bad += not (row["passed"] and row["repeat_bitwise"] is True)
            rows.append(row)
            print(f"battery {dtype} {mnk:>14} {str(cfg):28} passed={row['passed']} bitwise={row['repeat_bitwise']} "
                  f"{row['reason'][:120]}", flush=True)
    with open(out / "decode_battery.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["mnk", "dtype", "config", "passed", "repeat_bitwise", "reason"])
        w.writeheader()
        w.writerows(rows)
    return bad


def bench(shapes: str, dtype: str, out: Path, deadline: float, limit: int, only: list[str]) -> Path:
    from gemmrl.kernels import decode_gemm as dg
    from gemmrl.measure.bench import BenchSpec, run_bench
    from gemmrl.problem import read_shapes
    from gemmrl.timing import TimingConfig

    path = out / f"decode_bench_{dtype}.csv"

    def factory(problem):
        cfgs = [dg.DecodeConfig.parse(f"{c}_{dtype}") for c in only] if only else dg.screen_configs(problem, limit=limit)
        return [dg.DecodeCandidate(c) for c in cfgs if dg.valid(c, problem)[0]]

    probs = read_shapes(shapes, dtype=dtype)
    for i, p in enumerate(probs):
        left = deadline - time.time()
        if left < 12:
            print(f"bench: budget spent, {len(probs) - i} shapes of {dtype} left unmeasured", flush=True)
            break
        t = time.time()
        run_bench(BenchSpec((p,), ("graph", "cold"), path, TimingConfig().quick(), extra=(factory,)), progress=False)
        print(f"bench {dtype} {p.mnk} {time.time() - t:.1f}s", flush=True)
    return path


def table(paths: list[Path]) -> str:
    from gemmrl.problem import parse_mnk

    best: dict[tuple, dict] = {}
    for path in paths:
        if not path.exists():
            continue
        for r in csv.DictReader(open(path)):
            if r.get("recheck") or str(r.get("verified")).lower() != "true" or not r.get("time_ms"):
                continue
            key = (r["mnk"], r["dtype"], r["protocol"])
            d = best.setdefault(key, {})
            if r["candidate"] == "vendor_best":
                d["vendor"] = (float(r["time_ms"]) * 1e3, r.get("members", ""))
            elif r["candidate"].startswith("decode:"):
                t = float(r["time_ms"]) * 1e3
                if "decode" not in d or t < d["decode"][0]:
                    d["decode"] = (t, r["candidate"][7:])
    lines = [f"{'mnk':>15} {'dtype':5} {'proto':5} {'floor':>6} {'vendor':>7} {'TB/s':>5} {'decode':>7} {'TB/s':>5} "
             f"{'speedup':>7}  config / vendor path"]
    for (mnk, dtype, proto), d in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][2], parse_mnk(kv[0][0]).N,
                                                                       parse_mnk(kv[0][0]).K, parse_mnk(kv[0][0]).M)):
        p = parse_mnk(mnk, dtype=dtype)
        v, dc = d.get("vendor"), d.get("decode")
        if not v:
            continue
        tb = lambda us: nbytes(p) / (us * 1e-6) / 1e12  # noqa: E731
        dec = f"{dc[0]:7.2f} {tb(dc[0]):5.2f} {v[0] / dc[0]:7.3f}  {dc[1]} / {v[1]}" if dc else f"{'-':>7} {'-':>5} {'-':>7}"
        lines.append(f"{mnk:>15} {dtype:5} {proto:5} {floor_us(p):6.2f} {v[0]:7.2f} {tb(v[0]):5.2f} {dec}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="benchmarks/shapes/decode_models5_m1-32_weights100mb.txt")
    ap.add_argument("--dtype", default="fp16", help="comma list of fp16,bf16")
    ap.add_argument("--battery-dtype", default="fp16,bf16")
    ap.add_argument("--budget-s", type=float, default=150.0, help="wall seconds for everything, bench stops short")
    ap.add_argument("--limit", type=int, default=6, help="screened configs per shape")
    ap.add_argument("--configs", default="", help="comma list of configs (without dtype) instead of the screen")
    ap.add_argument("--skip-battery", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = Path(os.environ.get("GEMMRL_OUT", "/tmp/gemmrl_out"))
    out.mkdir(parents=True, exist_ok=True)
    from gemmrl.kernels import decode_gemm as dg

    dtypes = [d for d in args.dtype.split(",") if d]
    for dt in sorted(set(dtypes) | set(args.battery_dtype.split(","))):
        b = dg.build_dtype(dt)
        print(f"build {dt}: cached={b.cached} {b.seconds}s regs<={b.ptxas.max_registers} "
              f"spills={b.ptxas.spill_store_bytes}", flush=True)
    bad = 0 if args.skip_battery else battery([d for d in args.battery_dtype.split(",") if d], out)
    print(f"battery: {bad} failing ({time.time() - t0:.0f}s)", flush=True)
    paths = [bench(args.shapes, dt, out, t0 + args.budget_s, args.limit, [c for c in args.configs.split(",") if c])
             for dt in dtypes]
    text = table(paths)
    (out / "decode_table.txt").write_text(text + "\n")
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
