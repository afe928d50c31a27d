"""GPU tier of the sandbox: planted CUDA candidates (an illegal address, a kernel that never ends, a launch on the
legacy default stream, a cudaMalloc larger than the device, a device synchronize) evaluated in the worker pool
between correct ones. The pool must survive every fault, record each with its class, and finish the rest of
its work correctly. With ``GEMMRL_OUT`` set, the verdicts are written there as a CSV (the closing note's and
the README's evidence)."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest

from gemmrl.measure.evaluate import CandidateSpec, EvalRequest, outcome
from gemmrl.adversarial.planted_cuda import EXPECTED, planted_source
from gemmrl.problem import GemmProblem

SEQUENCE = ["correct", "illegal_address", "correct", "hang", "correct", "legacy_stream", "huge_malloc",
            "device_sync", "syntax_error", "correct"]


@pytest.mark.gpu
def test_pool_survives_planted_faults(tmp_path):
    from gemmrl.kernels.cuda_source import build_many
    from gemmrl.kernels.vendor import build_library
    from gemmrl.results import collect_meta, git_sha, now
    from gemmrl.sandbox import Job, SandboxPool

    build_library()  # the parent builds everything a worker loads: workers cannot write the build cache
    build_many([planted_source(k) for k in set(SEQUENCE)])
    problem = GemmProblem(128, 256, 64)
    jobs = [Job(f"{i:02d}-{k}", "gemmrl.measure.evaluate:evaluate_job",
                EvalRequest(problem, CandidateSpec("cuda", planted_source(k)), baselines=("cublaslt_heuristic_tn",)),
                timeout_s=30.0 if k == "hang" else 180.0)
            for i, k in enumerate(SEQUENCE)]
    t0 = time.perf_counter()
    with SandboxPool(n_workers=1, scratch_root=tmp_path) as pool:
        results = pool.run(jobs)
        replaced = getattr(pool, "replaced", None)
    wall = time.perf_counter() - t0
    got = [outcome(r) for r in results]
    rows = []
    meta = collect_meta(0)
    for k, r, o in zip(SEQUENCE, results, got):
        v = r.value or {}
        rows.append({"planted": k, "expected": EXPECTED[k], "outcome": o, "sandbox_status": r.status,
                     "reason": (v.get("reason") or r.error or "")[:300].replace("\n", " "),
                     "speedup_graph": (v.get("speedup") or {}).get("graph", ""), "worker_pid": r.worker_pid,
                     "replaced": r.replaced, "wall_s": round(r.wall_s, 2), "isolation": r.isolation,
                     "output_tail": r.output[-200:].replace("\n", " | "), "mnk": problem.mnk, "gpu": meta.gpu,
                     "torch": meta.torch, "git_sha": git_sha(), "timestamp": now()})
    out = os.environ.get("GEMMRL_OUT")
    if out:
        path = Path(out) / f"sandbox-planted-faults_{time.strftime('%Y-%m-%d')}.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"\nsandbox planted faults: {wall:.1f} s, workers replaced {replaced}; {path}")
    assert got == [EXPECTED[k] for k in SEQUENCE], rows
    goods = [r for k, r in zip(SEQUENCE, results) if k == "correct"]
    assert all(r.value["failure"] == "" and r.value["speedup"].get("graph", 0) > 0 for r in goods)
    assert len({r.worker_pid for r in goods}) >= 3  # the faults replaced the worker, and the next job ran
    for k, r in zip(SEQUENCE, results):
        if EXPECTED[k] in ("timeout", "cuda_fault"):
            assert r.replaced
    assert "huge_malloc" in next(r.output for k, r in zip(SEQUENCE, results) if k == "huge_malloc")


@pytest.mark.gpu
def test_bench_cuda_source_through_the_sandbox(tmp_path):
    """`gemmrl bench --cuda-source`: a correct source is verified and timed beside the vendor paths in a worker;
    one with an illegal address is recorded as a cuda_fault row on every shape, and the run finishes."""
    from gemmrl.cli.main import main
    from gemmrl.adversarial.planted_cuda import SOURCE
    from gemmrl.results import read_rows

    good, bad = tmp_path / "good.cu", tmp_path / "bad.cu"
    good.write_text("#define GEMMRL_B_ROW 0\n" + SOURCE)
    bad.write_text("#define GEMMRL_B_ROW 0\n#define PLANT_ILLEGAL\n" + SOURCE)
    out = tmp_path / "rows.csv"
    assert main(["bench", "--mnk", "64_128_64,96_256_128", "--cuda-source", str(good), str(bad), "--protocol",
                 "graph,cold", "--declare", "N%8", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows([out])
    for mnk in ("64_128_64", "96_256_128"):
        for proto in ("graph", "cold"):
            got = {r["candidate"]: r for r in rows if r["mnk"] == mnk and r["protocol"] == proto}
            assert got["cuda:good"]["verified"] == "true" and float(got["cuda:good"]["time_ms"]) > 0
            assert "vendor_best" in got
            assert got["cuda:bad"]["verified"] == "false" and got["cuda:bad"]["reason"].startswith("cuda_fault")
