"""benchmarks/acceptance/selection_compare_plot.py: two the Triton-family bar re-measures side by side, per shape and protocol, on the committed
runs of the GEMV run and the traffic probe (their geomeans are the notes' figures) and refusing runs with no shape in common."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import script_module

ROOT = Path(__file__).resolve().parents[2]
R = ROOT / "benchmarks" / "results" / "h100"
GEMV_RUN = R / "h100_small72_tiny12-gemv_triton-selected-remeasure_graph-cold_bc80862926af_2026-11-26.csv.gz"
TWOPASS_RUN = R / "h100_small72_tiny12-cm30_triton-selected-remeasure_graph-cold_afd0b7355f79_2026-11-26.csv.gz"
REST = R / "h100_rest48_final_triton-selected-remeasure_graph-cold_2f06d09708b3_2026-11-26.csv.gz"


def _load():
    return script_module("selection_compare_plot")


def test_the_small_class_before_and_after_the_refit(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "cmp.png"
    assert _load().main([str(GEMV_RUN), str(TWOPASS_RUN), "--out", str(out), "--labels", "gemv,twopass"]) == 0
    text = capsys.readouterr().out
    assert "graph: 72 shapes, geomean gemv 0.980, twopass 0.999" in text
    assert "cold: 72 shapes, geomean gemv 0.980, twopass 0.986" in text
    assert out.stat().st_size > 10_000


def test_runs_without_a_shape_in_common_are_refused(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit):
        _load().main([str(GEMV_RUN), str(REST), "--out", str(tmp_path / "x.png")])
