"""benchmarks/acceptance/retrieval_replay.py: neighbours' winners put before the shipped policy's order, judged by replay."""

import csv
from pathlib import Path

import pytest
from conftest import script_module

ROOT = Path(__file__).resolve().parents[2]
R = ROOT / "benchmarks" / "results" / "h100"
HELD50 = [R / "h100_held50s2_triton-select-top16-explore8-tn-nn_2026-11-23.csv.gz",
          R / "h100_held50s2_cutlass-select_graph-cold_2026-11-23.csv.gz"]
PROBES = [R / "h100_decode_probe12_traffic-probe_triton-select-top4-explore0-pdl-off_18ec62482730_2026-11-26.csv.gz",
          R / "h100_fewtile_probe9_traffic-probe_triton-select-top4-explore0-pdl-off_18ec62482730_2026-11-26.csv.gz"]


def _mod():
    return script_module("retrieval_replay")


def test_retrieved_arms_lead_and_the_policy_row_is_the_pinned_one(tmp_path):
    mod = _mod()
    out = tmp_path / "r.csv"
    assert mod.main(["--test", *map(str, HELD50), "--retrieve", *map(str, PROBES), "--shapes", "1",
                     "--draws", "2", "--out", str(out)]) == 0
    rows = {(r["method"], r["budget"]): r for r in csv.DictReader(open(out))}
    assert {m for m, _ in rows} == {"exhaustive", "policy", "retrieved1+policy", "random"}
    assert int(rows[("policy", "arms:4")]["shapes"]) == 50
    assert int(rows[("policy", "arms:4")]["retrieved_from_shapes"]) == 21   # the two probes' shapes, none held out
    # the shipped policy alone, as tests/search/test_policy.py pins it on these screens
    assert float(rows[("policy", "arms:4")]["share_of_sweep_log_gain"]) == pytest.approx(0.780, abs=0.002)
    for r in rows.values():
        assert 0.0 <= float(r["share_of_sweep_log_gain"]) <= 1.0 + 1e-9


def test_retrieved_first_orders_the_neighbours_winner_first():
    from gemmrl.search.efficiency import keyed_orders
    from gemmrl.search.policy import RLPolicy
    from gemmrl.search.replay import load_tables
    from gemmrl.search.retrieve import read_winners

    mod = _mod()
    tables = load_tables(map(str, HELD50))
    table_w = read_winners([str(R / "h100_decode-grid120_triton-select-top16-explore8-tn-nn_2026-11-22.csv.gz")], 2)
    base = keyed_orders(RLPolicy.load(ROOT / "src" / "gemmrl" / "policies" / "h100.json"))
    table_w = tuple(w for w in table_w if w.mnk not in tables)
    order = mod.retrieved_first(base, table_w, 1)
    hits = 0
    for t in tables.values():
        o = order(t)
        assert sorted(o) == list(range(len(t.arms)))   # a permutation of the arms
        lead = [str(t.arms[i].spec.payload) for i in o[:1] if t.arms[i].spec.family == "triton"]
        near = {str(c) for c, _ in mod.nearest(t.problem, table_w, 1)}
        hits += bool(set(lead) & near)
        if not set(lead) & near:   # no retrieved arm in the screen: the policy's order unchanged
            assert o == base(t)
    assert hits > 0
