"""gemmrl.report.splice and `gemmrl report --splice`: a figure spliced from several runs, rebuilt from its recipe (the
markdown's Sources line) bit for bit, and a stale one caught."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gemmrl.cli.main import main
from gemmrl.report import splice
from gemmrl.results import COLUMNS

GPU = "NVIDIA H100 80GB HBM3"
ROOT = Path(__file__).resolve().parents[2]
SPLICED = sorted((ROOT / "benchmarks" / "results").glob("*/*spliced*.md"))  # every committed spliced grid figure


def _row(mnk, cand, time_ms, protocol="graph", dtype="fp16", **kw):
    r = {c: "" for c in COLUMNS}
    m, n, k = mnk.split("_")
    r.update(mnk=mnk, dtype=dtype, acc="fp32", layout="tn", candidate=cand, protocol=protocol, time_ms=str(time_ms),
             tflops=str(2 * int(m) * int(n) * int(k) / (time_ms * 1e9)), n="10", verified="true", floor_ok="true",
             rep="0", gpu=GPU, cc="9.0", M=m, N=n, K=k, torch="2.11", timestamp="t",
             algo="eager=triton:cfg (graph entry); graph=triton:cfg (graph entry)" if cand == "gemmrl" else "")
    r.update(kw)
    return r


def _shape(mnk, ours, vendor, protocol="graph"):
    ref = "cublaslt_autotuned" if protocol == "offline" else "vendor_best"
    return [_row(mnk, "cublas_tn", vendor, protocol), _row(mnk, ref, vendor, protocol, members="cublas_tn"),
            _row(mnk, "gemmrl", ours, protocol)]


def _write(path: Path, rows) -> str:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path.name


@pytest.fixture
def recipe(tmp_path):
    """A first pass over three shapes (graph, cold) and offline, then a later pass re-measuring one graph cell."""
    first = _write(tmp_path / "measure.csv", _shape("64_128_256", 1.0, 1.2) + _shape("4096_4096_4096", 1.0, 0.9)
                   + _shape("1024_1024_1024", 1.0, 1.05) + _shape("64_128_256", 1.0, 1.1, "cold"))
    off = _write(tmp_path / "offline.csv", _shape("64_128_256", 1.0, 1.3, "offline"))
    later = _write(tmp_path / "later.csv", _shape("4096_4096_4096", 1.0, 1.02))
    rows = splice.splice_rows_of([tmp_path / first, tmp_path / off], [tmp_path / later])
    measure = [r for r in rows if r["protocol"] not in splice.REFERENCE]
    text = splice.markdown(splice.measure_table(measure), splice.offline_statistic(rows), splice.coverage(rows),
                           [first, off, f"{later} (supersedes 1 cells)"])
    md = tmp_path / "splice.md"
    md.write_text(text)
    return md


def test_a_later_pass_replaces_the_cells_it_measured_never_mixes_them(recipe):
    rows = splice.splice_rows(recipe)
    big = [r for r in rows if r["mnk"] == "4096_4096_4096"]
    assert {r["time_ms"] for r in big if r["candidate"] == "vendor_best"} == {"1.02"}  # the later pass's cell only
    recs = {(r["protocol"], r["class"]): r for r in splice.measure_table(rows)}
    assert recs[("graph", "all")]["shapes"] == 3
    assert recs[("graph", "all")]["geomean"] == pytest.approx((1.2 * 1.02 * 1.05) ** (1 / 3))
    assert recs[("cold", "all")]["geomean"] == pytest.approx(1.1)
    assert splice.offline_statistic(rows)["mean"] == pytest.approx(1.3)


def test_the_recipe_rebuilds_its_figures_and_a_changed_figure_is_caught(recipe, capsys):
    assert splice.check(recipe) == []
    assert main(["report", "--splice", str(recipe), "--check"]) == 0
    assert "every figure rebuilt from its 3 sources" in capsys.readouterr().out
    text = recipe.read_text()
    g = f"{(1.2 * 1.02 * 1.05) ** (1 / 3):.4f}"
    assert f"| graph | fp16 | all | 3 | {g} |" in text
    recipe.write_text(text.replace(f"| graph | fp16 | all | 3 | {g} |", "| graph | fp16 | all | 3 | 1.0500 |"))
    stale = splice.check(recipe)
    assert len(stale) == 1 and "1.0500" in stale[0][0] and g in stale[0][1]
    assert main(["report", "--splice", str(recipe), "--check"]) == 1
    assert "stale:" in capsys.readouterr().out


def test_without_check_it_prints_the_rebuilt_figures(recipe, capsys):
    assert main(["report", "--splice", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Sources: measure.csv, offline.csv, later.csv (supersedes n cells)")
    assert "offline, CUDA-L2's statistic over 1 shapes" in out


@pytest.mark.parametrize("first_line, match", [(None, "no such file"), ("# a table\n", "no 'Sources: ...' first line"),
                                               ("Sources: gone.csv.gz\n", "not beside it: ")])
def test_a_bad_recipe_is_a_one_line_error(tmp_path, capsys, first_line, match):
    md = tmp_path / "splice.md"
    if first_line is not None:
        md.write_text(first_line)
    with pytest.raises(splice.SpliceError, match=match):
        splice.check(md)
    assert main(["report", "--splice", str(md), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_a_recipe_with_no_figure_lines_is_refused(recipe):
    recipe.write_text(recipe.read_text().splitlines()[0] + "\n")
    with pytest.raises(splice.SpliceError, match="no figure lines"):
        splice.check(recipe)


def test_the_committed_spliced_figures_are_found():
    assert len(SPLICED) >= 11  # the H100 grid library's figures, each a measure pass and later passes


@pytest.mark.parametrize("md", SPLICED, ids=lambda p: p.name[:60])
def test_a_committed_grid_figure_is_rebuilt_from_its_sources(md):
    figures = splice.figures(md.read_text())
    assert any(line.startswith("| graph | fp16 | all | 1000 |") for line in figures)
    assert splice.check(md) == []
