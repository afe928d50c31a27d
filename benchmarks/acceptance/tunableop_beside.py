"""gemmrl.mm against torch.matmul with PyTorch's TunableOp on, each measured in its own process (TunableOp changes
torch.matmul process-wide): the ``gemmrl`` rows of a bench run, and the ``torch`` rows of a run made with
``PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=1 gemmrl bench --baselines torch`` on the same shapes
(``gpu_anyshape.sh TUNABLEOP=1`` makes both). Device-time protocols (graph, cold) only: a host-timed figure across two
processes compares two machines' states, not two paths.

    python benchmarks/acceptance/tunableop_beside.py --ours OURS.csv[.gz] --tunableop TUNABLEOP.csv[.gz] [--out OUT.md]

Per protocol: over the shapes both files hold (first runs, verified), the geometric mean of TunableOp's time over
gemmrl.mm's (> 1: gemmrl.mm faster), its minimum, and TunableOp against the vendor_best of the first file. Prints a
short table last; ``--out`` writes it as markdown.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

from gemmrl.results import open_text
from gemmrl.summary import usable

PROTOCOLS = ("graph", "cold")


def first_runs(path: Path, candidates: tuple[str, ...]) -> dict[tuple[str, str], dict[str, float]]:
    """{(protocol, mnk): {candidate: time_ms}} of the usable (verified, timed, first-run) rows of ``candidates`` in a
    results CSV."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    with open_text(path) as fh:
        for r in csv.DictReader(fh):
            if r.get("candidate") in candidates and r.get("protocol") in PROTOCOLS and usable(r):
                out[(r["protocol"], r["mnk"])][r["candidate"]] = float(r["time_ms"])
    return out


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def compare(ours: Path, tunableop: Path) -> list[dict]:
    """One row per protocol: shapes, geomean and min of TunableOp / gemmrl.mm, and of vendor_best / TunableOp."""
    a = first_runs(ours, ("gemmrl", "vendor_best"))
    t = first_runs(tunableop, ("torch",))
    rows = []
    for p in PROTOCOLS:
        keys = sorted(k for k in a if k[0] == p and "gemmrl" in a[k] and "torch" in t.get(k, {}))
        if not keys:
            continue
        over = [t[k]["torch"] / a[k]["gemmrl"] for k in keys]
        vb = [t[k]["torch"] / a[k]["vendor_best"] for k in keys if "vendor_best" in a[k]]
        worst = min(keys, key=lambda k: t[k]["torch"] / a[k]["gemmrl"])
        rows.append({"protocol": p, "shapes": len(keys), "gemmrl_over_tunableop": round(_geo(over), 4),
                     "min": round(min(over), 4), "min_shape": worst[1],
                     "below_1": sum(x < 1.0 for x in over),
                     "vendor_best_over_tunableop": round(_geo(vb), 4) if vb else ""})
    if not rows:
        raise SystemExit(f"tunableop_beside: no shape holds both a verified gemmrl row in {ours.name} and a verified "
                         f"torch row in {tunableop.name} (graph or cold): were both made on the same shape file?")
    return rows


def table(rows: list[dict], ours: Path, tunableop: Path) -> str:
    head = (f"gemmrl.mm (`{ours.name}`) against torch.matmul with TunableOp (`{tunableop.name}`), each in its own "
            "process. A cell: TunableOp's time over the other path's, geometric mean over the shapes (> 1: the other "
            "path faster).\n\n")
    lines = ["| protocol | shapes | gemmrl.mm over TunableOp | min (shape) | below 1.00 | vendor_best over TunableOp |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['protocol']} | {r['shapes']} | {r['gemmrl_over_tunableop']:.3f} | {r['min']:.3f} "
                     f"({r['min_shape']}) | {r['below_1']} | {r['vendor_best_over_tunableop']} |")
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, type=Path, help="a bench CSV with gemmrl and vendor_best rows")
    ap.add_argument("--tunableop", required=True, type=Path, help="a bench CSV of torch rows made with TunableOp on")
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = ap.parse_args(argv)
    for p in (args.ours, args.tunableop):
        if not p.is_file():
            print(f"tunableop_beside: {p} does not exist; pass the CSVs gpu_anyshape.sh TUNABLEOP=1 wrote",
                  file=sys.stderr)
            return 2
    text = table(compare(args.ours, args.tunableop), args.ours, args.tunableop)
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
