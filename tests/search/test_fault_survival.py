"""Fault survival: a tuning run with planted faults through the real sandbox executor finishes, records every
fault with its class and loses no good result; kill -9 of the tuner mid-run, then resume, loses nothing. The runs
go through ``benchmarks/acceptance/fault_survival.py``'s ``main`` (the Triton interpreter on the CPU tier, ``-m gpu`` on the GPU);
the plan, the proposer and the tally (``gemmrl.search.faults``) are tested on their own too, bars included."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.library import TrialsStore
from gemmrl.problem import GemmProblem
from gemmrl.search import faults
from gemmrl.search.loop import payload_text
from gemmrl.search.proposer import Context, spec_key
from conftest import script_module

TINY = "16_16_16,17_19_23"   # under the interpreter a group of 4 takes ~2-5 s here; 33_65_129 ~10 s


def _script():
    return script_module("fault_survival")


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _good(problem, n):
    return [CandidateSpec("triton", f"tiled(BM=16,BN=16,BK=16,warps={w},stages=2,group_m=1)", layout="nn")
            for w in range(1, n + 1)]


def test_plan_is_seeded_even_and_unique_per_shape():
    shapes = [GemmProblem(16, 16, 16), GemmProblem(17, 19, 23)]
    plan = faults.make_plan(shapes, 40, 0.25, 3, 4, "cpu", _good)
    again = faults.make_plan(shapes, 40, 0.25, 3, 4, "cpu", _good)
    assert [(p.index, p.kind, p.key) for p in plan] == [(p.index, p.kind, p.key) for p in again]
    other = faults.make_plan(shapes, 40, 0.25, 4, 4, "cpu", _good)
    assert [p.kind for p in plan] != [p.kind for p in other]            # the seed moves the faults
    kinds = [p.kind for p in plan if p.kind != "good"]
    assert len(kinds) == 10 and {kinds.count(k) for k in faults.CPU_EXPECTED} == {2}
    assert len({(p.problem.mnk, p.key) for p in plan}) == 40             # two faults of a kind at a shape differ
    assert [p.problem.mnk for p in plan[:8]] == ["16_16_16"] * 4 + ["17_19_23"] * 4
    assert all(p.expected == ("ok" if p.kind == "good" else faults.CPU_EXPECTED[p.kind]) for p in plan)
    assert [faults.Planned.from_dict(json.loads(json.dumps(p.to_dict()))) for p in plan] == plan


def test_the_proposer_hands_out_what_has_no_outcome_yet():
    from gemmrl.search.proposer import Outcome, Proposal

    plan = faults.make_plan([GemmProblem(16, 16, 16)], 8, 0.25, 0, 4, "cpu", _good)
    prop = faults.PlanProposer(plan)
    first = prop.propose(Context(plan[0].problem), 4)
    assert [p.key for p in first] == [p.key for p in plan[:4]]
    done = tuple(Outcome(plan[0].problem, pr, "ok") for pr in first[:3])
    assert [p.key for p in prop.propose(Context(plan[0].problem, own=done), 4)] == [p.key for p in plan[3:7]]
    assert prop.propose(Context(GemmProblem(8, 8, 8)), 4) == []
    assert isinstance(first[0], Proposal) and first[0].info == plan[0].kind


def test_planted_cuda_faults_are_distinct_candidates():
    """The planted CUDA sources share one code and differ in -D flags: each must still be its own candidate."""
    from gemmrl.adversarial.planted_cuda import PLANTED, planted_source

    keys = {spec_key(CandidateSpec("cuda", planted_source(k))) for k in PLANTED}
    assert len(keys) == len(PLANTED)
    assert len({spec_key(faults.fault_spec(k, "cuda", v)) for k in faults.CUDA_KINDS for v in (0, 1)}) == 12


def test_tally_fails_each_bar(tmp_path):
    plan = faults.make_plan([GemmProblem(16, 16, 16)], 8, 0.25, 0, 4, "cpu", _good)
    store = TrialsStore(tmp_path / "t.sqlite")

    def rows(verdicts):
        return [dict(gpu="cpu", mnk=p.problem.mnk, dtype="fp16", acc="fp32", key=p.key, run="r", proposer="planted",
                     family=p.spec.family, layout=p.spec.layout, payload=payload_text(p.spec), name=p.spec.label(),
                     verdict=v, reward=None, record=json.dumps({"reason": "x", "group": "g"}), gpu_s=1.0, worker="w",
                     ts="t") for p, v in zip(plan, verdicts)]

    right = [p.expected for p in plan]
    store.add_outcomes(rows(right[:7]), [], "s")
    summary, per, failed = faults.tally(store, "cpu", "r", plan)
    assert summary["stored"] == 7 and summary["missing"] == 1 and len(failed) >= 1 and "1 missing" in failed[0]
    store.add_outcomes(rows(right)[7:], [], "s")
    summary, per, failed = faults.tally(store, "cpu", "r", plan)
    assert failed == [] and summary["good_ok"] == 6 and summary["faults_as_expected"] == 2 and len(per) == 8
    wrong = [("error" if p.kind != "good" else "rejected" if p.index == 0 else "ok") for p in plan]
    store2 = TrialsStore(tmp_path / "t2.sqlite")
    store2.add_outcomes(rows(wrong), [], "s")
    summary, _, failed = faults.tally(store2, "cpu", "r", plan)
    assert summary["good_ok"] == 5 and summary["faults_as_expected"] == 0 and len(failed) == 2


@pytest.mark.interpreter
def test_fault_survival_run_records_every_fault(tmp_path):
    """20 candidates, 2 planted faults (a segfault and a hang) among good Triton configs, in sandboxed workers."""
    out = tmp_path / "out"
    rc = _script().main(["--device", "cpu", "--n", "20", "--fault-frac", "0.1", "--faults", "crash,hang",
                         "--shapes", TINY, "--timeout-s", "15", "--seed", "0", "--out", str(out)])
    (s,) = _read(out / "fault_survival_summary.csv")
    per = _read(out / "fault_survival_candidates.csv")
    assert rc == 0 and s["passed"] == "True", s
    assert (s["planned"], s["stored"], s["distinct"], s["duplicates"], s["missing"]) == ("20", "20", "20", "0", "0")
    assert (s["good"], s["good_ok"], s["faults"], s["faults_as_expected"]) == ("18", "18", "2", "2")
    assert sorted((r["kind"], r["verdict"]) for r in per if r["kind"] != "good") == [("crash", "crash"),
                                                                                        ("hang", "timeout")]
    outs = TrialsStore(out / "trials.sqlite").outcomes(run="fault-survival")   # counted again, here
    assert len(outs) == 20 and len({(o["mnk"], o["key"]) for o in outs}) == 20
    assert sum(o["verdict"] == "ok" for o in outs) == 18


@pytest.mark.interpreter
def test_kill_9_mid_run_then_resume_loses_nothing_with_faults(tmp_path):
    out = tmp_path / "out"
    rc = _script().main(["--device", "cpu", "--n", "20", "--fault-frac", "0.1", "--faults", "crash,load_error",
                         "--shapes", TINY, "--timeout-s", "15", "--kill-after", "8", "--out", str(out)])
    (s,) = _read(out / "fault_survival_summary.csv")
    assert rc == 0 and s["passed"] == "True", s
    assert 8 <= int(s["outcomes_before_kill"]) < 20 and s["outcomes_after_resume"] == "20"
    assert (s["stored"], s["distinct"], s["duplicates"], s["good_ok"], s["faults_as_expected"]) == \
        ("20", "20", "0", "18", "2")
    outs = TrialsStore(out / "trials.sqlite").outcomes(run="fault-survival")
    assert len(outs) == 20 and len({(o["mnk"], o["key"]) for o in outs}) == 20
    assert len({json.loads(o["record"])["group"] for o in outs}) == 5      # every group stored whole, once


@pytest.mark.gpu
def test_fault_survival_on_the_gpu(tmp_path):
    """An illegal address and a huge cudaMalloc among 6 good Triton configs, through PrebuildExecutor and the sandbox
    on the GPU (about 30 s on an H100 with warm caches; the full run is benchmarks/acceptance/fault_survival.py --device cuda)."""
    out = tmp_path / "out"
    rc = _script().main(["--device", "cuda", "--n", "8", "--fault-frac", "0.25", "--faults",
                         "illegal_address,huge_malloc", "--shapes", "1024_1024_1024", "--out", str(out)])
    (s,) = _read(out / "fault_survival_summary.csv")
    assert rc == 0 and s["passed"] == "True", s
    assert (s["stored"], s["good_ok"], s["faults_as_expected"]) == ("8", "6", "2")
    per = _read(out / "fault_survival_candidates.csv")
    assert sorted(r["verdict"] for r in per if r["kind"] != "good") == ["cuda_fault", "oom"]
