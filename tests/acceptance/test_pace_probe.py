"""benchmarks/acceptance/pace_probe.py: the probe kernels build with nvcc, export the entries the script calls and list their
instantiations (each a known method, whole 16-byte chunks per thread, a ring that fits the opt-in shared memory);
the per-step arithmetic (CPU; the timing is GPU work)."""
import ctypes

import pytest

from conftest import script_module


def _probe():
    return script_module("pace_probe")


@pytest.mark.parametrize("short_ms, long_ms, want_us", [(0.002, 0.0132, 0.2), (0.003, 0.003, 0.0), (0.01, 0.066, 1.0)])
def test_per_step_is_the_difference_over_the_extra_steps(short_ms, long_ms, want_us):
    mod = _probe()
    assert mod.per_step(short_ms, long_ms) == pytest.approx(want_us)


def test_launches_fill_their_clusters():
    mod = _probe()
    for grid, cluster in mod.LAUNCHES:
        assert grid % cluster == 0 and cluster <= 16
    assert mod.STEPS[0] < mod.STEPS[1] <= 4096 // 64


def test_probe_kernels_build_and_list_valid_instantiations(sm90_build):
    mod = _probe()
    lib = mod.build()
    raw = (ctypes.c_int * 256)()
    n = lib.pace_configs(ctypes.addressof(raw))
    configs = [tuple(raw[4 * i:4 * i + 4]) for i in range(n)]
    assert n >= 3 and {c[0] for c in configs} == set(mod.METHODS)
    assert [lib.pace_kc(m) for m in sorted(mod.METHODS)] == [1, 1, 1, 4, 4]  # K chunks a step, by method
    for method, rows, threads, stages in configs:
        assert rows * 8 % threads == 0 and (rows // 2) <= 256
        row_bytes = 128 if method in mod.TMA else 144
        assert 1024 + stages * rows * row_bytes * lib.pace_kc(method) + 8 * stages <= 232448
        if method in (3, 4):  # each box (half the rows, 4 chunks) starts 1024-aligned for the 128-byte swizzle
            assert (rows // 2) * 128 * 4 % 1024 == 0
    # a combination not instantiated is refused before any launch (no GPU needed for that path)
    assert lib.pace_run(0, 48, 64, 3, 8, 1, 8, None, 2048, None, None, None) == 1  # cudaErrorInvalidValue
    assert lib.pace_run(0, 48, 64, 4, 8, 1, 65, None, 2048, None, None, None) == 1  # steps past the buffer
    assert lib.pace_make_map(None, None, 2048, 24, 1) == -2  # no tensor map for a cp.async method
