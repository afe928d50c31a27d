"""Print the short table a GPU round ends with: per protocol, every vendor path against vendor_best and
torch, the done-criteria checks of the foundation (battery passes, autotuned vs heuristic under the noise
rule, floor violations), from the rows of one or more results CSVs.

    python scripts/round_table.py RESULTS.csv [...]
"""

from __future__ import annotations

import sys
from collections import Counter

from gemmrl.bench import noise_rule_below
from gemmrl.results import read_rows
from gemmrl.summary import BASELINES, format_summary, repeat_spread, summarize


def main(paths: list[str]) -> int:
    rows = read_rows(paths)
    first = [r for r in rows if str(r.get("rep", "0")) == "0" and not r.get("recheck") and not r.get("members")]
    shapes = sorted({r["mnk"] for r in first})
    print(f"\n{len(shapes)} shapes, {len(rows)} rows, protocols {sorted({r['protocol'] for r in rows})}")
    unver = Counter((r["candidate"], r["reason"][:80]) for r in first if r["verified"] != "true")
    print(f"unverified vendor rows: {sum(v for (c, _), v in unver.items() if c in BASELINES)}")
    for (c, why), n in unver.most_common(8):
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
    imported = sorted({r["candidate"] for r in first if r["candidate"] not in BASELINES})
    names = imported or ["torch", "cublas_tn", "cublaslt_heuristic_tn", "cublaslt_autotuned_tn"]
    print()
    print(format_summary(summarize(rows, names, ("torch", "cublaslt_autotuned", "vendor_best"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
