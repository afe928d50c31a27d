"""benchmarks/acceptance/costmodel_fit.py: constants held fixed, shapes left out, bad names refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import script_module

ROOT = Path(__file__).resolve().parents[2]
SCREEN = ROOT / "benchmarks" / "results" / "h100" / "h100_probe38_triton-select-top24-explore24_2026-11-22.csv.gz"


@pytest.fixture(scope="module")
def mod():
    return script_module("costmodel_fit")


def _constants(out: str) -> dict:
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_fixed_constants_stay_and_the_rest_may_move(mod, capsys):
    from gemmrl.search.costmodel import DEFAULT, CostParams
    from dataclasses import fields

    keep = [f.name for f in fields(CostParams) if f.name not in ("latency_us", "l2_latency_us")]
    mod.main([str(SCREEN), "--fit", "6", "--fixed", ",".join(keep), "--seed", "3"])
    got = _constants(capsys.readouterr().out)
    assert all(got[k] == round(getattr(DEFAULT, k), 4) for k in keep)
    for k in ("latency_us", "l2_latency_us"):  # within the search's bounds (x3 of the current value)
        assert getattr(DEFAULT, k) / 3 - 1e-4 <= got[k] <= 3 * getattr(DEFAULT, k) + 1e-4


def test_exclude_shapes_leaves_their_groups_out(mod, capsys, tmp_path):
    mod.main([str(SCREEN)])
    full = capsys.readouterr().out
    n_full = int(full.split("shapes ")[1].split()[0])
    shapes = sorted({g[0] for g in mod.groups([str(SCREEN)], ["graph", "cold"])})
    f = tmp_path / "out.txt"
    f.write_text("# held out\n" + "\n".join(shapes[:5]) + "\n")
    mod.main([str(SCREEN), "--exclude-shapes", str(f)])
    out = capsys.readouterr().out
    assert "left out the shapes of" in out
    n = int(out.split("current ")[1].split("shapes ")[1].split()[0])
    assert n < n_full


def test_an_unknown_fixed_constant_or_a_missing_shapes_file_is_refused(mod, capsys, tmp_path):
    with pytest.raises(SystemExit):
        mod.main([str(SCREEN), "--fixed", "no_such_us"])
    err = capsys.readouterr().err
    assert "no_such_us" in err and "latency_us" in err
    with pytest.raises(SystemExit):
        mod.main([str(SCREEN), "--exclude-shapes", str(tmp_path / "none.txt")])
    assert "no such file" in capsys.readouterr().err
