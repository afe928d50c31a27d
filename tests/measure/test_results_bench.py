"""Schema, resume, summaries and the bench loop, on the CPU (host protocols on CPU tensors)."""

import csv
import math

import pytest

from gemmrl.measure.bench import BenchError, BenchSpec, noise_rule_below, run_bench, second_run
from gemmrl.measure.core import aggregate_rows
from gemmrl.candidate import FnCandidate
from gemmrl.problem import GemmProblem, parse_mnk
from gemmrl.results import COLUMNS, REQUIRED, ResultsError, ResultsWriter, read_rows
from gemmrl.summary import BASELINES, Stats, ratios, summarize
from gemmrl.timing import TimingConfig

FAST = TimingConfig(warmup_s=0.01, benchmark_s=0.03)


def _mm(a, b, bt, c):
    c.copy_((a.float() @ b.float()).to(c.dtype))


def _slow_mm(a, b, bt, c):
    for _ in range(20):
        _mm(a, b, bt, c)


def _vendorish(problem):
    return [FnCandidate("cublas_tn", "tn", lambda a, b, bt, c: c.copy_((a.float() @ bt.float().t()).to(c.dtype))),
            FnCandidate("cublas_nn", "nn", _mm),
            FnCandidate("slow", "nn", _slow_mm)]


def _ok(cand, problem):
    return True, ""


def _spec(tmp_path, shapes, protocols=("offline",), extra=(_vendorish,), **kw):
    return BenchSpec(problems=tuple(parse_mnk(s) for s in shapes), protocols=protocols, out=tmp_path / "r.csv",
                     cfg=FAST, vendor=False, extra=extra, **kw)


def test_required_columns_present():
    assert set(REQUIRED) <= set(COLUMNS)
    for c in ("mnk", "dtype", "acc", "layout", "candidate", "protocol", "qps", "time_ms", "tflops", "n", "p20_ms",
              "p80_ms", "verified", "reason", "algo", "gpu", "cc", "sm_clock_mhz", "driver", "cuda", "torch",
              "triton", "git_sha", "timestamp"):
        assert c in REQUIRED


def test_bench_on_cpu_writes_schema_and_summary(tmp_path):
    path = run_bench(_spec(tmp_path, ["16_24_40", "3_5_7"], protocols=("offline", "server")), progress=False,
                     on_cpu=True, verifier=_ok)
    rows = read_rows([path])
    assert {r["protocol"] for r in rows} == {"offline", "server"}
    assert {r["mnk"] for r in rows} == {"16_24_40", "3_5_7"}
    for r in rows:
        assert r["verified"] == "true" and float(r["time_ms"]) > 0 and r["gpu"] == "cpu"
    server = [r for r in rows if r["protocol"] == "server"]
    assert all(float(r["qps"]) == 100.0 for r in server)
    agg = [r for r in rows if r["candidate"] == "cublas"]
    assert len(agg) == 4 and all(r["members"] in ("cublas_tn", "cublas_nn") for r in agg)
    # the deliberately slow kernel is measured slower than the fast one
    sp = ratios(rows, "slow", "cublas_nn")
    assert sp and all(v < 1.0 for v in sp.values())
    recs = summarize(rows, ["slow"], ["cublas"])
    assert {r["protocol"] for r in recs} == {"offline", "server"} and all(r["geomean"] < 1 for r in recs)


def test_unverified_candidate_is_reported_not_timed(tmp_path):
    def verifier(cand, problem):
        return (cand.name != "slow", "accuracy: planted")

    path = run_bench(_spec(tmp_path, ["8_8_8"]), progress=False, on_cpu=True, verifier=verifier)
    rows = {r["candidate"]: r for r in read_rows([path])}
    assert rows["slow"]["verified"] == "false" and rows["slow"]["reason"] == "accuracy: planted"
    assert rows["slow"]["time_ms"] == ""
    assert rows["cublas_nn"]["verified"] == "true"


def test_rows_say_where_the_time_outside_the_timed_calls_went(tmp_path):
    """Each timed row's info carries its candidate's prepare and battery time (prep_ms, verify_ms): a grid-wide
    pass spends about half its wall there, and the rows are where that is read back."""
    import time

    from gemmrl.measure.headroom import parse_info

    def verifier(cand, problem):
        if cand.name == "slow":
            time.sleep(0.06)
        return True, ""

    rows = read_rows([run_bench(_spec(tmp_path, ["8_8_8", "3_5_7"]), progress=False, on_cpu=True,
                                verifier=verifier)])
    timed = [r for r in rows if r["verified"] == "true" and not r.get("members") and not r.get("recheck")]
    assert {r["candidate"] for r in timed} == {"cublas_tn", "cublas_nn", "slow"}
    for r in timed:
        info = parse_info(r["info"])
        assert int(info["prep_ms"]) >= 0
        assert (int(info["verify_ms"]) >= 60) == (r["candidate"] == "slow"), r


def test_bench_leaves_the_callers_grad_mode_as_it_was(tmp_path):
    """run_bench measures without autograd but does not switch it off for the rest of the process (it did: a
    later gemmrl.mm on a tensor requiring grad then took the inference path)."""
    import torch

    assert torch.is_grad_enabled()
    run_bench(_spec(tmp_path, ["8_8_8"]), progress=False, on_cpu=True, verifier=_ok)
    assert torch.is_grad_enabled()


def test_resume_after_kill_loses_nothing(tmp_path):
    calls = {"n": 0}

    def dying(problem):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the sweep is killed while building the third shape's candidates
        return _vendorish(problem)

    shapes = ["4_4_4", "5_6_7", "8_9_10", "11_12_13"]
    with pytest.raises(KeyboardInterrupt):
        run_bench(_spec(tmp_path, shapes, extra=(dying,)), progress=False, on_cpu=True, verifier=_ok)
    first = read_rows([tmp_path / "r.csv"])
    assert {r["mnk"] for r in first} == {"4_4_4", "5_6_7"}
    # a torn last line (killed mid-write) is dropped on resume
    with open(tmp_path / "r.csv", "a") as fh:
        fh.write("8_9_10,fp16,fp32,nn,cublas")
    seen = []

    def counting(problem):
        seen.append(problem.mnk)
        return _vendorish(problem)

    run_bench(_spec(tmp_path, shapes, extra=(counting,)), progress=False, on_cpu=True, verifier=_ok)
    assert seen == ["8_9_10", "11_12_13"]  # finished shapes were not measured again
    rows = read_rows([tmp_path / "r.csv"])
    assert {r["mnk"] for r in rows} == set(shapes)
    per = {}
    for r in rows:
        per.setdefault((r["mnk"], r["candidate"]), 0)
        per[(r["mnk"], r["candidate"])] += 1
    assert set(per.values()) == {1}
    # rows of the first run are byte-identical after the resume
    assert rows[: len(first)] == first


def test_writer_refuses_foreign_header(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ResultsError, match="other columns"):
        ResultsWriter(p)


def test_read_rows_refuses_malformed(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("mnk,candidate\n1_1_1,x\n")
    with pytest.raises(ResultsError, match="missing columns"):
        read_rows([p])
    q = tmp_path / "y.csv"
    with open(q, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerow(["1_1_1"] * (len(COLUMNS) + 2))
    with pytest.raises(ResultsError, match=r"y.csv:2"):
        read_rows([q])


def test_read_rows_reads_gzipped_results(tmp_path):
    """Large committed runs are stored as .csv.gz: they read back row for row as the .csv they came from, and a file
    named .gz that is not gzip is refused with the file named."""
    import gzip

    p = tmp_path / "r.csv"
    row = {"mnk": "8_16_24", "dtype": "fp16", "acc": "fp32", "layout": "tn", "protocol": "graph"}
    ResultsWriter(p).write_batch([{**row, "candidate": "torch", "time_ms": 0.001},
                                  {**row, "candidate": "x", "time_ms": 0.002}])
    z = tmp_path / "r.csv.gz"
    z.write_bytes(gzip.compress(p.read_bytes()))
    assert read_rows([z]) == read_rows([p]) and len(read_rows([z])) == 2
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(p.read_bytes())
    with pytest.raises(ResultsError, match="bad.csv.gz: not a gemmrl results file"):
        read_rows([bad])


def test_stats():
    s = Stats.of([0.5, 2.0, 1.0, 4.0])
    assert s.n == 4 and s.geomean == pytest.approx(math.sqrt(2))
    assert s.amean == pytest.approx(7.5 / 4) and s.median == pytest.approx(1.5) and s.min == 0.5
    assert s.share_below == 0.25
    assert Stats.of([]).n == 0 and math.isnan(Stats.of([]).geomean)


def test_aggregates_pick_fastest_verified():
    rows = [{"candidate": "cublas_tn", "verified": True, "time_ms": 2.0, "tflops": 1.0},
            {"candidate": "cublas_nn", "verified": True, "time_ms": 1.0, "tflops": 2.0},
            {"candidate": "torch", "verified": False, "time_ms": math.inf, "tflops": 0.0},
            {"candidate": "cublaslt_heuristic_tn", "verified": True, "time_ms": 0.5, "tflops": 4.0, "floor_ok": False}]
    agg = {r["candidate"]: r for r in aggregate_rows(rows)}
    assert agg["cublas"]["members"] == "cublas_nn"
    assert agg["vendor_best"]["members"] == "cublas_nn"  # below-floor row never wins
    assert "cublaslt_heuristic" not in agg


def test_aggregates_only_where_every_member_ran():
    """A run restricted to some vendor paths (bench --baselines) writes no aggregate with a member left out: a row
    named vendor_best is always the best of all of them (torch does not apply to acc fp16)."""
    rows = [{"candidate": n, "verified": True, "time_ms": t, "tflops": 1.0 / t}
            for n, t in (("cublaslt_autotuned_tn", 2.0), ("cublaslt_autotuned_nn", 1.0))]
    got = {r["candidate"]: r for r in aggregate_rows(rows, ("cublaslt_autotuned_tn", "cublaslt_autotuned_nn"))}
    assert set(got) == {"cublaslt_autotuned"} and got["cublaslt_autotuned"]["members"] == "cublaslt_autotuned_nn"
    assert "vendor_best" in {r["candidate"] for r in aggregate_rows(rows)}  # unrestricted: as before
    no_torch = tuple(b for b in BASELINES if b != "torch")
    assert "vendor_best" in {r["candidate"] for r in aggregate_rows(rows, no_torch, acc="fp16")}
    assert "vendor_best" not in {r["candidate"] for r in aggregate_rows(rows, no_torch, acc="fp32")}


def test_bench_times_only_the_baselines_asked_for(tmp_path, monkeypatch):
    from gemmrl.kernels import vendor

    def fake(problem):
        return [FnCandidate(n, "nn", _mm) for n in ("torch", "cublas_tn", "cublas_nn")]

    monkeypatch.setattr(vendor, "vendor_candidates", fake)
    spec = BenchSpec(problems=(parse_mnk("8_16_32"),), protocols=("offline",), out=tmp_path / "r.csv", cfg=FAST,
                     baselines=("cublas_tn", "cublas_nn"))
    rows = read_rows([run_bench(spec, progress=False, on_cpu=True, verifier=_ok)])
    assert {r["candidate"] for r in rows} == {"cublas_tn", "cublas_nn", "cublas"}
    with pytest.raises(BenchError, match="unknown cublas; name any of torch"):
        BenchSpec(problems=(GemmProblem(1, 1, 1),), protocols=("offline",), out=tmp_path / "x.csv", baselines=("cublas",))
    with pytest.raises(BenchError, match="none given"):
        BenchSpec(problems=(GemmProblem(1, 1, 1),), protocols=("offline",), out=tmp_path / "x.csv", baselines=())


def test_noise_rule():
    base = {"dtype": "fp16", "acc": "fp32", "protocol": "graph", "verified": "true", "rep": "0"}

    def first(mnk, a, b, algo_a="x", algo_b="y"):
        return [{**base, "mnk": mnk, "candidate": "cublaslt_autotuned", "members": "cublaslt_autotuned_tn",
                 "layout": "tn", "algo": algo_a, "tflops": a, "recheck": ""},
                {**base, "mnk": mnk, "candidate": "cublaslt_heuristic", "members": "cublaslt_heuristic_tn",
                 "layout": "tn", "algo": algo_b, "tflops": b, "recheck": ""}]

    def again(mnk, pairs):
        out = []
        for k, (a_tn, a_nn, h_tn, h_nn) in enumerate(pairs, 1):
            for c, t in (("cublaslt_autotuned_tn", a_tn), ("cublaslt_autotuned_nn", a_nn),
                         ("cublaslt_heuristic_tn", h_tn), ("cublaslt_heuristic_nn", h_nn)):
                out.append({**base, "mnk": mnk, "candidate": c, "tflops": t, "recheck": str(k), "members": ""})
        return out

    rows = (first("1_1_1", "1.0", "1.1") + again("1_1_1", [("1.2", "0.5", "1.1", "0.5")] * 2 + [("1.0", "1", "1.1", "1")])
            + first("2_2_2", "1.0", "1.5") + again("2_2_2", [("1.0", "1.4", "1.5", "0.2")] * 3)
            + first("3_3_3", "1.0", "1.5", "same", "same")  # same algorithm, same layout: the same kernel
            + first("4_4_4", "1.0", "1.5"))  # slower and never rechecked: counts as below
    assert noise_rule_below(rows, "cublaslt_autotuned", "cublaslt_heuristic") == [("2_2_2", "graph"), ("4_4_4", "graph")]

    def members(mnk, algos):  # first-run member rows: {candidate: (layout, algo)}
        return [{**base, "mnk": mnk, "candidate": c, "layout": lay, "algo": a, "tflops": "1.0", "recheck": "",
                 "members": ""} for c, (lay, a) in algos.items()]

    same = {"cublaslt_autotuned_tn": ("tn", "p"), "cublaslt_autotuned_nn": ("nn", "q"),
            "cublaslt_heuristic_tn": ("tn", "p"), "cublaslt_heuristic_nn": ("nn", "q")}
    # the aggregates picked different layouts, but both ran the same two kernels: noise, never below
    agg_same = first("5_5_5", "1.0", "1.5", "q", "p") + members("5_5_5", same)
    # one layout's autotuned kernel differs: a real comparison (slower, not rechecked: below)
    agg_diff = first("6_6_6", "1.0", "1.5", "q", "p") + members("6_6_6", {**same, "cublaslt_autotuned_tn": ("tn", "r")})
    assert noise_rule_below(agg_same + agg_diff, "cublaslt_autotuned", "cublaslt_heuristic") == [("6_6_6", "graph")]


def test_noise_rule_compares_within_one_batch():
    """Two recheck pairs both write recheck numbers 1..3 for one shape: the gemmrl/vendor_best batches must not take
    the vendor side from the cublaslt pair's batches (the best of two batches would favour vendor_best)."""
    base = {"dtype": "fp16", "acc": "fp32", "protocol": "offline", "verified": "true", "rep": "0", "mnk": "8_8_8",
            "members": ""}
    rows = [{**base, "candidate": "gemmrl", "layout": "nn", "algo": "g", "tflops": "0.9", "recheck": ""},
            {**base, "candidate": "vendor_best", "layout": "nn", "algo": "v", "tflops": "1.0", "recheck": "",
             "members": "cublaslt_autotuned_nn"}]
    lt = ("cublaslt_autotuned_nn", "cublaslt_heuristic_nn")
    for k in (1, 2, 3):  # the cublaslt pair's batches: fast that time
        rows += [{**base, "candidate": c, "tflops": "1.10", "recheck": str(k)} for c in lt]
    for k in (1, 2, 3):  # the gemmrl pair's batches: gemmrl within 1% of the vendor members timed beside it
        rows += [{**base, "candidate": "gemmrl", "tflops": "0.995", "recheck": str(k)}]
        rows += [{**base, "candidate": c, "tflops": "1.0", "recheck": str(k)} for c in lt]
    assert noise_rule_below(rows, "gemmrl", "vendor_best", margin=0.02) == []
    # the same batches with gemmrl 5% slower than its batch: below
    slow = [dict(r, tflops="0.95") if r["candidate"] == "gemmrl" and r["recheck"] else r for r in rows]
    assert noise_rule_below(slow, "gemmrl", "vendor_best", margin=0.02) == [("8_8_8", "offline")]


def test_second_run_is_the_median_of_each_side_over_the_head_to_head_batches():
    """The pair's ratio from the rechecks alone (vendor_best's member chosen on the first run); batches of another pair
    at the same shape do not lend the vendor side their numbers; a shape with no batch holding both is left out."""
    base = {"dtype": "fp16", "acc": "fp32", "protocol": "graph", "verified": "true", "rep": "0", "members": ""}

    def shape(mnk, first_ours, first_vendor, batches):
        rows = [{**base, "mnk": mnk, "candidate": "gemmrl", "tflops": first_ours, "recheck": ""},
                {**base, "mnk": mnk, "candidate": "vendor_best", "tflops": first_vendor, "recheck": "",
                 "members": "cublas_tn"}]
        for k, (o, v) in enumerate(batches, 1):
            rows += [{**base, "mnk": mnk, "candidate": "gemmrl", "tflops": o, "recheck": str(k)},
                     {**base, "mnk": mnk, "candidate": "cublas_tn", "tflops": v, "recheck": str(k)}]
        return rows

    rows = (shape("1_1_1", "1.0", "1.1", [("1.0", "1.0"), ("1.2", "0.9"), ("0.8", "1.1")])  # medians 1.0 / 1.0
            + shape("2_2_2", "2.0", "1.0", [("2.0", "1.0"), ("2.2", "1.1"), ("1.8", "1.3")])  # 2.0 / 1.1
            + shape("3_3_3", "1.0", "1.0", []))  # first run only: no second-run figure
    rows += [{**base, "mnk": "1_1_1", "candidate": c, "tflops": "9.0", "recheck": str(k)}  # another pair's batches
             for k in (1, 2, 3) for c in ("cublaslt_autotuned_tn", "cublaslt_heuristic_tn")]
    got = second_run(rows)
    assert set(got) == {("1_1_1", "fp16", "fp32", "graph"), ("2_2_2", "fp16", "fp32", "graph")}
    assert got[("1_1_1", "fp16", "fp32", "graph")] == pytest.approx(1.0)
    assert got[("2_2_2", "fp16", "fp32", "graph")] == pytest.approx(2.0 / 1.1)
    assert second_run([r for r in rows if r["mnk"] == "3_3_3"]) == {}


def test_gemmrl_is_rechecked_head_to_head_with_the_vendor_path_that_won(tmp_path):
    """gemmrl more than 2% slower than vendor_best: re-measured 3 times against vendor_best's winning member alone
    (the crowd of every vendor member would favour the call path that fills most slots), and still below."""

    def cands(problem):
        return [*_vendorish(problem)[:2], FnCandidate("gemmrl", "nn", _slow_mm)]

    rows = read_rows([run_bench(_spec(tmp_path, ["8_16_24"], extra=(cands,)), progress=False, on_cpu=True,
                                verifier=_ok)])
    won = next(r["members"] for r in rows if r["candidate"] == "vendor_best")
    again = [r for r in rows if r["recheck"]]
    assert won in ("cublas_tn", "cublas_nn")
    assert sorted(r["candidate"] for r in again) == sorted(["gemmrl", won] * 3)
    assert sorted({r["recheck"] for r in again}) == ["1", "2", "3"]
    assert noise_rule_below(rows, "gemmrl", "vendor_best", margin=0.02) == [("8_16_24", "offline")]


def test_spec_errors(tmp_path):
    with pytest.raises(BenchError, match="unknown protocol"):
        BenchSpec(problems=(GemmProblem(1, 1, 1),), protocols=("warm",), out=tmp_path / "x.csv")
    with pytest.raises(BenchError, match="no shapes"):
        BenchSpec(problems=(), protocols=("graph",), out=tmp_path / "x.csv")
    with pytest.raises(BenchError, match="host protocols"):
        run_bench(_spec(tmp_path, ["4_4_4"], protocols=("graph",)), progress=False, on_cpu=True, verifier=_ok)


def test_repeat_spread():
    from gemmrl.summary import repeat_spread

    def row(mnk, cand, rep, t, **kw):
        return {"mnk": mnk, "candidate": cand, "rep": str(rep), "time_ms": str(t), "protocol": "graph",
                "verified": "true", "recheck": "", "members": "", **kw}

    rows = [row("1_1_1", "a", 0, 1.0), row("1_1_1", "a", 1, 1.02), row("1_1_1", "b", 0, 2.0), row("1_1_1", "b", 1, 1.9),
            row("2_2_2", "a", 0, 1.0), row("2_2_2", "a", 1, 1.0),
            row("2_2_2", "a", 1, 9.0, recheck="1"),  # a recheck is not a rep
            row("2_2_2", "vendor_best", 1, 9.0, members="a"),  # nor an aggregate
            row("3_3_3", "a", 1, 5.0),  # no rep 0 to compare with
            row("1_1_1", "a", 1, 3.0, protocol="cold")]  # another protocol
    s = repeat_spread(rows)
    assert s.n == 3 and s.max == pytest.approx(0.05) and s.worst == ("1_1_1", "b")
    assert s.median == pytest.approx(0.02)
    assert repeat_spread(rows, "offline").n == 0
