"""benchmarks/acceptance/lt_splits_probe.py: its roofline floor and shape files (CPU; the timing is GPU work)."""
import pytest

from conftest import script_module
from gemmrl.problem import GemmProblem


@pytest.mark.parametrize("mnk, want_us", [
    ((1, 4096, 4096), 2 * (4096 + 4096 * 4096 + 4096) / 4.8e12 * 1e6),   # memory-bound: the weight's bytes
    ((4096, 4096, 4096), 2 * 4096 ** 3 / 989e12 * 1e6),                  # compute-bound: the FLOPs
])
def test_the_floor_is_the_larger_of_bytes_and_flops(mnk, want_us):
    assert script_module("lt_splits_probe").floor_us(GemmProblem(*mnk)) == pytest.approx(want_us)


def test_shape_files_skip_comments_and_blank_lines(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("# a header\n1_14336_4096  # floor 24.47 us\n\n8_8_8\n")
    assert script_module("lt_splits_probe").shapes_of(str(f)) == ["1_14336_4096", "8_8_8"]
