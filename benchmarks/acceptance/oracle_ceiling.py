"""How far selection alone can take a library: per shape and protocol, the fastest generated kernel (Triton, CUTLASS,
CUDA source, or gemmrl.mm serving one) ever measured in a bench run that timed every vendor path beside it, as a
speedup over that run's vendor_best, floored at 1 (where nothing generated won, the library serves a vendor path).
The geomean of that over a shape set is an optimistic ceiling for any library built from the kernels measured so
far: each cell takes its luckiest run (the winner's curse counts for it), and no cell pays for a pinned vendor path.

    python benchmarks/acceptance/oracle_ceiling.py [RESULTS.csv[.gz] ...] [--shapes FILE] [--family triton cutlass ...] [--md OUT.md]

Default: every committed H100 result file (benchmarks/results/h100/h100_*.csv*) over CUDA-L2's 1000-shape grid. A file
counts only if it has cuBLASLt autotuned rows (every vendor path was timed; selection screens time two), and only its
first-run rows (no noise-rule rechecks), fp16 with fp32 accumulation, protocols graph and cold.
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.problem import grid, read_shapes  # noqa: E402
from gemmrl.results import ResultsError, read_rows  # noqa: E402
from gemmrl.summary import usable  # noqa: E402
from library_measure import BARS, CLASSES, LABEL, geomean, shape_class  # noqa: E402  (the grid-library bar's bars: grid only)

GENERATED = ("triton", "cutlass", "cuda", "wgmma", "gemmrl")
PROTOCOLS = ("graph", "cold")


def best_ratios(paths: list[str], shapes: set[str], families: tuple[str, ...] = GENERATED, floor: float = 1.0
                ) -> tuple[dict[tuple[str, str], float], int]:
    """(protocol, mnk) -> the best speedup over its run's vendor_best (floored at 1) of a candidate whose name starts
    with one of ``families`` (default: every generated kind, gemmrl.mm included), and how many files counted.
    ``floor=0``: no floor (a family's own best, as the Triton-family and CUTLASS-family bars count it: there no vendor path stands in)."""
    best: dict[tuple[str, str], float] = {}
    used = 0
    for path in paths:
        try:
            rows = read_rows([path])
        except ResultsError:  # another kind of CSV (an adversarial table, a probe's own schema): not bench rows
            continue
        rows = [r for r in rows if usable(r) and r.get("protocol") in PROTOCOLS and r.get("mnk") in shapes
                and r.get("dtype", "fp16") == "fp16" and r.get("acc", "fp32") == "fp32"]
        if not any(r["candidate"].startswith("cublaslt_autotuned") for r in rows):
            continue
        vb = {(r["protocol"], r["mnk"]): float(r["time_ms"]) for r in rows if r["candidate"] == "vendor_best"}
        if not vb:
            continue
        used += 1
        for r in rows:
            key = (r["protocol"], r["mnk"])
            if r["candidate"].startswith(families) and key in vb:
                best[key] = max(best.get(key, floor), vb[key] / float(r["time_ms"]))
    return best, used


def table(best: dict[tuple[str, str], float], shapes: set[str], bars: dict | None = None, floor: float = 1.0
          ) -> list[dict]:
    """Per protocol and class: the ceiling's geomean. Floored, a shape no run timed a generated kernel on counts at
    the floor (a vendor path serves it); not floored, only the shapes with a generated row count."""
    out = []
    for proto in PROTOCOLS:
        if not any(key[0] == proto for key in best):  # no run timed this protocol
            continue
        for cls in CLASSES:
            mnks = [m for m in shapes if cls == "all" or shape_class(m) == cls]
            if not mnks:
                continue
            xs = [best.get((proto, m), floor) for m in mnks if floor or (proto, m) in best]
            out.append({"protocol": proto, "class": LABEL[cls], "shapes": len(mnks),
                        "measured": sum((proto, m) in best for m in mnks),
                        "ceiling": geomean(xs),
                        "above_1": sum(x > 1.0 for x in xs),
                        "bar": (bars or {}).get(proto) if cls == "all" else None})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="*", help="bench result files (default: benchmarks/results/h100/h100_*.csv*)")
    ap.add_argument("--shapes", help="a shapes file (M_N_K per line) instead of the 1000-shape grid")
    ap.add_argument("--family", nargs="+", choices=GENERATED, default=list(GENERATED),
                    help="only these candidates (e.g. triton: the Triton-family bar asks for the Triton family alone; gemmrl rows "
                         "serve any family, so they count only when named)")
    ap.add_argument("--no-floor", action="store_true",
                    help="a family's own best per cell, below 1 too (the Triton-family and CUTLASS-family bars); default floors at 1 (the grid-library bar: "
                         "a library serves a vendor path where nothing generated won)")
    ap.add_argument("--md", help="also write the table here")
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    paths = args.results or sorted(glob.glob(str(root / "benchmarks" / "results" / "h100" / "h100_*.csv*")))
    if args.shapes:
        shapes = {f"{p.M}_{p.N}_{p.K}" for p in read_shapes(args.shapes)}
    else:
        shapes = {f"{p.M}_{p.N}_{p.K}" for p in grid()}
    best, used = best_ratios(paths, shapes, tuple(args.family), 0.0 if args.no_floor else 1.0)
    if not used:
        print("no file with every vendor path (cuBLASLt autotuned rows) and vendor_best over these shapes: pass "
              "`gemmrl bench` result files", file=sys.stderr)
        return 2
    lines = [f"Selection ceiling: the best generated kernel ever measured per shape and protocol, over its run's "
             f"vendor_best, {'not floored' if args.no_floor else 'floored at 1'} (candidates: {', '.join(args.family)}; "
             f"{used} of {len(paths)} files had "
             f"every vendor path; "
             f"`python benchmarks/acceptance/oracle_ceiling.py`).", "",
             "| protocol | class | shapes | with a generated row | ceiling geomean | above 1 | bar |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in table(best, shapes, None if args.shapes else BARS, 0.0 if args.no_floor else 1.0):
        lines.append(f"| {r['protocol']} | {r['class']} | {r['shapes']} | {r['measured']} | {r['ceiling']:.4f} | "
                     f"{r['above_1']} | {r['bar'] or ''} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
