"""benchmarks/acceptance/library_measure.py: the grid-library bar's figures from the measure pass (`gemmrl bench --library` rows)."""

from __future__ import annotations

import csv
import math

import pytest

from gemmrl.results import COLUMNS
from conftest import script_module

GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def mod():
    return script_module("library_measure")


def _row(mnk, cand, time_ms, protocol="graph", algo="", dtype="fp16", **kw):
    r = {c: "" for c in COLUMNS}
    m, n, k = mnk.split("_")
    r.update(mnk=mnk, dtype=dtype, acc="fp32", layout="tn", candidate=cand, protocol=protocol, time_ms=str(time_ms),
             tflops=str(2 * int(m) * int(n) * int(k) / (time_ms * 1e9)), n="10", verified="true", floor_ok="true",
             rep="0", gpu=GPU, cc="9.0", algo=algo, M=m, N=n, K=k, torch="2.11", timestamp="t")
    r.update(kw)
    return r


def _shape(mnk, ours, vendor, protocol="graph", served="triton:cfg", rechecks=(), dtype="fp16"):
    """gemmrl and one vendor member (cublas_tn, also vendor_best) in a first run, then (ours, vendor) rechecks."""
    algo = f"eager={served} (cold entry {mnk}); graph={served} (graph entry {mnk}); hot=torch"
    rows = [_row(mnk, "cublas_tn", vendor, protocol, "cublasGemmEx", dtype),
            _row(mnk, "vendor_best", vendor, protocol, "cublasGemmEx", dtype, members="cublas_tn"),
            _row(mnk, "gemmrl", ours, protocol, algo, dtype)]
    for i, (o, v) in enumerate(rechecks, 1):
        rows += [_row(mnk, "gemmrl", o, protocol, algo, dtype, recheck=str(i)),
                 _row(mnk, "cublas_tn", v, protocol, "cublasGemmEx", dtype, recheck=str(i))]
    return rows


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


ROWS = (_shape("64_128_256", 1.0, 1.2)  # small, generated, 1.2x
        + _shape("64_128_512", 1.0, 0.9, served="vendor:cublaslt_autotuned_tn",  # 0.9x, stays below
                 rechecks=[(1.0, 0.9), (1.0, 0.91), (1.0, 0.9)])
        + _shape("4096_4096_4096", 1.0, 0.97, served="vendor:cublas_tn",  # 0.97x first, recovers in the rechecks
                 rechecks=[(1.0, 1.0), (1.0, 1.01), (1.0, 0.99)])
        + _shape("1024_1024_1024", 1.0, 1.0, protocol="cold")
        + _shape("64_128_256", 1.0, 0.5, dtype="bf16",  # a bf16 row of a grid shape: its own problem
                 rechecks=[(1.0, 0.5)] * 3))


def test_figures_per_class_and_protocol(mod, tmp_path):
    recs = {(r["protocol"], r["class"]): r for r in mod.measure_table(ROWS) if r["dtype"] == "fp16"}
    small, large, alls = recs["graph", "small"], recs["graph", "large"], recs["graph", "all"]
    assert small["shapes"] == 2 and large["shapes"] == 1 and alls["shapes"] == 3
    assert math.isclose(small["geomean"], math.sqrt(1.2 * 0.9))
    assert math.isclose(alls["min"], 0.9) and alls["first_below"] == 2
    # the noise rule: 64_128_512 stays below (median of the rechecks 0.9), 4096^3 recovers (median 1.0)
    assert alls["noise_below"] == 1 and alls["below_shapes"] == ["64_128_512"]
    assert small["generated"] == 1 and large["generated"] == 0 and alls["bar"] == 1.05
    # generated-served and vendor-served apart: 64_128_256 (1.2) against 64_128_512 and 4096^3 (0.9, 0.97)
    assert math.isclose(alls["generated_geomean"], 1.2) and math.isclose(alls["vendor_geomean"], math.sqrt(0.9 * 0.97))
    assert math.isnan(large["generated_geomean"])
    assert recs["cold", "other"]["shapes"] == 1 and recs["cold", "all"]["bar"] == 1.10
    assert ("cold", "large") not in recs
    assert mod.coverage(ROWS) == {"graph": 3, "cold": 1}  # the bf16 row is the same grid shape: counted once
    bf16 = [r for r in mod.measure_table(ROWS) if r["dtype"] == "bf16"]
    assert [(r["class"], r["shapes"], r["below_shapes"]) for r in bf16] == [("small", 1, ["64_128_256"]),
                                                                            ("all", 1, ["64_128_256"])]


def test_offline_statistic_is_an_arithmetic_mean_against_cublaslt_autotuned(mod):
    rows = []
    for mnk, ours, theirs in (("64_64_64", 1.0, 2.0), ("128_128_128", 1.0, 1.0)):
        rows += [_row(mnk, "cublaslt_autotuned_tn", theirs, "offline", "id=1"),
                 _row(mnk, "cublaslt_autotuned", theirs, "offline", "id=1", members="cublaslt_autotuned_tn"),
                 _row(mnk, "gemmrl", ours, "offline", "eager=vendor:cublas_tn (offline entry x)")]
    off = mod.offline_statistic(rows)
    assert off["shapes"] == 2 and math.isclose(off["mean"], 1.5) and math.isclose(off["geomean"], math.sqrt(2))
    assert mod.offline_statistic(ROWS) is None


def test_main_writes_markdown_and_refuses_rows_without_gemmrl(mod, tmp_path, capsys):
    src = _write(tmp_path / "m.csv", ROWS)
    md = tmp_path / "m.md"
    assert mod.main([str(src), "--md", str(md)]) == 0
    out = capsys.readouterr().out
    assert "| graph | fp16 | all | 3 | " in out
    assert "| 1 | 1.2000 | 0.9343 |" in out  # generated served, its geomean, the vendor-served geomean
    assert "Below 0.98 after the noise rule: 64_128_512 (graph fp16), 64_128_256 (graph bf16)" in out
    assert md.read_text() == out
    other = _write(tmp_path / "v.csv", [r for r in ROWS if r["candidate"] != "gemmrl"])
    assert mod.main([str(other)]) == 2
    assert "gemmrl bench --library" in capsys.readouterr().err


def test_selection_figures_from_the_library_stand_beside(mod, tmp_path, capsys):
    """--library: the library's selection-run speedup over the same shapes, per protocol and dtype (a shape the
    library lacks leaves the figure out rather than averaging a subset)."""
    from gemmrl.library import Entry, Library

    def e(mnk, protocol, t, vb, dtype="fp16"):
        m, n, k = (int(x) for x in mnk.split("_"))
        return Entry(gpu=GPU, cc="9.0", dtype=dtype, acc="fp32", layout="tn", protocol=protocol, M=m, N=n, K=k,
                     family="triton", impl="cfg", algo="cfg", time_ms=t, vendor_best_ms=vb, vendor_best="cublas_tn",
                     m_lo=m, m_hi=m, members=(mnk,), verified=True)

    lib = Library([e("64_128_256", "graph", 1.0, 1.25), e("64_128_512", "graph", 1.0, 1.0),
                   e("4096_4096_4096", "graph", 1.0, 1.0), e("64_128_256", "graph", 1.0, 4.0, dtype="bf16")])
    path = lib.save(tmp_path / "lib.json.gz")
    sel = mod.selection_figures(str(path))
    assert sel[("graph", "fp16", "64_128_256")] == 1.25 and sel[("graph", "bf16", "64_128_256")] == 4.0
    recs = {(r["protocol"], r["dtype"], r["class"]): r for r in mod.measure_table(ROWS, sel)}
    assert math.isclose(recs["graph", "fp16", "small"]["selection"], math.sqrt(1.25))
    assert math.isclose(recs["graph", "fp16", "all"]["selection"], 1.25 ** (1 / 3))
    assert math.isnan(recs["cold", "fp16", "all"]["selection"])  # 1024^3 cold is not in this library
    src = _write(tmp_path / "m.csv", ROWS)
    assert mod.main([str(src), "--library", str(path)]) == 0
    assert "(not all in the library)" in capsys.readouterr().out


def test_plot_marks_the_shapes_that_stay_below(mod, tmp_path):
    """--plot: one panel per protocol and dtype, each shape's first-run ratio, the noise rule's losers ringed."""
    pytest.importorskip("matplotlib")
    pts, below = mod.measured_points(ROWS)
    assert set(pts) == {"graph fp16", "cold fp16", "graph bf16"}
    flops, x, fam = pts["graph fp16"]["64_128_512"]
    assert (flops, fam) == (2.0 * 64 * 128 * 512, "vendor") and math.isclose(x, 0.9)
    assert math.isclose(pts["graph fp16"]["64_128_256"][1], 1.2) and pts["graph fp16"]["64_128_256"][2] == "triton"
    assert below == {"graph fp16": {"64_128_512"}, "graph bf16": {"64_128_256"}}
    src = _write(tmp_path / "m.csv", ROWS)
    png = tmp_path / "m.png"
    assert mod.main([str(src), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_has_an_offline_panel_against_cublaslt_autotuned(mod, tmp_path):
    """--plot with --offline rows: an offline panel of gemmrl / cublaslt_autotuned (CUDA-L2's reference), also from
    offline rows alone; nothing is ringed there (the noise rule is for graph and cold)."""
    pytest.importorskip("matplotlib")
    off = [_row("64_64_1024", "cublaslt_autotuned_tn", 0.030, "offline", "id=1"),
           _row("64_64_1024", "cublaslt_autotuned", 0.030, "offline", "id=1", members="cublaslt_autotuned_tn"),
           _row("64_64_1024", "gemmrl", 0.024, "offline", "eager=triton:cfg (cold entry 64_64_1024); hot=torch")]
    pts, below = mod.measured_points(ROWS + off)
    assert set(pts) == {"graph fp16", "cold fp16", "graph bf16", "offline fp16"}
    flops, x, fam = pts["offline fp16"]["64_64_1024"]
    assert math.isclose(x, 0.030 / 0.024) and fam == "triton" and "offline fp16" not in below
    src, offf = _write(tmp_path / "m.csv", ROWS), _write(tmp_path / "o.csv", off)
    for args in ([str(src), "--offline", str(offf)], [str(offf), "--offline", str(offf)]):
        png = tmp_path / "p.png"
        assert mod.main(args + ["--plot", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        png.unlink()


def test_against_an_earlier_pass_cell_by_cell(mod, tmp_path, capsys):
    """--against: the shapes both passes measured, each run's gemmrl / vendor_best and now / before; a shape only
    one run has is left out; rows with nothing in common are refused."""
    before = (_shape("64_64_2048", 1.0, 1.05, served="triton:splitk(split=8)")
              + _shape("64_64_4096", 1.0, 1.0, served="vendor:cublas_tn"))
    now = (_shape("64_64_2048", 0.8, 1.0, served="triton:splitk(split=8)")  # 1.25 now against 1.05 before
           + _shape("128_128_128", 1.0, 1.0))
    cells = mod.against(now, before)
    assert [(c["mnk"], c["protocol"]) for c in cells] == [("64_64_2048", "graph")]
    c = cells[0]
    assert math.isclose(c["new"], 1.25) and math.isclose(c["old"], 1.05) and math.isclose(c["change"], 1.25 / 1.05)
    assert c["served_new"].startswith("triton:splitk") and c["served_old"].startswith("triton:splitk")
    a, b = _write(tmp_path / "now.csv", now), _write(tmp_path / "before.csv", before)
    assert mod.main([str(a), "--against", str(b)]) == 0
    out = capsys.readouterr().out
    assert "| graph | fp16 | 1 | 1.2500 | 1.0500 | 1.1905 |" in out and "| graph | fp16 | 64_64_2048 | 1.250 |" in out
    other = _write(tmp_path / "other.csv", _shape("256_256_256", 1.0, 1.0))
    assert mod.main([str(a), "--against", str(other)]) == 2
    assert "no (protocol, dtype, shape)" in capsys.readouterr().err


def test_against_an_earlier_offline_pass_uses_cublaslt_autotuned(mod, tmp_path, capsys):
    """An offline pass times gemmrl beside cublaslt_autotuned only (CUDA-L2's statistic): --against compares offline
    cells by gemmrl / cublaslt_autotuned, also with offline rows alone as the measure."""
    def offline(mnk, ours, theirs, served):
        return [_row(mnk, "cublaslt_autotuned_tn", theirs, "offline", "id=1"),
                _row(mnk, "cublaslt_autotuned", theirs, "offline", "id=1", members="cublaslt_autotuned_tn"),
                _row(mnk, "gemmrl", ours, "offline", f"eager={served} (cold entry {mnk}); hot=torch")]

    before = offline("64_64_1024", 0.040, 0.030, "vendor:torch") + offline("64_64_2048", 0.02, 0.03, "triton:cfg")
    now = offline("64_64_1024", 0.030, 0.030, "vendor:cublaslt_autotuned_tn")
    cells = mod.against(now, before)
    assert [(c["mnk"], c["protocol"]) for c in cells] == [("64_64_1024", "offline")]
    assert math.isclose(cells[0]["new"], 1.0) and math.isclose(cells[0]["old"], 0.75)
    assert cells[0]["served_old"].startswith("vendor:torch")
    a, b = _write(tmp_path / "now.csv", now), _write(tmp_path / "before.csv", before)
    assert mod.main([str(a), "--against", str(b)]) == 0
    assert "| offline | fp16 | 1 | 1.0000 | 0.7500 | 1.3333 |" in capsys.readouterr().out
    assert mod.main([str(a)]) == 2  # nothing to report without --against or --offline


def test_supersede_replaces_whole_cells_in_order(mod, tmp_path, capsys):
    """--supersede: a later pass's cells replace every row of those cells (first run and rechecks), measure and
    offline rows alike, in the order given; cells it lacks keep the earlier pass's rows; new cells are added."""
    earlier = (_shape("64_128_512", 1.0, 0.9, served="vendor:cublas_tn", rechecks=[(1.0, 0.9)] * 3)
               + _shape("64_64_64", 1.0, 1.1))
    later = _shape("64_128_512", 1.0, 1.2) + _shape("128_128_128", 1.0, 1.0, protocol="cold")
    rows, n = mod.supersede(earlier, later)
    assert n == 1
    assert not [r for r in rows if r["mnk"] == "64_128_512" and r.get("recheck")]  # the old rechecks went too
    rat = mod.ratios(rows, "gemmrl", "vendor_best")
    assert math.isclose(rat[("graph", "fp16", "fp32", "64_128_512")], 1.2)
    assert math.isclose(rat[("graph", "fp16", "fp32", "64_64_64")], 1.1)
    assert ("cold", "fp16", "fp32", "128_128_128") in rat
    a = _write(tmp_path / "earlier.csv", earlier)
    b = _write(tmp_path / "later.csv", later)
    c = _write(tmp_path / "latest.csv", _shape("64_128_512", 1.0, 1.05))
    off_old = _write(tmp_path / "off.csv", [_row("64_64_64", "cublaslt_autotuned", 0.02, "offline"),
                                            _row("64_64_64", "gemmrl", 0.02, "offline", "eager=vendor:torch")])
    off_new = _write(tmp_path / "off_new.csv", [_row("64_64_64", "cublaslt_autotuned", 0.02, "offline"),
                                                _row("64_64_64", "gemmrl", 0.01, "offline", "eager=triton:cfg")])
    assert mod.main([str(a), "--offline", str(off_old), "--supersede", str(b), str(c), str(off_new)]) == 0
    out = capsys.readouterr().out
    assert "later.csv (supersedes 1 cells)" in out and "latest.csv (supersedes 1 cells)" in out
    assert "off_new.csv (supersedes 1 cells)" in out
    assert "| graph | fp16 | all | 2 | 1.0747 |" in out  # sqrt(1.05 * 1.1): the latest pass wins its cell
    assert "below 0.98" in out and "64_128_512 (graph" not in out  # the earlier pass's loser is gone
    assert "statistic over 1 shapes" in out and ": 2.0000 (bar 1.07)" in out


def test_against_a_splice_reads_its_sources_and_supersedes_in_order(mod, tmp_path, capsys):
    """--against-splice SPLICE.md: the earlier pass is the splice that markdown names (its measure and offline files,
    then the superseding passes in order), so a pass over a few shapes compares with the grid as it stood; the new
    pass's offline rows (--offline) are compared too."""
    first = _write(tmp_path / "m.csv", _shape("64_64_2048", 1.0, 1.0) + _shape("64_64_4096", 1.0, 1.1))
    off = _write(tmp_path / "off.csv", [_row("64_64_2048", "cublaslt_autotuned", 0.02, "offline"),
                                        _row("64_64_2048", "gemmrl", 0.02, "offline", "eager=vendor:torch")])
    later = _write(tmp_path / "later.csv", _shape("64_64_2048", 1.0, 1.05, served="tiny:a"))
    assert mod.main([str(first), "--offline", str(off), "--supersede", str(later), "--md",
                     str(tmp_path / "splice.md")]) == 0
    base, sup = mod.splice_sources(tmp_path / "splice.md")
    assert base == [first, off] and sup == [later]
    now = _write(tmp_path / "now.csv", _shape("64_64_2048", 1.0, 1.26, served="tiny:b"))
    now_off = _write(tmp_path / "now_off.csv", [_row("64_64_2048", "cublaslt_autotuned", 0.02, "offline"),
                                                _row("64_64_2048", "gemmrl", 0.01, "offline", "eager=tiny:b")])
    capsys.readouterr()
    assert mod.main([str(now), "--offline", str(now_off), "--against-splice", str(tmp_path / "splice.md")]) == 0
    out = capsys.readouterr().out
    assert "Against the earlier pass splice.md" in out
    assert "| graph | fp16 | 64_64_2048 | 1.260 | 1.050 | 1.200 |" in out  # against the superseding pass, not 1.0
    assert "| offline | fp16 | 64_64_2048 | 2.000 | 1.000 | 2.000 |" in out
    with pytest.raises(SystemExit):
        mod.main([str(now), "--against", str(first), "--against-splice", str(tmp_path / "splice.md")])
    (tmp_path / "later.csv").unlink()
    with pytest.raises(SystemExit, match="not beside it"):
        mod.splice_sources(tmp_path / "splice.md")
