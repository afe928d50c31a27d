"""CPU tier for `gemmrl report`: numbers checked against hand-computed values from synthetic rows."""

import csv
import math

import pytest

from gemmrl.report import data as D
from gemmrl.report import make as R
from gemmrl.cli.main import main
from gemmrl.results import COLUMNS

A, B = "64_64_64", "128_128_128"
# offline tflops per shape; aggregates are not written: the report fills them from their members.
SPEED = {
    A: {"triton": 2.0, "torch": 1.0, "cublas_tn": 1.0, "cublas_nn": 1.6, "cublaslt_heuristic_tn": 1.0,
        "cublaslt_heuristic_nn": 1.0, "cublaslt_autotuned_tn": 1.0, "cublaslt_autotuned_nn": 1.8},
    B: {"triton": 3.0, "torch": 2.0, "cublas_tn": 2.5, "cublas_nn": 2.0, "cublaslt_heuristic_tn": 2.0,
        "cublaslt_heuristic_nn": 2.0, "cublaslt_autotuned_tn": 2.0, "cublaslt_autotuned_nn": 2.4},
}


def _row(mnk, cand, tflops, proto="offline", gpu="NVIDIA H100 80GB HBM3", **kw):
    m, n, k = (int(x) for x in mnk.split("_"))
    flops = 2 * m * n * k
    r = {c: "" for c in COLUMNS}
    r.update(mnk=mnk, dtype="fp16", acc="fp32", layout="nn", candidate=cand, protocol=proto, tflops=str(tflops),
             time_ms=str(flops / (tflops * 1e9)), n="10", verified="true", gpu=gpu, cc="9.0", git_sha="abc",
             timestamp="2026-11-22T00:00:00Z", M=str(m), N=str(n), K=str(k), floor_ms=str(flops / 1e12),
             floor_ok="true", rep="0")
    r.update(kw)
    return r


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def _rows(skip=(), scale=None, **kw):
    rows = [_row(m, c, v * (scale or {}).get((m, c), 1.0), **kw) for m, by in SPEED.items() for c, v in by.items()
            if c not in skip]
    # rows that must not count: unverified, a recheck, a second repeat, one below the floor
    rows += [dict(_row(A, "triton", 100.0, **kw), verified="false", reason="failed verification", tflops="x",
                  time_ms=""),
             _row(A, "triton", 100.0, recheck="1", **kw), _row(A, "triton", 100.0, rep="1", **kw),
             _row(B, "triton", 100.0, floor_ok="false", **kw)]
    return rows


def test_headline_arithmetic_and_geometric_means(tmp_path):
    f = _write(tmp_path / "r.csv", _rows())
    tab = D.shape_table(R.load([f])[f])
    assert R.choose(tab, None) == (["triton"], False)
    # torch: ratios 2.0 and 1.5 -> arithmetic mean - 1 = +75.0%, geometric sqrt(3) - 1 = +73.2%
    hdr, body = R.headline(tab, "triton", False, "amean", R.CUDA_L2_COLS)
    assert hdr == ["protocol", "torch", "cublas", "cublaslt_heuristic", "cublaslt_autotuned"]
    assert body == [["offline", "+75.0% (2)", "+22.5% (2)", "+75.0% (2)", "+18.1% (2)"]]
    _, gbody = R.headline(tab, "triton", False, "geomean", R.REFERENCE_COLUMNS)
    vb = math.sqrt((2.0 / 1.8) * (3.0 / 2.5)) - 1  # vendor_best = fastest of the seven: 1.8, 2.5
    assert gbody[0][1] == f"{100 * (math.sqrt(3) - 1):+.1f}% (2)"
    assert gbody[0][5] == f"{100 * vb:+.1f}% (2)"
    rep = R.make_report([f], tmp_path / "out", plots=False)
    md = rep.markdown.read_text()
    assert "protocols covered: offline." in md and "| server |" not in md
    assert "| offline | +75.0% (2) | +22.5% (2) |" in md


def test_files_written_and_html_self_contained(tmp_path):
    f = _write(tmp_path / "r.csv", _rows() + [_row(m, c, v, proto="graph") for m, by in SPEED.items()
                                              for c, v in by.items()])
    rep = R.make_report([f], tmp_path / "out")
    names = {p.name for p in rep.images}
    assert {"triton_distribution.png", "triton_heatmap_offline.png", "triton_heatmap_graph.png",
            "triton_vs_flops.png", "triton_floor.png"} <= names
    for p in rep.images:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = rep.html.read_text()
    assert page.count("data:image/png;base64,") == len(rep.images)
    assert "http://" not in page and "https://" not in page and "<table>" in page
    assert "| graph |" in rep.markdown.read_text()


def test_malformed_numeric_refused_with_row_and_nothing_written(tmp_path):
    rows = _rows()
    rows[3]["tflops"] = "fast"  # data line 4 of the file (header is line 1)
    f = _write(tmp_path / "bad.csv", rows)
    out = tmp_path / "out"
    with pytest.raises(R.ReportError, match=r"bad\.csv:5: .*tflops='fast'"):
        R.make_report([f], out)
    assert not out.exists()
    assert main(["report", str(f), "--out", str(out)]) == 2
    assert not out.exists()


def test_wrong_field_count_refused(tmp_path, capsys):
    f = _write(tmp_path / "r.csv", _rows())
    with open(f, "a") as fh:
        fh.write("64_64_64,fp16,fp32\n")
    assert main(["report", str(f), "--out", str(tmp_path / "o")]) == 2
    assert f"{f}:{len(_rows()) + 2}" in capsys.readouterr().err


def test_vendor_only_falls_back_to_vendor_best(tmp_path):
    f = _write(tmp_path / "v.csv", _rows(skip=("triton",)))
    rep = R.make_report([f], tmp_path / "out", plots=False)
    assert rep.notes and "vendor-only" in rep.notes[0]
    md = rep.markdown.read_text()
    tv = ((1.0 / 1.8) + (2.0 / 2.5)) / 2 - 1  # torch / vendor_best, arithmetic mean - 1 = -32.2%
    assert f"| offline | {100 * tv:+.1f}% (2) |" in md
    with pytest.raises(R.ReportError, match="--candidate 'triton'"):
        R.make_report([f], tmp_path / "o2", candidate="triton", plots=False)


def test_claims_beside_measured(tmp_path):
    f = _write(tmp_path / "r.csv", _rows())
    cols = ["mnk", "offline_torch.matmul", "offline_cuBLAS-max", "server_torch.matmul", "kernel_class"]
    c = tmp_path / "claims.csv"
    with open(c, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerow([A, "1.9", "1.1", "2.5", "WMMA"])
        w.writerow(["4096_4096_4096", "0.9", "0.9", "0.9", "x"])
    rep = R.make_report([f], tmp_path / "out", claims=c)
    joined = list(csv.DictReader(open(tmp_path / "out" / "claims_vs_measured.csv")))
    got = {(j["protocol"], j["baseline"], j["mnk"]): (float(j["claim"]), float(j["measured"])) for j in joined}
    assert got == {("offline", "torch", A): (1.9, 2.0), ("offline", "cublas", A): (1.1, 1.25)}
    md = rep.markdown.read_text()
    assert R.CLAIM_LABEL in md and "Shapes both have: 1." in md
    assert "| offline | torch | 1 | +90.0% | +100.0% |" in md


def test_compare_two_files_on_shared_shapes(tmp_path):
    a = _write(tmp_path / "a.csv", _rows())
    b_rows = [r for r in _rows(scale={(A, "triton"): 1.5}, gpu="NVIDIA H200") if r["mnk"] == A]
    b = _write(tmp_path / "b.csv", b_rows)
    recs = {(r["protocol"], r["candidate"]): r for r in R.compare(R.load([a])[a], R.load([b])[b])}
    assert recs[("offline", "triton")]["n"] == 1 and recs[("offline", "triton")]["geomean"] == pytest.approx(1.5)
    assert recs[("offline", "torch")]["geomean"] == pytest.approx(1.0)
    assert ("offline", "vendor_best") in recs
    # two files of different GPUs given as RESULTS: each gets a section and they are compared
    rep = R.make_report([a, b], tmp_path / "out", plots=False)
    md = rep.markdown.read_text()
    assert md.count("## a.csv") == 1 and md.count("## b.csv") == 1
    assert "## Comparison on shared shapes" in md and "| offline | triton | 1 | 1.500 |" in md
    # explicit --compare through the CLI
    assert main(["report", "--compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    assert "| offline | triton | 1 | 1.500 |" in (tmp_path / "c" / "report.md").read_text()


def test_readme_block_written_between_markers(tmp_path):
    f = _write(tmp_path / "r.csv", _rows())
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nbefore\n<!-- report:begin -->\nold text\n<!-- report:end -->\nafter\n")
    out = tmp_path / "docs" / "report"
    assert main(["report", str(f), "--out", str(out), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n<!-- report:begin -->\n") and text.endswith("<!-- report:end -->\nafter\n")
    assert "old text" not in text and "| offline | +75.0% (2) | +22.5% (2) |" in text
    assert "](docs/report/triton_distribution.png)" in text and "](docs/report/triton_vs_flops.png)" in text
    assert "Generated by `gemmrl report" in text


@pytest.mark.parametrize("content", ["no markers\n", "<!-- report:end -->\n<!-- report:begin -->\n",
                                     "<!-- report:begin -->\n<!-- report:begin -->\n<!-- report:end -->\n"])
def test_readme_without_one_marker_pair_is_refused_untouched(tmp_path, content):
    f = _write(tmp_path / "r.csv", _rows())
    readme = tmp_path / "README.md"
    readme.write_text(content)
    assert main(["report", str(f), "--out", str(tmp_path / "out"), "--readme", str(readme)]) == 2
    assert readme.read_text() == content
