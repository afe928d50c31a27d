"""`gemmrl bench` without a CUDA GPU: the Triton kernels it would time are verified under the interpreter, the output
says that timing needs a GPU, and the exit code is 0 only when every kernel passed the battery (cli/cpu_bench.py).
The README's first command is run verbatim (its `gemmrl ...` part) and must pass here."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HAS_CUDA, ROOT
from gemmrl.adversarial.planted import planted_candidates
from gemmrl.cli import cpu_bench
from gemmrl.cli.main import main
from gemmrl.problem import parse_mnk

pytestmark = [pytest.mark.skipif(HAS_CUDA, reason="the no-GPU path of bench; this machine has a GPU, bench times"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _readme_command() -> list[str]:
    """The `gemmrl ...` command of the README's first line (after `&&`, before the comment)."""
    first = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "gemmrl bench" in ln)
    cmd = first.split("&&", 1)[1].split("#", 1)[0].split()
    assert cmd[0] == "gemmrl", first
    return cmd


@pytest.mark.interpreter
@pytest.mark.parametrize("mnk,dtype", [("64_256_64", "fp16"), ("33_65_129", "bf16"), ("1_512_256", "fp16")])
def test_bench_verifies_on_cpu(mnk, dtype, capsys):
    pytest.importorskip("triton")
    code = main(["bench", "--mnk", mnk, "--dtype", dtype, "--triton-top", "1", "--protocol", "graph"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "timing needs a CUDA GPU" in out and "under Triton's interpreter" in out
    assert re.search(rf"{mnk}  PASS  triton:\w+\(", out), out
    assert "Verified 1 of 1 kernel(s)" in out and "needs a CUDA GPU: timing (graph) and the vendor paths" in out


@pytest.mark.interpreter
@pytest.mark.parametrize("mode,check", [("correct", ""), ("fp16_acc", "accuracy"), ("skip_last_k", "exact_int"),
                                        ("partial_write", "nan_fill")])
def test_bench_cpu_exit_code_follows_the_battery(mode, check, capsys):
    """A wrong kernel fails with the check that caught it and exit code 1; the correct one passes with 0."""
    pytest.importorskip("triton")
    cand = next(c for c in planted_candidates("nn") if c.mode == mode)
    plan = cpu_bench.CpuPlan((parse_mnk("40_48_160"),), (lambda p: [cand],), "planted kernels", (), ("timing",))
    code = cpu_bench.run(plan)
    out = capsys.readouterr().out
    if not check:
        assert code == 0 and "PASS  planted_correct_nn" in out
    else:
        assert code == 1 and f"FAIL  planted_{mode}_nn" in out and check in out, out
        assert "Verified 0 of 1 kernel(s)" in out


def test_bench_cpu_without_triton_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(cpu_bench, "has_triton", lambda: False)
    code = main(["bench", "--mnk", "64_256_64", "--triton-top", "1"])
    cap = capsys.readouterr()
    assert code == 2
    assert "needs Triton's interpreter" in cap.err and ".[triton]" in cap.err and "timing needs a CUDA GPU" in cap.err


@pytest.mark.parametrize("mnk", ["4096_4096_4096", "8192_8192_64"])
def test_bench_cpu_leaves_out_shapes_too_large_for_the_interpreter(mnk, capsys):
    pytest.importorskip("triton")
    code = main(["bench", "--mnk", mnk])
    out = capsys.readouterr().out
    assert code == 1 and f"{mnk}  left out" in out and "Nothing verified" in out


@pytest.mark.parametrize("flag,value", [("library", "x.json"), ("kernel_dir", "d"), ("cutlass_from", ["s.csv"]),
                                        ("cuda_source", ["k.cu"]), ("decode_from", ["s.csv"])])
def test_bench_cpu_names_what_needs_a_gpu(flag, value):
    args = argparse.Namespace(triton_top=0, triton_from=None, library=None, kernel_dir=None, cuda_source=None,
                              cutlass_from=None, wgmma_from=None, tiny_from=None, decode_from=None)
    setattr(args, flag, value)
    plan = cpu_bench.plan(args, [parse_mnk("64_64_64")], (), ("offline",))
    assert plan.needs_gpu == ("timing (offline) and the vendor paths", f"--{flag.replace('_', '-')}")
    assert "what --triton-top 1 times on a GPU" in plan.what


@pytest.mark.interpreter
def test_readme_first_command_passes_on_cpu():
    """The README's first command, verbatim, in a fresh process: exit 0, a kernel verified, timing named as GPU work."""
    pytest.importorskip("triton")
    cmd = _readme_command()
    out = subprocess.run([sys.executable, "-m", "gemmrl.cli", *cmd[1:]], capture_output=True, text=True,
                         timeout=300, cwd=Path(ROOT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "timing needs a CUDA GPU" in out.stdout and "PASS  triton:" in out.stdout
    assert "Traceback" not in out.stderr
