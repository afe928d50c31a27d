"""Which shapes of a CUTLASS/Triton screen are worth a re-measure: those where the screen's fastest config came
within ``--min`` of vendor_best as an earlier pass measured it (`gemmrl bench` rows with every vendor path), in any
protocol. The screen's own references (cuBLAS, cuBLASLt heuristic) miss cuBLASLt autotuned, so a screen's ratio
over them is optimistic; the earlier pass's vendor_best is the sharper bar (the CUTLASS vendor-cells run: at 0.98 it kept every cell
that went on to win in the re-measures of the K 64-128 and K 256-512 screens, and half the cells).

    python benchmarks/acceptance/screen_ahead.py SCREEN.csv[.gz] --against PASS.csv[.gz] ... [--min 0.98] --out SHAPES.txt

Later --against files override earlier ones cell by cell (a pass and the re-measures spliced over it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.results import read_rows  # noqa: E402
from gemmrl.search.screen import selection_table  # noqa: E402


def vendor_best(paths: list[str]) -> dict[tuple[str, str], float]:
    """(protocol, mnk) -> vendor_best's first-run time (ms), the last file naming a cell winning."""
    out: dict[tuple[str, str], float] = {}
    for path in paths:
        for r in read_rows([path]):
            if r.get("candidate") == "vendor_best" and not r.get("recheck") and r.get("time_ms"):
                out[(r["protocol"], r["mnk"])] = float(r["time_ms"])
    return out


def ahead(screen_rows: list[dict], vb: dict[tuple[str, str], float], floor: float) -> tuple[list[str], int, int]:
    """(shapes kept in screen order, cells judged, cells without an earlier vendor_best)."""
    kept: list[str] = []
    judged = missing = 0
    for t in selection_table(screen_rows):
        ref = vb.get((t["protocol"], t["mnk"]))
        if ref is None:
            missing += 1
            continue
        judged += 1
        if ref / t["best_ms"] >= floor and t["mnk"] not in kept:
            kept.append(t["mnk"])
    return kept, judged, missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("screen", nargs="+")
    ap.add_argument("--against", nargs="+", required=True, help="an earlier pass's rows with vendor_best")
    ap.add_argument("--min", type=float, default=0.98, help="keep a shape whose screen best is at least this "
                    "fraction of the earlier vendor_best's speed in some protocol (default 0.98)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    vb = vendor_best(args.against)
    if not vb:
        print(f"--against: no vendor_best rows in {' '.join(args.against)}", file=sys.stderr)
        return 2
    kept, judged, missing = ahead(read_rows(args.screen), vb, args.min)
    if not judged:
        print("no screened cell has an earlier vendor_best: are the --against files of the same shapes?", file=sys.stderr)
        return 2
    Path(args.out).write_text("".join(m + "\n" for m in kept))
    print(f"{len(kept)} shapes kept (screen best >= {args.min} of the earlier vendor_best in some protocol); "
          f"{judged} cells judged, {missing} without an earlier vendor_best -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
