"""The vendor baselines (the seven vendor paths against each other, their host cost per call, repeatability, CUDA-L2's
imported kernels through the battery) from committed result CSVs, written between a document's
``<!-- results:begin -->`` and ``<!-- results:end -->`` markers (docs/findings.md's "Vendor baselines"; never
hand-entered numbers).

    python benchmarks/acceptance/vendor_baselines_table.py benchmarks/results/h100/h100_grid60s0_graph-cold-offline-confirmed-autotune_2026-11-22.csv.gz \
        --host-cost benchmarks/results/h100/h100_host-cost-nvmath_2026-11-22.csv \
        --repeat benchmarks/results/h100/h100_grid12s7-graph-repeat2-run5-10ms-replays_2026-11-22.csv \
        --imports benchmarks/results/h100/h100_cuda-l2-h100-25_graph-cold-offline_2026-11-22.csv \
        --readme docs/findings.md
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from pathlib import Path

from gemmrl.measure.bench import noise_rule_below
from gemmrl.results import read_rows
from gemmrl.summary import BASELINES, markdown_summary, repeat_spread, summarize

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def section(paths: list[str], host_cost: str | None, repeat: str | None = None, imports: str | None = None) -> str:
    rows = read_rows(paths)
    first = [r for r in rows if str(r.get("rep", "0")) == "0" and not r.get("recheck") and not r.get("members")]
    meta = first[0]
    shapes = sorted({r["mnk"] for r in first})
    unverified = sum(1 for r in first if r["candidate"] in BASELINES and r["verified"] != "true")
    below = sum(1 for r in first if r.get("floor_ok") == "false")
    slower = noise_rule_below(rows, "cublaslt_autotuned", "cublaslt_heuristic")
    shas = ", ".join(sorted({r["git_sha"] for r in first}))
    out = [f"Run: `{' '.join(Path(p).name for p in paths)}` on {meta['gpu']} (driver {meta['driver']}, CUDA "
           f"{meta['cuda']}, torch {meta['torch']}, git {shas}), {len(shapes)} grid shapes "
           "(`gemmrl bench --grid cuda-l2 --sample 60 --seed 0 --protocol graph,cold,offline`).",
           "",
           f"- vendor rows that failed the correctness battery: {unverified}; rows under 0.95x the roofline floor: {below}",
           f"- (shape, protocol) where `cublaslt_autotuned` stays slower than `cublaslt_heuristic` after 3 "
           f"re-measurements (noise rule): {len(slower)}",
           "",
           "Each vendor path against the fastest of all seven (`vendor_best`), per-shape speedup statistics:",
           "",
           markdown_summary(summarize(rows, list(BASELINES), ("vendor_best",)))]
    if repeat:
        sp = repeat_spread(read_rows([repeat]))
        out += [f"Repeatability (`{Path(repeat).name}`, 12 grid shapes x 7 vendor paths measured twice in `graph`, "
                f"`--sample 12 --seed 7 --repeat 2`): |t2/t1 - 1| median {sp.median:.2%}, p90 {sp.p90:.2%}, "
                f"max {sp.max:.2%} ({sp.worst[0]}, {sp.worst[1]}).", ""]
    if imports:
        out += _imports(imports)
    if host_cost:
        with open(host_cost, newline="") as fh:
            hc = list(csv.DictReader(fh))
        paths_ = sorted({r["path"] for r in hc})
        out += ["Host cost of one call (median over 2000 calls, us; `call` returns without waiting, `call+sync` is "
                "what CUDA-L2's offline mode times):", "", "| path | call | call+sync | shapes |", "|---|---:|---:|---:|"]
        for p in paths_:
            xs = [r for r in hc if r["path"] == p and r["call_us_median"] not in ("", "nan")]
            if xs:
                out.append(f"| {p} | {statistics.median(float(r['call_us_median']) for r in xs):.1f} | "
                           f"{statistics.median(float(r['call_sync_us_median']) for r in xs):.1f} | {len(xs)} |")
        out.append("")
    return "\n".join(out)


def _imports(path: str) -> list[str]:
    """CUDA-L2-style imported kernels: the battery's verdicts and, for those that passed, speed vs vendor_best."""
    rows = read_rows([path])
    first = [r for r in rows if str(r.get("rep", "0")) == "0" and not r.get("recheck") and not r.get("members")]
    imp = {}
    for r in first:
        if r["candidate"].startswith("import:"):
            imp.setdefault(r["mnk"], r)  # the battery runs once per shape: the same verdict in every protocol
    passed = sorted(m for m, r in imp.items() if r["verified"] == "true" or "not capturable" in r.get("reason", ""))
    failed = {m: r["reason"].split(":")[0] for m, r in imp.items() if m not in passed}
    why: dict[str, list[str]] = {}
    for m, k in sorted(failed.items()):
        why.setdefault(k, []).append(m)
    names = sorted({r["candidate"] for r in first if r["candidate"].startswith("import:")})
    out = [f"Imported kernels (`{Path(path).name}`, `gemmrl bench --kernel-dir ... --protocol graph,cold,offline`): "
           f"{len(passed)} of {len(imp)} passed the battery; rejected: "
           + "; ".join(f"{k} {len(v)} ({', '.join(v)})" for k, v in why.items()) + ".", ""]
    out.append(markdown_summary(summarize(rows, names, ("vendor_best",))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--host-cost")
    ap.add_argument("--repeat", help="a --repeat 2 graph CSV: repeatability line")
    ap.add_argument("--imports", help="a --kernel-dir CSV: the imported kernels' verdicts and speed")
    ap.add_argument("--readme", default="docs/findings.md", help="the markdown file holding the markers")
    args = ap.parse_args()
    text = Path(args.readme).read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.readme} has no {BEGIN} ... {END} markers")
    new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda m: f"{BEGIN}\n{section(args.csv, args.host_cost, args.repeat, args.imports)}\n{END}",
                 text, flags=re.S)
    Path(args.readme).write_text(new)


if __name__ == "__main__":
    main()
