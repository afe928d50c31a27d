"""`gemmrl bench --triton-top K`: the cost model's best Triton configs as bench candidates (CPU tier), and the
best-of-prefix summary vendor_paths_table.py prints for them."""


import pytest

import gemmrl.measure.bench as bench
from gemmrl.measure.bench import BenchSpec, run_bench
from gemmrl.candidate import FnCandidate
from gemmrl.cli.main import build_parser, main
from gemmrl.kernels.triton_gemm import H100, TiledConfig, TritonGemm, valid
from gemmrl.search.top import current_arch, top_candidates
from gemmrl.problem import parse_mnk
from gemmrl.results import read_rows
from gemmrl.summary import best_of
from gemmrl.timing import TimingConfig

from conftest import HAS_CUDA, script_module


# -- the factory --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mnk,k", [("4096_4096_4096", 6), ("64_4096_64", 6), ("16_4096_4096", 8),
                                   ("1024_1024_8192", 12), ("33_65_129", 5)])
def test_top_candidates_unique_valid_and_varied(mnk, k):
    p = parse_mnk(mnk)
    cands = top_candidates(p, k, arch=H100)
    names = [c.name for c in cands]
    assert len(names) == k and len(set(names)) == k
    for c in cands:
        assert c.name == f"triton:{c.cfg}"
        assert valid(c.cfg, p, H100)[0], c.cfg
        assert c.layout == p.layout and c.acc == p.acc
        assert c.info()["algo"] == str(c.cfg)       # what the results row records in `algo`
    assert len({c.cfg.variant for c in cands}) > 1


def test_top_candidates_cover_every_live_variant():
    # decode shape: tiled, persistent, splitk and smallm are all valid; k=6 keeps one of each at least
    variants = {c.cfg.variant for c in top_candidates(parse_mnk("16_4096_4096"), 6, arch=H100)}
    assert variants == {"tiled", "persistent", "splitk", "smallm"}


def test_top_candidates_zero_and_default_arch():
    p = parse_mnk("256_256_256")
    assert top_candidates(p, 0) == []
    with pytest.raises(ValueError):
        top_candidates(p, -1)
    if not HAS_CUDA:
        assert current_arch() is H100
        assert [c.name for c in top_candidates(p, 4)] == [c.name for c in top_candidates(p, 4, arch=H100)]


# -- the CLI ------------------------------------------------------------------------------------------
def test_cli_parses_triton_top():
    ap = build_parser()
    assert ap.parse_args(["bench", "--mnk", "64_64_64"]).triton_top == 0
    assert ap.parse_args(["bench", "--mnk", "64_64_64", "--triton-top", "6"]).triton_top == 6


def test_cli_rejects_negative_triton_top(capsys):
    code = main(["bench", "--mnk", "64_64_64", "--triton-top", "-1"])
    err = capsys.readouterr().err
    assert code == 2 and "--triton-top" in err and ">= 0" in err and "-1" in err


def test_cli_wires_triton_top_through_extra(monkeypatch, tmp_path):
    seen = {}

    def fake_run(spec, progress=True):
        seen["spec"] = spec
        return spec.out

    monkeypatch.setattr(bench, "require_cuda", lambda device=0: None)
    monkeypatch.setattr(bench, "run_bench", fake_run)
    monkeypatch.setattr(bench, "write_summary", lambda path: path)
    monkeypatch.setattr(bench, "summary_text", lambda path: "")
    out = str(tmp_path / "r.csv")
    assert main(["bench", "--mnk", "4096_4096_4096", "--triton-top", "5", "--out", out, "--no-progress"]) == 0
    spec = seen["spec"]
    assert spec.vendor and len(spec.extra) == 1
    names = [c.name for c in spec.extra[0](spec.problems[0])]
    assert len(names) == 5 and all(n.startswith("triton:") for n in names)
    assert main(["bench", "--mnk", "4096_4096_4096", "--out", out, "--no-progress"]) == 0
    assert seen["spec"].extra == ()


# -- failures stay per candidate ------------------------------------------------------------------------
class _CompileFails(TritonGemm):
    def _slow(self, a, b, bt, c):
        raise RuntimeError("PassManager::run failed (simulated compile error)")


def _mixed(problem):
    return [TritonGemm(TiledConfig(BM=48), layout=problem.layout, acc=problem.acc, name="triton:bad-tile"),
            _CompileFails(TiledConfig(), layout=problem.layout, acc=problem.acc, name="triton:no-compile"),
            FnCandidate("torch", "tn", lambda a, b, bt, c: c.copy_((a.float() @ bt.float().t()).to(c.dtype)))]


def test_invalid_or_uncompilable_candidate_does_not_stop_the_others(tmp_path):
    spec = BenchSpec(problems=(parse_mnk("16_24_32"),), protocols=("offline",), out=tmp_path / "r.csv",
                     cfg=TimingConfig(warmup_s=0.01, benchmark_s=0.03), vendor=False, extra=(_mixed,))
    rows = {r["candidate"]: r for r in read_rows([run_bench(spec, progress=False, on_cpu=True,
                                                            verifier=lambda c, p: (True, ""))])}
    assert rows["triton:bad-tile"]["verified"] == "false"
    assert "prepare failed: ConfigError" in rows["triton:bad-tile"]["reason"] and "BM=48" in rows["triton:bad-tile"]["reason"]
    assert rows["triton:no-compile"]["verified"] == "false" and "simulated compile error" in rows["triton:no-compile"]["reason"]
    assert rows["torch"]["verified"] == "true" and float(rows["torch"]["time_ms"]) > 0


# -- best_of and the vendor-paths table ----------------------------------------------------------------------
def _row(cand, proto, mnk, tflops, **kw):
    r = {"candidate": cand, "protocol": proto, "mnk": mnk, "dtype": "fp16", "acc": "fp32", "rep": "0",
         "recheck": "", "members": "", "verified": "true", "floor_ok": "true", "time_ms": str(1.0 / tflops),
         "tflops": str(tflops), "reason": ""}
    r.update(kw)
    return r


ROWS = [
    _row("triton:tiled(a)", "graph", "64_64_64", 10.0),
    _row("triton:persistent(b)", "graph", "64_64_64", 30.0),
    _row("triton:splitk(c)", "graph", "64_64_64", 90.0, verified="false", reason="accuracy"),
    _row("triton:splitk(d)", "graph", "64_64_64", 80.0, floor_ok="false"),
    _row("triton:splitk(e)", "graph", "64_64_64", 70.0, recheck="1"),
    _row("triton:splitk(f)", "graph", "64_64_64", 60.0, rep="1"),
    _row("triton:tiled(a)", "cold", "64_64_64", 20.0),
    _row("triton:persistent(b)", "cold", "64_64_64", 5.0),
    _row("triton:tiled(a)", "graph", "128_128_128", 40.0),
    _row("cublas_tn", "graph", "64_64_64", 100.0),
    _row("vendor_best", "graph", "64_64_64", 100.0, members="cublas_tn"),
    _row("vendor_best", "graph", "128_128_128", 20.0, members="cublas_tn"),
    _row("vendor_best", "cold", "64_64_64", 40.0, members="cublas_tn"),
]


def test_best_of_picks_fastest_verified_row_per_protocol_and_shape():
    best = best_of(ROWS, "triton:")
    assert set(best) == {("graph", "64_64_64"), ("cold", "64_64_64"), ("graph", "128_128_128")}
    assert best[("graph", "64_64_64")]["candidate"] == "triton:persistent(b)"
    assert best[("cold", "64_64_64")]["candidate"] == "triton:tiled(a)"
    assert best[("graph", "128_128_128")]["tflops"] == "40.0"
    assert best_of(ROWS, "import:") == {}
    # aggregate rows are never picked, whatever their name
    assert set(r["candidate"] for r in best_of(ROWS, "").values()) <= {"cublas_tn", "triton:tiled(a)"}


def test_vendor_paths_table_prints_best_triton_vs_vendor_best(capsys, tmp_path):
    rt = script_module("vendor_paths_table")
    lines = rt.triton_best_lines(ROWS)
    assert "winner's curse" in lines[0]
    graph = next(x for x in lines if x.split()[0] == "graph")
    cold = next(x for x in lines if x.split()[0] == "cold")
    # graph: 30/100 and 40/20 -> geomean sqrt(0.6), min 0.3, half below 1
    n, geo, med, mn, below = graph.split()[1:6]
    assert (n, geo, med, mn, below) == ("2", f"{0.6 ** 0.5:.3f}", "1.150", "0.300", "0.50")
    assert cold.split()[1:3] == ["1", "0.500"] and "tiled 1" in cold
    assert rt.triton_best_lines([r for r in ROWS if not r["candidate"].startswith("triton:")]) == []


# -- re-measuring a selection: --triton-from --------------------------------------------------------------
def _selection_csv(tmp_path):
    import csv

    from gemmrl.kernels.triton_gemm import PersistentConfig
    from gemmrl.results import COLUMNS

    fast, slow = TiledConfig(BM=64, BN=64, BK=32), PersistentConfig(BM=128, BN=128, BK=64)
    rows = [_row(f"triton:{fast}", "graph", "64_64_64", 30.0, algo=str(fast)),
            _row(f"triton:{slow}", "graph", "64_64_64", 10.0, algo=str(slow)),
            _row(f"triton:{slow}", "cold", "64_64_64", 20.0, algo=str(slow)),
            _row(f"triton:{fast}", "cold", "64_64_64", 5.0, algo=str(fast)),
            _row(f"triton:{fast}", "graph", "128_128_128", 9.0, algo=str(fast), verified="false", reason="x")]
    path = tmp_path / "sel.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path, fast, slow


def test_selection_is_loaded_per_shape_and_protocol_and_rebuilt(tmp_path):
    from gemmrl.search.selection import load_selection, selected_candidates, selected_for

    path, fast, slow = _selection_csv(tmp_path)
    sel = load_selection([path], "triton")
    assert sel == {"64_64_64": {"graph": (str(fast), "tn"), "cold": (str(slow), "tn")}}  # unverified: nothing
    cands = selected_candidates(parse_mnk("64_64_64"), sel, "triton")
    assert sorted(c.name for c in cands) == ["triton-sel:cold", "triton-sel:graph"]
    assert {c.name: str(c.cfg) for c in cands} == {"triton-sel:graph": str(fast), "triton-sel:cold": str(slow)}
    assert selected_candidates(parse_mnk("128_128_128"), sel, "triton") == []
    # one config selected in both protocols is one candidate
    both = selected_candidates(parse_mnk("64_64_64"), {"64_64_64": {"graph": str(fast), "cold": str(fast)}}, "triton")
    assert [c.name for c in both] == ["triton-sel:cold+graph"]
    assert selected_for("triton-sel:cold+graph", "graph") and not selected_for("triton-sel:cold", "graph")
    assert not selected_for("triton:x", "graph")


def test_cli_triton_from_errors_and_wiring(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr(bench, "require_cuda", lambda device=0: None)
    monkeypatch.setattr(bench, "run_bench", lambda spec, progress=True: seen.setdefault("spec", spec).out)
    monkeypatch.setattr(bench, "write_summary", lambda path: path)
    monkeypatch.setattr(bench, "summary_text", lambda path: "")
    out = str(tmp_path / "r.csv")
    assert main(["bench", "--mnk", "64_64_64", "--triton-from", str(tmp_path / "nope.csv"), "--out", out]) == 2
    assert "no such file" in capsys.readouterr().err
    other = tmp_path / "other.csv"
    other.write_text("mnk,candidate\n")
    assert main(["bench", "--mnk", "64_64_64", "--triton-from", str(other), "--out", out]) == 2
    assert "not a gemmrl results file" in capsys.readouterr().err
    from gemmrl.results import COLUMNS

    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(COLUMNS) + "\n")
    assert main(["bench", "--mnk", "64_64_64", "--triton-from", str(empty), "--out", out]) == 2
    assert "run --triton-top K first" in capsys.readouterr().err
    path, fast, _ = _selection_csv(tmp_path)
    assert main(["bench", "--shapes", str(_shapes(tmp_path)), "--triton-from", str(path), "--out", out,
                 "--no-progress"]) == 0
    assert "no selected config for 1 shape(s)" in capsys.readouterr().err
    spec = seen["spec"]
    assert [c.name for c in spec.extra[0](parse_mnk("64_64_64"))] == ["triton-sel:cold", "triton-sel:graph"]


def _shapes(tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text("64_64_64\n128_128_128\n")
    return f


def test_vendor_paths_table_reports_the_re_measured_selection():
    rt = script_module("vendor_paths_table")
    rows = [_row("triton-sel:cold+graph", "graph", "64_64_64", 50.0, algo="tiled(x)"),
            _row("triton-sel:graph", "cold", "64_64_64", 80.0, algo="splitk(y)"),  # not selected for cold: ignored
            _row("triton-sel:cold+graph", "cold", "64_64_64", 20.0, algo="tiled(x)")] + ROWS
    lines = rt.triton_selected_lines(rows)
    graph = next(x for x in lines if x.split()[0] == "graph")
    cold = next(x for x in lines if x.split()[0] == "cold")
    assert graph.split()[1:3] == ["1", "0.500"] and cold.split()[1:3] == ["1", "0.500"] and "tiled 1" in cold
    assert rt.triton_selected_lines(ROWS) == []
