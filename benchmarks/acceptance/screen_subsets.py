"""What a set of configs adds to a screen: per protocol, the geomean over shapes of the fastest screened config
against the fastest reference screened beside it (`gemmrl select`'s own references, not every vendor path), with
and without the configs named, and the shapes where one of them was the fastest. A screen is a selection run:
its ratios are optimistic (the winner's curse); a re-measure (`gemmrl bench --cutlass-from`) is what counts.

    python benchmarks/acceptance/screen_subsets.py SCREEN.csv[.gz] --configs CFG[,CFG...] [--md OUT.md]

A config name matches the part of a row's algo before its knobs (e.g. pingpong_64x8x64_c2x4_persistent_tn_fp16_swap).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.results import read_rows  # noqa: E402
from gemmrl.search.screen import selection_table  # noqa: E402
from gemmrl.summary import Stats  # noqa: E402


def compare(rows: list[dict], names: set[str]) -> list[str]:
    def named(algo: str) -> bool:
        return algo.split(":")[0] in names

    every = {(t["protocol"], t["mnk"]): t for t in selection_table(rows)}
    without = {(t["protocol"], t["mnk"]): t for t in selection_table(rows, keep=lambda a: not named(a))}
    lines = ["| protocol | shapes | without them | with them | named config fastest on |", "|---|---:|---:|---:|---:|"]
    per_shape = ["", "| protocol | mnk | reference us (who) | without us | with us | gain | fastest |",
                 "|---|---|---:|---:|---:|---:|---|"]
    for proto in sorted({k[0] for k in every}, reverse=True):
        keys = sorted(k for k in every if k[0] == proto and k in without and every[k]["ref"])
        if not keys:
            continue
        wins = [k for k in keys if named(every[k]["config"])]
        lines.append(f"| {proto} | {len(keys)} | {Stats.of(without[k]['ratio'] for k in keys).geomean:.3f} | "
                     f"{Stats.of(every[k]['ratio'] for k in keys).geomean:.3f} | {len(wins)} |")
        for k in wins:
            e, w = every[k], without[k]
            per_shape.append(f"| {proto} | {k[1]} | {e['ref_ms'] * 1e3:.2f} ({e['ref']}) | {w['best_ms'] * 1e3:.2f} | "
                             f"{e['best_ms'] * 1e3:.2f} | {w['best_ms'] / e['best_ms']:.3f} | {e['config']} |")
    return lines + per_shape


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("screen", nargs="+")
    ap.add_argument("--configs", required=True, help="comma-separated config names (no knobs)")
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    names = {c.strip() for c in args.configs.split(",") if c.strip()}
    rows = read_rows(args.screen)
    seen = {(r.get("algo") or "").split(":")[0] for r in rows}
    missing = sorted(names - seen)
    if missing:
        print(f"screen_subsets: not in the screen: {', '.join(missing)} (check the names: config only, no knobs)",
              file=sys.stderr)
        return 2
    lines = compare(rows, names)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.md:
        Path(args.md).write_text(f"From {', '.join(Path(p).name for p in args.screen)}; configs: "
                                 f"{', '.join(sorted(names))}.\n\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
