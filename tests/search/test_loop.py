"""The tuning loop (search/loop.py) with its executors and the trials store: against the analytic cost model (no GPU),
the measured-screen replay, the Triton interpreter in-process and in sandboxed workers; resume, budgets, kill -9."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.library import TrialsStore
from gemmrl.models import MODELS, model_shapes
from gemmrl.problem import GemmProblem
from gemmrl.search.executor import InlineExecutor, ModelExecutor, RequestTemplate, SandboxExecutor
from gemmrl.search.loop import Tuner, TuneSpec, payload_from, payload_text
from gemmrl.search.policy import RLPolicy, candidate_set
from gemmrl.search.proposer import Proposal
from gemmrl.timing import TimingConfig
from conftest import script_module

SMALL = partial(candidate_set, top=8, explore=4)
SHAPES = [GemmProblem(*s) for s in [(64, 4096, 4096), (128, 256, 64), (1, 4096, 4096), (33, 65, 129)]]
ROOT = Path(__file__).resolve().parents[2]


class Fixed:
    """A proposer of a fixed list, in order (for paths the policy would not take)."""

    name = "fixed"

    def __init__(self, specs):
        self.specs = list(specs)
        self.updates = []

    def propose(self, ctx, k, rng=None):
        tried = ctx.tried()
        return [p for p in (Proposal(s, "fixed") for s in self.specs) if p.key not in tried][:k]

    def update(self, ctx, outcomes):
        self.updates.append((ctx.problem.mnk, [o.verdict for o in outcomes]))


def _tuner(store, rounds=2, group=4, run="t", **kw):
    return Tuner(TuneSpec(tuple(SHAPES), group=group, rounds=rounds, run=run, gpu="model", **kw),
                 [RLPolicy(candidates=SMALL)], ModelExecutor(), store, progress=False)


def test_every_outcome_is_stored_once_and_resume_does_nothing_twice(tmp_path):
    store = TrialsStore(tmp_path / "trials.sqlite")
    rep = _tuner(store).run()
    assert rep.groups == 8 and rep.evaluated == 32 and rep.stopped == "done"
    outs = store.outcomes(gpu="model")
    assert len(outs) == 32 and len({(o["mnk"], o["key"]) for o in outs}) == 32
    assert _tuner(store).pending() == []                        # what a resumed `gemmrl tune` warms and precompiles
    assert _tuner(store).run().groups == 0                      # resumed: nothing left
    assert _tuner(store, rounds=3).pending() == list(SHAPES)
    rep3 = _tuner(store, rounds=3).run()                        # one more round per shape
    assert rep3.groups == 4 and len(store.outcomes(gpu="model")) == 48
    assert set(rep3.best) == {p.mnk for p in SHAPES} and all(v > 0 for v in rep3.best.values())


def test_each_dtype_of_a_shape_is_tuned_resumed_and_reported_on_its_own(tmp_path):
    """`gemmrl tune --model X --dtypes fp16,bf16`: the same M_N_K in two dtypes is two problems. Each gets its own
    rounds, its own outcomes as context, its own entry in the report, and a resume counts each apart (the loop once
    keyed everything by M_N_K: fp16 got two groups, bf16 one, and a resume dropped fp16's outcomes)."""
    from gemmrl.search.loop import shape_key

    probs = tuple(p.with_(dtype=d) for p in SHAPES[:2] for d in ("fp16", "bf16"))
    store = TrialsStore(tmp_path / "t.sqlite")

    def tuner(rounds):
        return Tuner(TuneSpec(probs, group=2, rounds=rounds, run="d", gpu="model"),
                     [RLPolicy(candidates=SMALL)], ModelExecutor(), store, progress=False)

    rep = tuner(2).run()
    assert rep.groups == 2 * len(probs) and set(rep.best) == {shape_key(p) for p in probs}
    assert {shape_key(p) for p in probs} >= {SHAPES[0].mnk, f"{SHAPES[0].mnk}:bf16:fp32"}
    groups = {}
    for o in store.outcomes(gpu="model", run="d"):
        groups.setdefault((o["mnk"], o["dtype"]), set()).add(json.loads(o["record"])["group"])
    assert {k: len(v) for k, v in groups.items()} == {(p.mnk, p.dtype): 2 for p in probs}
    assert tuner(2).pending() == [] and tuner(3).pending() == list(probs)
    t = tuner(3)
    for p in probs:   # a resume gives each problem its own outcomes as context, never the other dtype's
        own = t.context(p).own
        assert len(own) == 4 and {o.problem.dtype for o in own} == {p.dtype}
        assert all(o.problem.dtype == p.dtype for o in t.context(p).neighbours)


def test_more_rounds_only_where_the_vendor_still_wins(tmp_path):
    """--more-below: a shape's later groups only while its best speedup is under the threshold; a resumed run
    agrees (pending) with what the first run stopped at."""
    store = TrialsStore(tmp_path / "t.sqlite")
    first = _tuner(store, rounds=1, run="r").run()                      # one group each: the bests to split on
    cut = sorted(first.best.values())[len(SHAPES) // 2]                 # about half the shapes below it
    below = {m for m, v in first.best.items() if v < cut}
    assert 0 < len(below) < len(SHAPES)
    t = _tuner(store, rounds=3, run="r", more_below=cut)
    assert {p.mnk for p in t.pending()} == below                        # the rest already reach the threshold
    rep = t.run()
    groups = {}
    for o in store.outcomes(gpu="model", run="r"):
        groups.setdefault(o["mnk"], set()).add(json.loads(o["record"])["group"])
    for p in SHAPES:
        n = len(groups[p.mnk])
        assert n == 1 if p.mnk not in below else 2 <= n <= 3
    assert rep.groups == sum(len(g) for g in groups.values()) - len(SHAPES)
    assert all(v >= cut or len(groups[m]) == 3 for m, v in rep.best.items())   # stopped early only when it got there
    assert _tuner(store, rounds=3, run="r", more_below=cut).pending() == []
    # no threshold (the default): every shape gets every round
    assert len(_tuner(store, rounds=2, run="all").run().best) == len(SHAPES)
    assert len({json.loads(o["record"])["group"] for o in store.outcomes(gpu="model", run="all")}) == 2 * len(SHAPES)


def test_the_policy_learns_in_the_loop(tmp_path):
    store = TrialsStore(tmp_path / "t.sqlite")
    pol = RLPolicy(candidates=SMALL)
    theta0 = pol.state.theta.copy()
    Tuner(TuneSpec(tuple(SHAPES), group=4, rounds=2, run="x", gpu="model"), [pol], ModelExecutor(), store,
          progress=False).run()
    assert pol.state.updates == 8 and not (pol.state.theta == theta0).all()


def test_gpu_budget_stops_proposing(tmp_path):
    store = TrialsStore(tmp_path / "t.sqlite")
    rep = _tuner(store, rounds=5, budget_gpu_s=1e-9).run()
    assert rep.stopped == "gpu budget" and rep.groups == 1
    # a run cut off after its first shape's only round: resumed, it has the other shapes left
    cut = _tuner(store, rounds=1, run="cut", budget_gpu_s=1e-9)
    assert cut.run().groups == 1 and _tuner(store, rounds=1, run="cut").pending() == list(SHAPES[1:])


class Timed(ModelExecutor):
    """The cost model's executor on a stand-in wall clock: each group takes ``took(problem)`` seconds."""

    def __init__(self, took):
        super().__init__()
        self.took, self.now, self.started = took, 0.0, []

    def submit(self, problem, specs):
        self.started.append(problem.mnk)
        self.now += self.took(problem)
        return super().submit(problem, specs)


@pytest.mark.parametrize("budget, started", [
    (25.0, ["1_128256_4096", "16_128256_4096", "1_4096_4096"]),         # M = 64 of the head would end at 30 s
    (30.0, ["1_128256_4096", "16_128256_4096", "64_128256_4096"]),      # it ends at 30: on time; then no time left
    (5.0, ["1_128256_4096"]),                                           # nothing known of the head: it starts
])
def test_a_group_expected_to_end_past_the_wall_budget_is_not_started(tmp_path, budget, started):
    """A group starts only if the longest earlier group at its N, K with no larger M fits in the wall budget left;
    shapes with nothing known of them still start while there is time."""
    probs = tuple(GemmProblem(m, 128256, 4096) for m in (1, 16, 64)) + (GemmProblem(1, 4096, 4096),)
    ex = Timed(lambda p: 10.0 if p.N == 128256 else 3.0)
    t = Tuner(TuneSpec(probs, group=2, rounds=1, run="w", gpu="model", budget_wall_s=budget),
              [RLPolicy(candidates=SMALL)], ex, TrialsStore(tmp_path / "t.sqlite"), progress=False)
    t.clock = lambda: ex.now
    rep = t.run()
    assert ex.started == started and rep.groups == len(started) and rep.stopped == "wall budget"


def test_group_estimate_is_the_longest_at_the_same_weight_and_no_larger_m():
    from gemmrl.search.loop import group_estimate_s

    took = [(GemmProblem(1, 4096, 4096), 2.0), (GemmProblem(64, 4096, 4096), 5.0), (GemmProblem(16, 4096, 4096), 3.0),
            (GemmProblem(1, 4096, 4096, dtype="bf16"), 9.0), (GemmProblem(1, 4096, 1024), 7.0)]
    assert group_estimate_s(GemmProblem(32, 4096, 4096), took) == 3.0
    assert group_estimate_s(GemmProblem(4096, 4096, 4096), took) == 5.0
    assert group_estimate_s(GemmProblem(1, 8192, 4096), took) == 0.0
    assert group_estimate_s(GemmProblem(8, 4096, 4096, dtype="bf16"), took) == 9.0


def test_failures_are_recorded_and_the_loop_goes_on(tmp_path):
    store = TrialsStore(tmp_path / "t.sqlite")
    bad = CandidateSpec("triton", "tiled(BM=256,BN=256,BK=128,warps=2,stages=5,group_m=1)")   # invalid: too much smem
    src = CandidateSpec("cuda", "not a config")
    good = CandidateSpec("triton", "tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)")
    fx = Fixed([bad, src, good])
    rep = Tuner(TuneSpec((GemmProblem(256, 256, 256),), group=3, rounds=1, run="f", gpu="model"), [fx],
                ModelExecutor(), store, progress=False).run()
    assert rep.failures == {"build": 1, "error": 1}
    verdicts = sorted(o["verdict"] for o in store.outcomes())
    assert verdicts == ["build", "error", "ok"]
    assert fx.updates == [("256_256_256", ["build", "error", "ok"])]


def test_context_carries_own_and_neighbour_outcomes(tmp_path):
    store = TrialsStore(tmp_path / "t.sqlite")
    _tuner(store, rounds=1).run()
    t = _tuner(store, rounds=1)
    ctx = t.context(SHAPES[0])
    assert len(ctx.own) == 4 and len(ctx.neighbours) == 12
    assert all(o.problem.mnk != SHAPES[0].mnk for o in ctx.neighbours)


def test_payload_roundtrip_for_source_candidates():
    from gemmrl.kernels.cuda_source import CudaSource, ShapeRange

    src = CudaSource("int x;", entry="e", shapes=ShapeRange.parse("M=1..64,N%8,K%8"), name="cuda:x")
    back = payload_from("cuda", payload_text(CandidateSpec("cuda", src)))
    assert back == src
    assert payload_from("triton", "tiled(BM=16)") == "tiled(BM=16)"


def test_model_shapes():
    ps = model_shapes("llama-3-8b")
    assert len(ps) == len(MODELS["llama-3-8b"]) * 6 and all(p.layout == "tn" for p in ps)
    assert GemmProblem(16, 14336 * 2, 4096, layout="tn") in ps
    assert len(model_shapes("all", dtype="bf16")) > 100
    with pytest.raises(ValueError, match="known: deepseek"):
        model_shapes("gpt-5")


@pytest.mark.interpreter
def test_inline_executor_runs_the_real_evaluation_on_the_interpreter(tmp_path):
    p = GemmProblem(33, 65, 40, layout="nn")
    tmpl = RequestTemplate(protocols=("offline",), baselines=(), graph_check=False, device="cpu",
                           timing=TimingConfig(warmup_s=0.0, benchmark_s=0.02))
    specs = [CandidateSpec("triton", "tiled(BM=16,BN=16,BK=16,warps=1,stages=2,group_m=1)", layout="nn"),
             CandidateSpec("planted_triton", "fp16_acc", layout="nn")]
    store = TrialsStore(tmp_path / "t.sqlite")
    rep = Tuner(TuneSpec((p,), group=2, rounds=1, run="i", gpu="cpu"), [Fixed(specs)], InlineExecutor(tmpl), store,
                progress=False).run()
    verdicts = {o["family"]: o["verdict"] for o in store.outcomes()}
    assert verdicts == {"triton": "ok", "planted_triton": "rejected"}, verdicts
    assert rep.failures == {"rejected": 1}
    assert store.count() > 0     # the timed rows went to the trials table too


@pytest.mark.interpreter
def test_sandbox_group_with_a_crashing_candidate_is_split(tmp_path):
    """A candidate that kills its worker costs only itself: the group is re-run one candidate at a time."""
    from gemmrl.kernels.triton_source import TritonSource

    crash = TritonSource("import os\ndef gemm(a, b, c):\n    os._exit(3)\n", layout="nn", name="triton_source:crash")
    p = GemmProblem(16, 16, 16, layout="nn")
    tmpl = RequestTemplate(protocols=("offline",), baselines=(), graph_check=False, device="cpu",
                           timing=TimingConfig(warmup_s=0.0, benchmark_s=0.02))
    ex = SandboxExecutor(template=tmpl, timeout_s=120, gpus=(), scratch_root=tmp_path / "scratch",
                         env={"TRITON_INTERPRET": "1"})
    try:
        got = ex.submit(p, [CandidateSpec("planted_triton", "correct", layout="nn"),
                            CandidateSpec("triton_source", crash, layout="nn")]).result(timeout=300)
    finally:
        ex.close()
    assert got.evaluations[0]["failure"] == "" and got.evaluations[1]["failure"] == "crash"


def test_tune_cli_dry_run_resume_and_errors(tmp_path):
    env = {**os.environ, "GEMMRL_CACHE_DIR": str(tmp_path / "cache")}
    base = [sys.executable, "-m", "gemmrl.cli", "tune", "--executor", "model", "--no-progress",
            "--mnk", "64_4096_4096,128_256_64", "--rounds", "1", "--summary-out", str(tmp_path / "s.csv")]
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2 groups, 8 candidates" in r.stdout
    assert len((tmp_path / "s.csv").read_text().splitlines()) == 9
    # a dry run says so, claims no measurement, and leaves the user's policy as it was
    assert "dry run" in r.stdout and "verified candidate" not in r.stdout and "not saved" in r.stdout, r.stdout
    assert not list((tmp_path / "cache").rglob("policy*.json"))
    r = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--resume" in r.stderr
    r = subprocess.run(base + ["--resume", "--rounds", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "2 groups" in r.stdout, r.stderr
    # the wall budget counts from the command's start: one smaller than the set-up (candidate sets) tunes nothing
    r = subprocess.run(base[:-2] + ["--run", "tiny", "--budget-wall-minutes", "0.0001"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "of the wall budget" in r.stdout and "0 groups" in r.stdout and "wall budget" in r.stdout.splitlines()[-1]
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "tune", "--executor", "model", "--model", "gpt-5"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "known:" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "tune", "--mnk", "64_64_64", "--proposer", "llm",
                        "--executor", "model", "--run", "llm"], env={k: v for k, v in env.items() if "LLM" not in k and "OPENAI" not in k},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "GEMMRL_LLM" in r.stderr, r.stderr


SLOW_TUNE = """
import sys, time
from functools import partial
from gemmrl.library import TrialsStore
from gemmrl.problem import sample_grid
from gemmrl.search.executor import ModelExecutor
from gemmrl.search.loop import Tuner, TuneSpec
from gemmrl.search.policy import RLPolicy, candidate_set

class Slow(ModelExecutor):
    def submit(self, problem, specs):
        time.sleep(0.05)
        return super().submit(problem, specs)

if __name__ == "__main__":
    store = TrialsStore(sys.argv[1])
    shapes = tuple(sample_grid(12, 5))
    Tuner(TuneSpec(shapes, group=4, rounds=2, run="k", gpu="model"), [RLPolicy(candidates=partial(candidate_set, top=8, explore=4))],
          Slow(), store, progress=False).run()
"""


def test_kill_9_mid_run_then_resume_loses_nothing(tmp_path):
    script = tmp_path / "slow_tune.py"
    script.write_text(SLOW_TUNE)
    db = tmp_path / "trials.sqlite"
    proc = subprocess.Popen([sys.executable, str(script), str(db)], cwd=tmp_path)
    deadline = time.time() + 240
    n = 0
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if db.exists():
            try:
                n = len(TrialsStore(db).outcomes(gpu="model"))
            except Exception:  # noqa: BLE001 - the writer may hold the lock
                continue
            if n >= 24:
                break
    assert proc.poll() is None, "the run finished before it could be killed: make it slower"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(TrialsStore(db).outcomes(gpu="model"))
    assert 0 < before < 96
    subprocess.run([sys.executable, str(script), str(db)], cwd=tmp_path, check=True, timeout=300)
    outs = TrialsStore(db).outcomes(gpu="model")
    assert len(outs) == 96 and len({(o["mnk"], o["key"]) for o in outs}) == 96
    groups = {json.loads(o["record"])["group"] for o in outs}
    assert len(groups) == 24


@pytest.mark.gpu
def test_gpu_tuning_loop_in_the_sandbox(tmp_path):
    """Two shapes, one group of 3 RL proposals each, in a sandboxed worker on the GPU: every candidate verified and
    timed beside the vendor paths, rewards finite, rows in the trials store."""
    from gemmrl.search.executor import PrebuildExecutor

    shapes = (GemmProblem(128, 4096, 4096), GemmProblem(1024, 1024, 1024))
    store = TrialsStore(tmp_path / "t.sqlite")
    ex = PrebuildExecutor(SandboxExecutor(template=RequestTemplate(baselines=("cublas_tn", "cublaslt_heuristic_tn")),
                                          timeout_s=300, gpus=(0,), scratch_root=tmp_path / "scratch"))
    try:
        rep = Tuner(TuneSpec(shapes, group=3, rounds=1, run="g", gpu="gpu-test"), [RLPolicy(candidates=SMALL)], ex,
                    store, progress=False).run()
    finally:
        ex.close()
    outs = store.outcomes()
    assert rep.groups == 2 and len(outs) == 6
    ok = [o for o in outs if o["verdict"] == "ok"]
    assert len(ok) >= 4, [(o["name"], o["verdict"], json.loads(o["record"]).get("reason")) for o in outs]
    assert all(math.isfinite(o["reward"]) for o in ok)
    assert rep.gpu_s > 0 and store.count() > 0


def test_trials_export_gives_back_a_runs_outcomes_and_rows(tmp_path, capsys):
    """`gemmrl trials export` (search/run_export.py): what `gemmrl tune --summary-out/--rows-out` would have written,
    from the store of a run that was cut off or shared a store with other parts; a gzipped store too; a run not there
    and an output that exists are one-line errors."""
    import gzip
    import shutil

    from gemmrl.cli.main import main as cli
    from gemmrl.results import read_rows
    from gemmrl.search.run_export import ExportError, export_run

    store = TrialsStore(tmp_path / "t.sqlite")
    _tuner(store, rounds=1, run="a").run()
    _tuner(store, rounds=2, run="b").run()   # a second run in the same store: not exported with "a"
    store.ingest([{"gpu": "model", "mnk": SHAPES[0].mnk, "dtype": "fp16", "acc": "fp32", "candidate": "x",
                   "protocol": "graph", "time_ms": "0.01"}], "tune:a")
    store.checkpoint()
    store.close()
    packed = tmp_path / "t.sqlite.gz"
    with open(tmp_path / "t.sqlite", "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    for src in (tmp_path / "t.sqlite", packed):
        out = tmp_path / src.name.replace(".", "_")
        got = export_run(src, "a", None, out.with_suffix(".csv"))
        assert (got.shapes, got.outcomes, got.rows) == (len(SHAPES), 4 * len(SHAPES), 1)
        lines = list(csv.DictReader(open(out.with_suffix(".csv"))))
        assert len(lines) == got.outcomes and {r["run"] for r in lines} == {"a"}
    assert cli(["trials", "export", str(packed), "--run", "a", "--rows", str(tmp_path / "r.csv.gz")]) == 0
    assert f"a: {len(SHAPES)} shapes" in capsys.readouterr().out
    assert [r["candidate"] for r in read_rows([tmp_path / "r.csv.gz"])] == ["x"]
    with pytest.raises(ExportError, match="no run 'zzz'; the store holds a, b"):
        export_run(packed, "zzz")
    with pytest.raises(ExportError, match="no outcomes of run 'a' on 'other'"):
        export_run(packed, "a", gpu="other")
    assert cli(["trials", "export", str(packed), "--run", "zzz", "--outcomes", str(tmp_path / "o.csv")]) == 2
    assert "no run 'zzz'; the store holds a, b (give one of these to --run)" in capsys.readouterr().err
    # an output that exists is never overwritten; a store that is not there, or nothing asked, says what to give
    assert cli(["trials", "export", str(packed), "--run", "a", "--rows", str(tmp_path / "r.csv.gz")]) == 2
    assert "exists: give a new path" in capsys.readouterr().err
    assert cli(["trials", "export", str(tmp_path / "none.sqlite"), "--run", "a", "--rows", "x.csv"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli(["trials", "export", str(packed), "--run", "a"]) == 2
    assert "give --rows and/or --outcomes" in capsys.readouterr().err


@pytest.mark.parametrize("argv, gpus", [([], None), (["--gpu-device-id", "1"], (1,))])
def test_tune_uses_every_visible_gpu_unless_one_is_named(monkeypatch, argv, gpus):
    """`gemmrl tune` gives the sandbox pool every visible GPU (one worker, one group in flight, each) by default;
    --gpu-device-id pins it to one (bench's default of GPU 0 once made a 2-GPU tune use one)."""
    from gemmrl.cli import tune as tune_cli
    from gemmrl.search import executor
    from gemmrl.cli.main import build_parser

    seen = {}

    class Pool:
        def __init__(self, gpus=None, **kw):
            seen["gpus"] = gpus
            self.n_workers = len(gpus) if gpus is not None else 2   # two visible GPUs

        def close(self):
            pass

    monkeypatch.setattr(executor, "SandboxPool", Pool)
    args = build_parser().parse_args(["tune", "--mnk", "64_64_64", *argv])
    ex = tune_cli.make_executor(args, ("graph",))
    assert seen["gpus"] == gpus and ex.slots == (2 if gpus is None else 1)
    ex.close()


@pytest.mark.parametrize("row, flagged", [
    ({"candidate": "cublas_tn", "verified": False,
      "reason": "prepare failed: PermissionError: [Errno 13] Permission denied: '/tmp/c/build/.tmp-vendor_blas-x'"}, True),
    ({"candidate": "cublaslt_heuristic_nn", "verified": "false", "reason": "prepare failed: VendorBuildError: nvcc"}, True),
    ({"candidate": "torch", "verified": False, "reason": "prepare failed: VendorError: torch.matmul has no fp16-acc"}, False),
    ({"candidate": "cublas_tn", "verified": True, "reason": ""}, False),
    ({"candidate": "cublas_tn", "verified": False, "reason": "failed verification"}, False),
    ({"candidate": "triton:x", "verified": False, "reason": "prepare failed: PermissionError: x"}, False),
])
def test_environment_failures_are_the_machines_not_the_shapes(row, flagged):
    from gemmrl.measure.evaluate import environment_failures

    assert bool(environment_failures([row])) is flagged


class _NoCublas(ModelExecutor):
    """The model executor, but every group's cuBLAS baseline failed as on a fresh GPU machine whose vendor library was not built yet."""

    def submit(self, problem, specs):
        from concurrent.futures import Future
        from dataclasses import replace

        got = super().submit(problem, specs).result()
        out = Future()
        out.set_result(replace(got, rows=got.rows + ({"candidate": "cublas_tn", "verified": False, "reason":
                                                      "prepare failed: PermissionError: [Errno 13] Permission denied"},)))
        return out


def test_a_baseline_failing_for_the_machine_stops_the_tune_with_nothing_stored(tmp_path):
    """The first grid tune: the cuBLAS baselines could not be built inside the sandbox, the rewards silently became speedups
    over torch alone for 1700 candidates. Now the loop stops at the first such group, stores nothing of it and says
    what to do; once the cause is gone the run resumes."""
    store = TrialsStore(tmp_path / "t.sqlite")
    t = Tuner(TuneSpec(tuple(SHAPES), group=4, rounds=1, run="v", gpu="model"), [RLPolicy(candidates=SMALL)],
              _NoCublas(), store, progress=False)
    with pytest.raises(RuntimeError, match=r"baseline cublas_tn could not run .*PermissionError.*--resume"):
        t.run()
    assert store.outcomes() == []
    rep = _tuner(store, rounds=1, run="v").run()
    assert rep.groups == len(SHAPES) and len(store.outcomes(run="v")) == 4 * len(SHAPES)


def test_the_vendor_library_is_built_before_the_sandboxed_workers_need_it(monkeypatch):
    """The sandboxed workers may not write the build cache, so vendor_blas.so is built in the tuning process once,
    before the first group, where a cuBLAS baseline is timed (and not where only torch is)."""
    from gemmrl.kernels import vendor
    from gemmrl.kernels.vendor import VendorBuildError
    from gemmrl.search.executor import PrebuildExecutor

    calls = []
    monkeypatch.delenv("GEMMRL_VENDOR_LIB", raising=False)
    monkeypatch.setattr(vendor, "build_library", lambda: calls.append(1))
    assert vendor.prebuild_for(("torch",)) is None and calls == []
    assert vendor.prebuild_for(None) is None and calls == [1]

    def no_nvcc():
        raise VendorBuildError("nvcc not found")

    monkeypatch.setattr(vendor, "build_library", no_nvcc)
    assert "nvcc not found" in vendor.prebuild_for(("cublas_tn",))

    class Inner:
        slots = 1
        template = RequestTemplate(baselines=("torch", "cublas_tn"))

        def submit(self, problem, specs):
            return "submitted"

        def close(self):
            pass

    monkeypatch.setattr(vendor, "build_library", lambda: calls.append(2))
    ex = PrebuildExecutor(Inner())
    assert ex.submit(SHAPES[0], []) == "submitted" and ex.submit(SHAPES[1], []) == "submitted"
    assert calls == [1, 2] and ex.vendor_note is None
    ex.close()


def test_library_progress_table_per_run_and_in_all(tmp_path):
    """benchmarks/acceptance/library_progress.py: per tuning run and over all, the shapes, candidates, device-minutes and the best
    generated candidate's geomean speedups (alone and with the vendor fallback), from a (gzipped) trials store."""
    import gzip
    import shutil

    mod = script_module("library_progress")
    rows = [dict(mnk="a", run="r1", candidate="triton:x", verdict="ok", reward=math.log(2.0), speedup_graph=2.0,
                 speedup_cold=2.0, gpu_s=30.0),
            dict(mnk="a", run="r1", candidate="cutlass:y", verdict="ok", reward=math.log(0.5), speedup_graph=0.5,
                 speedup_cold=0.5, gpu_s=30.0),
            dict(mnk="b", run="r2", candidate="cutlass:z", verdict="ok", reward=math.log(0.5), speedup_graph=0.25,
                 speedup_cold=1.0, gpu_s=60.0),
            dict(mnk="b", run="r2", candidate="triton:w", verdict="build", reward="", speedup_graph="",
                 speedup_cold="", gpu_s=0.0)]
    got = mod.table(rows, "r", {"r1": {"torch", "cublas_tn"}, "r2": {"torch"}})
    assert [g["run"] for g in got] == ["r1", "r2", "all 2 runs"]
    r1, r2, every = got
    assert (r1["shapes"], r1["candidates"], r1["failures"], r1["device_min"]) == (1, 2, 0, 1.0)
    assert r1["graph"] == pytest.approx(2.0) and r1["families"] == "triton 1"
    assert r2["failures"] == 1 and r2["graph"] == pytest.approx(0.25) and r2["graph_fb"] == 1.0 and r2["wins_both"] == 0
    assert every["graph"] == pytest.approx(math.sqrt(0.5)) and every["cold_fb"] == pytest.approx(math.sqrt(2.0))
    assert every["baselines"] == "torch" and "| r2 | 1 | 2 | 1 |" in mod.markdown(got)
    with pytest.raises(SystemExit, match="no run whose name starts with 'zz'"):
        mod.table(rows, "zz")
    # the CLI on a real (gzipped) store
    store = TrialsStore(tmp_path / "t.sqlite")
    _tuner(store, rounds=1, run="grid-a").run()
    store.checkpoint()
    store.close()
    with open(tmp_path / "t.sqlite", "rb") as src, gzip.open(tmp_path / "t.sqlite.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert mod.main([str(tmp_path / "t.sqlite.gz"), "--runs", "grid", "--md", str(tmp_path / "p.md")]) == 0
    assert f"| grid-a | {len(SHAPES)} | {4 * len(SHAPES)} | 0 |" in (tmp_path / "p.md").read_text()


def test_tune_prebuilds_the_first_round_cutlass_configs_once_and_in_one_batch(monkeypatch, capsys):
    """The tune's set-up builds every first-round CUTLASS config (deduplicated) in one parallel batch, so no group
    waits for nvcc (the bf16 model shapes did, 40-140 s a group, on the H100); a build that cannot run is reported
    and left to the groups, never raised."""
    from types import SimpleNamespace

    from gemmrl.cli import tune as tune_cli
    from gemmrl.kernels import cutlass_sm90 as cs
    from gemmrl.kernels.cuda_source import Build

    a, b = "coop_128x256x64_c2x1_persistent_tn_bf16", "pingpong_64x64x64_c2x4_persistent_tn_fp16_swap"
    calls = []

    def fake_build_family(cfgs, arch, progress=False):
        calls.append((list(cfgs), arch))
        return {c: Build(key=str(c), arch=arch, so="/x.so" if i == 0 else None) for i, c in enumerate(cfgs)}

    monkeypatch.setattr(cs, "build_family", fake_build_family)
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")

    class Policy:  # two shapes, each proposing config a; the second also b and a Triton config
        def propose(self, ctx, n):
            specs = [CandidateSpec("cutlass", a), CandidateSpec("triton", "BM=64", layout="nn")]
            if ctx.problem.M == 128:
                specs.append(CandidateSpec("cutlass", f"{b}:s1_rh_dheuristic_k1"))
            return [Proposal(s, "rl") for s in specs[:n]]

    args = SimpleNamespace(group=4, no_progress=True, proposer="rl", no_shared_triton_cache=True)
    tune_cli.precompile_first_round(args, [GemmProblem(64, 64, 64), GemmProblem(128, 64, 64, dtype="bf16")], Policy())
    assert calls == [([cs.CutlassConfig.parse(a), cs.CutlassConfig.parse(b)], "90a")]
    assert "tune: prebuilt 1 of 2 first-round CUTLASS configs" in capsys.readouterr().out

    assert tune_cli.prebuild_cutlass([CandidateSpec("triton", "BM=64")]) == 0 and len(calls) == 1  # nothing to build

    def broken(cfgs, arch, progress=False):
        raise FileNotFoundError("nvcc")

    monkeypatch.setattr(cs, "build_family", broken)
    assert tune_cli.prebuild_cutlass([CandidateSpec("cutlass", a)]) == 0
    assert "not prebuilt (FileNotFoundError: nvcc); each group builds its own" in capsys.readouterr().out
    assert tune_cli.prebuild_cutlass([CandidateSpec("cutlass", "nonsense_config")]) == 0  # reported, not raised
    assert "first-round CUTLASS configs not prebuilt (CutlassConfigError" in capsys.readouterr().out


@pytest.mark.interpreter
def test_a_tuned_run_builds_a_library_from_what_it_stored(tmp_path, monkeypatch):
    """tune -> trials store -> library: the rows the loop stores (Python bools and floats from the evaluation) come
    back in the results schema's text form, so the library builder finds the verified winner (it found none: the
    store returned ``verified`` True where the builder reads ``"true"``)."""
    from gemmrl.candidate import FnCandidate
    from gemmrl.kernels import vendor
    from gemmrl.search.loop import winners

    def slow_vendor(p):  # a vendor path the CPU can run: the reference the library's speedups are against
        def mm(a, b, bt, c):
            for _ in range(20):
                c.copy_((a.float() @ b.float()).to(c.dtype))
        return [FnCandidate("cublas_nn", "nn", mm)]

    monkeypatch.setattr(vendor, "vendor_candidates", slow_vendor)
    p = GemmProblem(33, 65, 40, layout="nn")
    tmpl = RequestTemplate(protocols=("offline",), baselines=("cublas_nn",), graph_check=False, device="cpu",
                           timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05))
    cfg = "tiled(BM=16,BN=16,BK=16,warps=1,stages=2,group_m=1)"
    store = TrialsStore(tmp_path / "t.sqlite")
    Tuner(TuneSpec((p,), group=1, rounds=1, run="lib", gpu="cpu"), [Fixed([CandidateSpec("triton", cfg, layout="nn")])],
          InlineExecutor(tmpl), store, progress=False).run()
    assert [o["verdict"] for o in store.outcomes()] == ["ok"]
    rows = store.rows(gpu="cpu")
    assert rows and all(r["verified"] in ("true", "false") for r in rows)
    entries = winners(store, "cpu")
    assert entries, "a verified, timed winner stored by the loop must make a library entry"
    e = next(e for e in entries if e.protocol == "offline")
    assert (e.M, e.N, e.K, e.layout, e.vendor_best) == (33, 65, 40, "nn", "cublas_nn")
    # which one wins depends on the interpreter's speed on the machine: either is an entry built from the stored rows
    assert e.family == "vendor" or (e.family, e.impl) == ("triton", cfg), e
