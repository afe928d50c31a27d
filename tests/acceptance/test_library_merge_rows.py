"""benchmarks/acceptance/library_merge_rows.py: the rows a generated-only library merge takes from a new family's runs."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from gemmrl.results import COLUMNS, ResultsWriter
from conftest import script_module

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "acceptance"


@pytest.fixture(scope="module")
def mod():
    sys.path.insert(0, str(SCRIPTS))  # it imports library_measure's splice
    return script_module("library_merge_rows")


def _row(mnk, cand, time_ms, protocol="graph", algo="", **kw):
    r = {c: "" for c in COLUMNS}
    m, n, k = mnk.split("_")
    r.update(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate=cand, protocol=protocol, time_ms=str(time_ms),
             n="10", verified="true", floor_ok="true", rep="0", gpu="H100", algo=algo, M=m, N=n, K=k, timestamp="t")
    r.update(kw)
    return r


def _write(tmp_path, name, rows):
    p = tmp_path / name
    ResultsWriter(p).write_batch(rows)
    return str(p)


def test_remeasured_keeps_cells_the_library_entry_served_later_files_win(mod, tmp_path):
    served = "eager=vendor:cublas_tn (cold entry x); graph=cutlass:cfg (graph entry x); hot=c"
    lost = "eager=vendor:cublas_tn (cold entry x); graph=torch.matmul (entry cutlass:cfg not served: X); hot=c"
    a = _write(tmp_path, "a.csv", [_row("64_64_1024", "gemmrl", 0.004, algo=served),
                                   _row("64_64_1024", "tiny-sel:graph", 0.003, algo="32x32_s8_st4_fp16"),
                                   _row("64_64_2048", "gemmrl", 0.005, algo=lost),
                                   _row("64_64_2048", "tiny-sel:graph", 0.003, algo="32x32_s8_st4_fp16")])
    b = _write(tmp_path, "b.csv", [_row("64_64_1024", "gemmrl", 0.0041, algo=served),
                                   _row("64_64_1024", "tiny-sel:graph", 0.0035, algo="16x32_s8_st4_fp16")])
    rows = mod.remeasured([a, b])
    assert {r["mnk"] for r in rows} == {"64_64_1024"}  # 64_64_2048: its CUTLASS entry was not served
    assert [r["algo"] for r in rows if r["candidate"].startswith("tiny")] == ["16x32_s8_st4_fp16"]  # b's


def test_screened_keeps_cells_that_beat_the_measured_library_by_the_margin(mod, tmp_path):
    measure = _write(tmp_path, "m.csv", [_row(s, c, t) for s, c, t in (
        ("64_64_1024", "gemmrl", 0.0034), ("64_64_1024", "vendor_best", 0.0034),      # library 1.00
        ("64_64_2048", "gemmrl", 0.0040), ("64_64_2048", "vendor_best", 0.0046))])    # library 1.15
    later = _write(tmp_path, "l.csv", [_row("64_64_2048", "gemmrl", 0.0046), _row("64_64_2048", "vendor_best", 0.0046)])
    screen = _write(tmp_path, "s.csv", [_row(s, c, t, verified=v) for s, c, t, v in (
        ("64_64_1024", "tiny:a", 0.0030, "true"), ("64_64_1024", "cublas_tn", 0.0034, "true"),   # 1.133: kept
        ("64_64_2048", "tiny:a", 0.0043, "true"), ("64_64_2048", "tiny:b", 0.0020, "false"),     # a failed check
        ("64_64_2048", "cublas_nn", 0.0046, "true"))])                                            # 1.07 vs 1.00
    sp = mod.measured_speedups([measure])
    assert sp[("graph", "fp16", "fp32", "64_64_2048")] == pytest.approx(1.15)
    rows, why = mod.screened(screen, sp, "tiny:", 1.04)
    assert {r["mnk"] for r in rows} == {"64_64_1024"}  # 1.07 does not beat 1.15 by 4%
    rows, why = mod.screened(screen, mod.measured_speedups([measure], [later]), "tiny:", 1.04)
    assert {k[3] for k, *_ in why} == {"64_64_1024", "64_64_2048"}  # the later pass put the library at 1.00 there
    assert mod.main(["screened", screen, "--splice", measure, "--margin", "2", "--out", str(tmp_path / "o.csv")]) == 1
    assert mod.main(["screened", screen, "--splice", measure, "--out", str(tmp_path / "o.csv")]) == 0
    assert {r["mnk"] for r in csv.DictReader(open(tmp_path / "o.csv"))} == {"64_64_1024"}


def test_splice_md_reads_the_measure_files_in_order_and_writes_the_shapes(mod, tmp_path):
    measure = _write(tmp_path, "m_graph-cold.csv", [_row(s, c, t) for s, c, t in (
        ("64_64_1024", "gemmrl", 0.0034), ("64_64_1024", "vendor_best", 0.0034),
        ("64_64_2048", "gemmrl", 0.0040), ("64_64_2048", "vendor_best", 0.0046))])
    later = _write(tmp_path, "l_graph-cold.csv", [_row("64_64_2048", "gemmrl", 0.0046),
                                                   _row("64_64_2048", "vendor_best", 0.0046)])
    off = _write(tmp_path, "o_offline.csv", [_row("64_64_2048", "gemmrl", 0.1, protocol="offline")])
    md = tmp_path / "splice.md"
    md.write_text(f"Sources: {Path(measure).name}, {Path(off).name}, {Path(later).name} (supersedes 2 cells)\n\n| x |\n")
    assert mod.splice_sources(md) == [measure, later]  # offline left out, order kept
    screen = _write(tmp_path, "s.csv", [_row(s, c, t) for s, c, t in (
        ("64_64_1024", "tiny:a", 0.0030), ("64_64_1024", "cublas_tn", 0.0034),
        ("64_64_2048", "tiny:a", 0.0043), ("64_64_2048", "cublas_nn", 0.0046))])
    shapes = tmp_path / "shapes.txt"
    assert mod.main(["screened", screen, "--splice-md", str(md), "--out", str(tmp_path / "o.csv"),
                     "--shapes-out", str(shapes)]) == 0
    assert shapes.read_text() == "64_64_1024\n64_64_2048\n"  # the later pass put the library at 1.00 at 2048


@pytest.mark.parametrize("text,why", [("| no sources |\n", "no 'Sources: ...' first line"),
                                      ("", "no 'Sources: ...' first line"), (None, "no such file"),
                                      ("Sources: gone_graph-cold.csv.gz\n", "not beside it: ")])  # library_measure's
def test_splice_md_says_what_is_wrong(mod, tmp_path, text, why):
    md = tmp_path / "splice.md"
    if text is not None:
        md.write_text(text)
    with pytest.raises(SystemExit, match=why):
        mod.splice_sources(md)
    with pytest.raises(SystemExit):  # --supersede beside --splice-md is refused
        mod.main(["screened", "s.csv", "--splice-md", str(md), "--supersede", "x.csv", "--out", str(tmp_path / "o")])
