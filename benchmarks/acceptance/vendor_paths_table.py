"""Print the short table a GPU acceptance run (gpu_run.sh) ends with: per protocol, every vendor path against vendor_best and
torch, the done-criteria checks of the foundation (battery passes, autotuned vs heuristic under the noise
rule, floor violations), from the rows of one or more results CSVs. Where ``triton:*`` candidates were measured
(``gemmrl bench --triton-top K``), they are summarized as one line per protocol: the best Triton config per
shape against vendor_best, instead of a line per config.

    python benchmarks/acceptance/vendor_paths_table.py RESULTS.csv [...]
"""

from __future__ import annotations

import sys
from collections import Counter

from gemmrl.measure.bench import noise_rule_below
from gemmrl.results import read_rows
from gemmrl.summary import BASELINES, Stats, best_of, format_summary, repeat_spread, speed, summarize, usable

TRITON = "triton:"


def triton_best_lines(rows: list[dict]) -> list[str]:
    """Per protocol: best triton:* row per shape over vendor_best (ratio of TFLOPS, > 1 = Triton faster)."""
    best = best_of(rows, TRITON)
    if not best:
        return []
    vendor = {(r["protocol"], r["mnk"]): r for r in rows if usable(r) and r["candidate"] == "vendor_best"}
    lines = ["best triton:* config per shape / vendor_best (selected and measured in this one run: winner's curse, "
             "biased upward; an unbiased number re-measures the picked configs in a second run, not done yet)",
             f"  {'protocol':8} {'n':>4} {'geomean':>8} {'median':>7} {'min':>6} {'<1.0':>5}  winning variants"]
    for proto in sorted({p for p, _ in best}):
        keys = [k for k in best if k[0] == proto and k in vendor]
        s = Stats.of(speed(best[k]) / speed(vendor[k]) for k in keys)
        wins = Counter(best[k]["candidate"][len(TRITON):].split("(")[0] for k in keys)
        lines.append(f"  {proto:8} {s.n:>4} {s.geomean:8.3f} {s.median:7.3f} {s.min:6.3f} {s.share_below:5.2f}  "
                     + ", ".join(f"{v} {n}" for v, n in wins.most_common()))
    return lines


def triton_selected_lines(rows: list[dict]) -> list[str]:
    """Per protocol: the config selected in that protocol by an earlier run (``--triton-from``), re-measured
    here, over vendor_best: the unbiased number."""
    from gemmrl.search.selection import selected_for

    vendor = {(r["protocol"], r["mnk"]): r for r in rows if usable(r) and r["candidate"] == "vendor_best"}
    sel = {(r["protocol"], r["mnk"]): r for r in rows
           if usable(r) and not r.get("members") and selected_for(r["candidate"], r["protocol"])}
    if not sel:
        return []
    lines = ["selected triton config (chosen in an earlier run, --triton-from) re-measured here / vendor_best",
             f"  {'protocol':8} {'n':>4} {'geomean':>8} {'median':>7} {'min':>6} {'<1.0':>5}  variants"]
    for proto in sorted({p for p, _ in sel}):
        keys = [k for k in sel if k[0] == proto and k in vendor]
        s = Stats.of(speed(sel[k]) / speed(vendor[k]) for k in keys)
        wins = Counter(str(sel[k].get("algo", "")).split("(")[0] for k in keys)
        lines.append(f"  {proto:8} {s.n:>4} {s.geomean:8.3f} {s.median:7.3f} {s.min:6.3f} {s.share_below:5.2f}  "
                     + ", ".join(f"{v} {n}" for v, n in wins.most_common()))
    return lines


def main(paths: list[str]) -> int:
    rows = read_rows(paths)
    first = [r for r in rows if str(r.get("rep", "0")) == "0" and not r.get("recheck") and not r.get("members")]
    shapes = sorted({r["mnk"] for r in first})
    print(f"\n{len(shapes)} shapes, {len(rows)} rows, protocols {sorted({r['protocol'] for r in rows})}")
    unver = Counter((r["candidate"], r["reason"][:80]) for r in first if r["verified"] != "true")
    print(f"unverified vendor rows: {sum(v for (c, _), v in unver.items() if c in BASELINES)}")
    for (c, why), n in Counter({k: v for k, v in unver.items() if not k[0].startswith(TRITON)}).most_common(8):
        print(f"  {n:3d} x {c}: {why}")
    below = [r for r in first if r.get("floor_ok") == "false"]
    print(f"rows under 0.95 x floor: {len(below)}")
    for r in below[:5]:
        print(f"  {r['mnk']} {r['protocol']} {r['candidate']} {r['time_ms']} ms, floor {r['floor_ms']} ms")
    bad = noise_rule_below(rows, "cublaslt_autotuned", "cublaslt_heuristic")
    print(f"cublaslt_autotuned slower than cublaslt_heuristic after 3 rechecks (noise rule): {len(bad)} {bad[:8]}")
    for proto in sorted({r["protocol"] for r in rows if str(r.get("rep", "0") or "0") != "0"}):
        sp = repeat_spread(rows, proto)
        print(f"repeat spread ({proto}, {sp.n} pairs): median {sp.median:.2%}, p90 {sp.p90:.2%}, "
              f"max {sp.max:.2%} at {sp.worst}")
    imported = sorted({r["candidate"] for r in first if r["candidate"] not in BASELINES
                       and not r["candidate"].startswith(TRITON)})
    n_triton = len({r["candidate"] for r in first if r["candidate"].startswith(TRITON)})
    if n_triton:
        print(f"\n{n_triton} triton:* candidates (by config; left out of the per-candidate table below)")
        why = Counter(r["reason"].split(":")[0][:40] for r in first
                      if r["candidate"].startswith(TRITON) and r["verified"] != "true")
        print(f"unverified triton:* rows: {sum(why.values())}"
              + "".join(f"; {n} x {w}" for w, n in why.most_common(4)))
        for line in triton_best_lines(rows):
            print(line)
    for line in triton_selected_lines(rows):
        print(line)
    names = imported or ["torch", "cublas_tn", "cublaslt_heuristic_tn", "cublaslt_autotuned_tn"]
    print()
    print(format_summary(summarize(rows, names, ("torch", "cublaslt_autotuned", "vendor_best"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
