"""benchmarks/acceptance/fresh_inputs_cost.py's summary: the bias is fresh / fixed per shape and path (geometric mean), the added
time the ratio of the two modes' wall time; paths that failed are left out of both."""

from __future__ import annotations

import math

from conftest import script_module


def _rows():
    rows = []
    for mnk, ratio in (("64_64_64", 1.01), ("4096_4096_4096", 0.99)):
        for cand in ("cublas_nn", "cublaslt_heuristic_tn"):
            for rep in range(2):
                for mode, t, wall in (("fresh", ratio, 1.1), ("fixed", 1.0, 1.0)):
                    rows.append({"mnk": mnk, "protocol": "graph", "candidate": cand, "mode": mode, "rep": rep,
                                 "time_ms": t, "ok": True, "wall_s": wall})
    rows.append({"mnk": "64_64_64", "protocol": "graph", "candidate": "broken", "mode": "fresh", "rep": 0,
                 "time_ms": math.inf, "ok": False, "wall_s": 1.1})
    return rows


def test_bias_and_added_time():
    F = script_module("fresh_inputs_cost")
    s = F.summarize(_rows())
    ratios = sorted(r for *_, r in s["graph"]["ratios"])
    assert len(ratios) == 4 and math.isclose(ratios[0], 0.99) and math.isclose(ratios[-1], 1.01)
    walls = s["graph"]["wall"]
    assert math.isclose(walls["64_64_64"]["fresh"] / walls["64_64_64"]["fixed"], 1.1)
    table = F.table(_rows())
    last = table.splitlines()[-1]
    assert last.startswith("| graph | 2 | 4 | 0.9999 |") and last.endswith("| 1.100 |")
