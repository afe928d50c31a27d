"""benchmarks/acceptance/family_table.py: the families against vendor_best from a re-measure, the family picked per shape from the
selection runs alone (never from the numbers it is judged on), the markdown and the plot."""

from __future__ import annotations


import pytest

from gemmrl.results import ResultsWriter
from conftest import script_module

SHAPES = ("64_64_64", "4096_4096_4096")


def _load():
    return script_module("family_table")


def _row(mnk, cand, proto, ms, **kw):
    return {"mnk": mnk, "dtype": "fp16", "acc": "fp32", "layout": "tn", "candidate": cand, "protocol": proto,
            "time_ms": ms, "verified": "true", "rep": 0, **kw}


@pytest.fixture
def files(tmp_path):
    rem, tsel, csel = tmp_path / "rem.csv", tmp_path / "tsel.csv", tmp_path / "csel.csv"
    rows, t, c = [], [], []
    for mnk in SHAPES:
        # re-measure: CUTLASS 1.25x in graph and 0.8x in cold, Triton the other way round
        rows += [_row(mnk, "vendor_best", "graph", 1.0), _row(mnk, "vendor_best", "cold", 2.0),
                 _row(mnk, "cutlass-sel:cold+graph", "graph", 0.8, algo="cfg_c"),
                 _row(mnk, "cutlass-sel:cold+graph", "cold", 2.5, algo="cfg_c"),
                 _row(mnk, "triton-sel:cold+graph", "graph", 1.25, algo="cfg_t"),
                 _row(mnk, "triton-sel:cold+graph", "cold", 1.6, algo="cfg_t")]
        # the selection runs agree on which family leads (CUTLASS in graph, Triton in cold)
        for proto, ct, tt in (("graph", 0.8, 1.2), ("cold", 1.2, 0.8)):
            c += [_row(mnk, "cutlass:cfg_c", proto, ct, algo="cfg_c", info="screen"),
                  _row(mnk, "cublas_tn", proto, 1.0, info="screen")]
            t += [_row(mnk, "triton:cfg_t", proto, tt, algo="cfg_t", info="screen"),
                  _row(mnk, "cublas_tn", proto, 1.0, info="screen")]
    for path, rs in ((rem, rows), (tsel, t), (csel, c)):
        ResultsWriter(path).write_batch(rs)
    return rem, tsel, csel


def _table(out: str) -> dict:
    got = {}
    for line in out.splitlines():
        cells = [x.strip() for x in line.strip("|").split("|")]
        if len(cells) == 9 and cells[0] in ("graph", "cold") and cells[2].isdigit():
            got[(cells[0], cells[1])] = (int(cells[2]), float(cells[3]))
    return got


def test_families_the_pick_and_the_plot(files, tmp_path, capsys):
    rem, tsel, csel = files
    md, png = tmp_path / "t.md", tmp_path / "t.png"
    assert _load().main([str(rem), "--triton-select", str(tsel), "--cutlass-select", str(csel), "--md", str(md),
                         "--png", str(png)]) == 0
    got = _table(capsys.readouterr().out)
    assert got[("graph", "CUTLASS, all shapes")] == (2, 1.25) and got[("cold", "CUTLASS, all shapes")] == (2, 0.8)
    assert got[("graph", "CUTLASS, all dims >= 4096")] == (1, 1.25)
    assert got[("graph", "Triton, all shapes")] == (2, 0.8) and got[("cold", "Triton, all shapes")] == (2, 1.25)
    # picked from the selection runs: CUTLASS in graph, Triton in cold
    assert got[("graph", "better family (picked on the selection runs)")] == (2, 1.25)
    assert got[("cold", "better family (picked on the selection runs)")] == (2, 1.25)
    assert "| graph | 64_64_64 | 1000.00 () | 1.250 | 0.800 | cutlass | cfg_c |" in md.read_text()
    assert png.stat().st_size > 10_000


def test_the_pick_follows_the_selection_runs_not_the_remeasure(files, capsys):
    """Selection runs that point at the other family (the files passed swapped): the pick follows them and the
    re-measure shows the loss; only the biased best-of-2 line still sees the better one."""
    rem, tsel, csel = files
    assert _load().main([str(rem), "--triton-select", str(csel), "--cutlass-select", str(tsel)]) == 0
    got = _table(capsys.readouterr().out)
    for proto in ("graph", "cold"):
        assert got[(proto, "better family (picked on the selection runs)")] == (2, 0.8)
        assert got[(proto, "max of the two re-measured (best-of-2, biased)")] == (2, 1.25)
