"""scripts/write_floor_probe.py: only C-write-bound shapes are taken (CPU; the timing is GPU work)."""
import argparse
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _probe():
    spec = importlib.util.spec_from_file_location("write_floor_probe", ROOT / "scripts" / "write_floor_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_default_shapes_are_c_write_bound():
    mod = _probe()
    assert mod.SHAPES
    for mnk in mod.SHAPES:
        assert mod.checked_shape(mnk) == mnk


@pytest.mark.parametrize("mnk", ["64_64_4096", "4096_4096_4096", "128_16384_8192"])
def test_operand_bound_shapes_are_refused_with_a_reason(mnk):
    mod = _probe()
    with pytest.raises(argparse.ArgumentTypeError, match="does not outweigh"):
        mod.checked_shape(mnk)


def test_a_bad_shape_stops_the_parser_before_any_gpu_work(capsys):
    mod = _probe()
    with pytest.raises(SystemExit):
        mod.main(["--shapes", "4096_4096_4096"])
    assert "C-write-bound" in capsys.readouterr().err
