"""benchmarks/acceptance/gpu_run_focus.sh: a GPU run that asks for a targeted stage skips the default sweep and repeat stages
(they would take ~570 of the call's 600 s) unless asked for; a plain run runs them as before."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "acceptance" / "gpu_run_focus.sh"
STAGE_VARS = ("PDL_PROBE", "COLD_ANATOMY", "PACE_PROBE", "FAMILIES", "LOOP", "ADVERSARIAL", "DASK", "HEADROOM", "WGMMA",
              "TINY", "EFFREM", "NCU_SPECS", "PROBE_SPECS", "TRITON_SHAPES", "SERVE_SHAPES", "CUDA_SOURCE",
              "MERGE_LIB", "GPU_TESTS", "PYTEST_K", "SWEEP", "REPEAT", "SKIP_SWEEP", "SKIP_REPEAT")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def focus(**env: str) -> tuple[str, str, str]:
    """(targeted_stages, SKIP_SWEEP, SKIP_REPEAT) after sourcing the script with ``env`` (and none of the stage variables
    of the calling environment)."""
    base = {k: v for k, v in os.environ.items() if k not in STAGE_VARS}
    out = subprocess.run(["bash", "-c", f'. "{SCRIPT}"; printf "%s|%s|%s" "$targeted_stages" "${{SKIP_SWEEP-unset}}" '
                          '"${SKIP_REPEAT-unset}"'], env={**base, **env}, capture_output=True, text=True, check=True)
    return tuple(out.stdout.split("|"))


def test_plain_run_runs_sweep_and_repeat():
    assert focus() == ("", "unset", "unset")


@pytest.mark.parametrize("env", [{"FAMILIES": "1"}, {"TRITON_SHAPES": "benchmarks/shapes/models114_m16.txt"},
                                 {"TINY": "1", "MERGE_LIB": "lib.json.gz"}, {"NCU_SPECS": "64_64_64:vendor:x"},
                                 {"GPU_TESTS": "tests/kernels/test_tiny_gemm.py"}], ids=lambda e: "+".join(e))
def test_targeted_run_skips_sweep_and_repeat(env):
    got, sweep, repeat = focus(**env)
    assert got.split() == [k for k in STAGE_VARS if k in env]
    assert (sweep, repeat) == ("1", "1")


def test_flag_set_to_zero_is_not_a_target():
    assert focus(FAMILIES="0", WGMMA="0", TRITON_SHAPES="") == ("", "unset", "unset")


@pytest.mark.parametrize("env,want", [({"SWEEP": "1"}, ("unset", "1")), ({"REPEAT": "1"}, ("1", "unset")),
                                      ({"SKIP_SWEEP": "0"}, ("0", "1")), ({"SKIP_REPEAT": "0"}, ("1", "0"))])
def test_asked_for_stages_stay_on_in_a_targeted_run(env, want):
    assert focus(TINY="1", **env)[1:] == want
