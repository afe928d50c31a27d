"""The native-build toolchain (gemmrl.kernels.toolchain): arch resolution, -gencode flags, ptxas reports, build
logs, include versions and cache keys. CPU only: the nvcc run here is a shell script that prints a version."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gemmrl.kernels import toolchain as tc


@pytest.fixture
def no_arch_env(monkeypatch):
    monkeypatch.delenv(tc.ARCH_ENV, raising=False)
    monkeypatch.delenv(tc.ARCH_ENV_ALIAS, raising=False)
    return monkeypatch


# -- the target arch ---------------------------------------------------------------------------------------
def test_arch_from_the_env_var(no_arch_env):
    for spelled in ("90a", "sm_90a", "9.0a"):
        no_arch_env.setenv("GEMMRL_CUDA_ARCH", spelled)
        assert tc.arch_for() == "90a"
    no_arch_env.setenv("GEMMRL_CUDA_ARCH", "sm_80")
    assert tc.arch_for() == "80"


def test_arch_from_the_older_alias(no_arch_env):
    no_arch_env.setenv("GEMMRL_IMPORT_ARCH", "sm_90a")
    assert tc.arch_for() == "90a"
    no_arch_env.setenv("GEMMRL_IMPORT_ARCH", "9.0a")
    assert tc.arch_for() == "90a"
    no_arch_env.setenv("GEMMRL_CUDA_ARCH", "100a")  # the current name wins over the alias
    assert tc.arch_for() == "100a"


def test_explicit_arch_wins_over_the_env(no_arch_env):
    no_arch_env.setenv("GEMMRL_CUDA_ARCH", "80")
    no_arch_env.setenv("GEMMRL_IMPORT_ARCH", "86")
    assert tc.arch_for(arch="90a") == "90a"
    assert tc.arch_for(arch="sm_90a") == "90a"
    assert tc.arch_for(arch=None) == "80"
    assert tc.arch_for(arch="") == "80"


def test_no_arch_and_no_gpu_is_a_clear_error(no_arch_env):
    torch = pytest.importorskip("torch")
    no_arch_env.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="set GEMMRL_CUDA_ARCH"):
        tc.arch_for()


def test_gencode_flags():
    assert tc.gencode("90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert tc.gencode("80") == "-gencode=arch=compute_80,code=sm_80"
    assert tc.gencode(tc.arch_for(arch="sm_100a")) == "-gencode=arch=compute_100a,code=sm_100a"


# -- nvcc --------------------------------------------------------------------------------------------------
def _fake_nvcc(path: Path, version_line: str) -> Path:
    path.write_text(f'#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\necho "{version_line}"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_nvcc_order_and_nothing_found(tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "DEFAULT_CUDA_ROOTS", (str(tmp_path / "nocuda"),))
    assert tc.find_nvcc({"PATH": ""}) == ""
    (tmp_path / "p").mkdir()
    (tmp_path / "home" / "bin").mkdir(parents=True)
    on_path = _fake_nvcc(tmp_path / "p" / "nvcc", "x")
    home = _fake_nvcc(tmp_path / "home" / "bin" / "nvcc", "x")
    pinned = _fake_nvcc(tmp_path / "pinned", "x")
    assert tc.find_nvcc({"PATH": str(on_path.parent)}) == str(on_path)
    assert tc.find_nvcc({"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "home")}) == str(home)
    assert tc.find_nvcc({"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "home"),
                         "GEMMRL_NVCC": str(pinned)}) == str(pinned)


def test_nvcc_version(tmp_path):
    nvcc = _fake_nvcc(tmp_path / "nvcc", "Cuda compilation tools, release 13.0, V13.0.88")
    assert tc.nvcc_version(str(nvcc)) == "13.0.88"
    assert tc.nvcc_version_text(str(nvcc)).endswith("release 13.0, V13.0.88")
    odd = _fake_nvcc(tmp_path / "odd", "no version here")
    assert tc.nvcc_version(str(odd)).endswith("no version here")


# -- reports -----------------------------------------------------------------------------------------------
PTXAS = ("ptxas info    : Compiling entry function '_Z1fv' for 'sm_90a'\n"
         "ptxas info    : Used 128 registers, used 1 barriers, 49152 bytes smem\n"
         "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
         "ptxas info    : Used 40 registers, 1024 bytes smem\n"
         "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
         "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due "
         "to wgmma pipeline crossing function boundary at a function call in the function '_Z1fv'\n")
C7510 = ("C7510: wgmma.mma_async instructions are serialized due to wgmma pipeline crossing function boundary at a "
         "function call")


def test_ptxas_report():
    p = tc.Ptxas.parse(PTXAS)
    assert p == tc.Ptxas(kernels=2, max_registers=128, spill_store_bytes=8, spill_load_bytes=4, smem_bytes=49152,
                         perf_warnings=(C7510,))
    assert p.as_record() == {"kernels": 2, "max_registers": 128, "spill_store_bytes": 8, "spill_load_bytes": 4,
                             "smem_bytes": 49152, "perf_warnings": [C7510]}
    # an imported kernel's record (cuda_l2_import): the same counts, no shared memory
    assert list(p.as_record(smem=False)) == ["kernels", "max_registers", "spill_store_bytes", "spill_load_bytes",
                                             "perf_warnings"]
    assert tc.Ptxas.parse("") == tc.Ptxas()
    assert tc.Ptxas.parse("ptxas info    : Used 12 registers\n").max_registers == 12


def test_ptxas_report_is_the_same_for_both_builders():
    from gemmrl.kernels import cuda_source

    assert cuda_source.Ptxas is tc.Ptxas


def test_build_log_first_error():
    log = ("[1/3] /usr/local/cuda/bin/nvcc -c kernel.cu ...\n"
           "/cache/b/kernel.cu(12): error: expected a \";\"\n  int x = 1\n")
    assert tc.parse_build_log(log, "/cache/b", "/k/64_64_64.cu") == {
        "stage": "compile", "file": "/k/64_64_64.cu", "line": 12, "message": 'expected a ";"'}
    assert tc.parse_build_log("something odd happened\n")["stage"] == "build"
    assert tc.log_head("[1/2] nvcc " + "x" * 50 + "\nline a\n\nline b\n") == "line a\nline b"


# -- headers -----------------------------------------------------------------------------------------------
def test_include_version_keys_cutlass_by_version_h_and_wheel_path(tmp_path):
    inc = tmp_path / "include"
    (inc / "cutlass").mkdir(parents=True)
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n")
    wheel = tmp_path / "a" / "cutlass_library" / "source" / "tools" / "util" / "include"
    v = tc.include_version([str(inc), str(wheel), "/some/dir"])
    parts = v.split(";")
    assert len(parts[0]) == 12 and parts[1] == "cutlass_library/source/tools/util/include" and parts[2] == "/some/dir"
    moved = tmp_path / "b" / "cutlass_library" / "source" / "tools" / "util" / "include"
    assert tc.include_version([str(inc), str(moved)]) == ";".join(parts[:2])  # the wheel elsewhere: same key
    (inc / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 3\n")
    assert tc.include_version([str(inc)]) != parts[0]
    assert tc.cutlass_version([inc]).startswith("4.3@")
    assert tc.cutlass_version([]) == ""


def test_missing_cutlass_gives_the_clear_message(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cutlass_library", None)
    monkeypatch.delenv("CUTLASS_DIR", raising=False)
    with pytest.raises(tc.CutlassNotFound, match=r"pip install nvidia-cutlass.*CUTLASS_DIR"):
        tc.include_dirs(["cutlass"])
    (tmp_path / "include" / "cutlass").mkdir(parents=True)
    (tmp_path / "include" / "cutlass" / "cutlass.h").write_text("")
    monkeypatch.setenv("CUTLASS_DIR", str(tmp_path))
    assert tc.include_dirs(["cutlass", "rel"]) == [str(tmp_path / "include"),
                                                   str(tmp_path / "tools" / "util" / "include"),
                                                   str(Path("rel").resolve())]


# -- cache keys --------------------------------------------------------------------------------------------
def test_digest_is_stable_and_changes_with_any_input():
    parts = ["1", "__global__ void k() {}", "-O3\0-std=c++17", "-DX=1", "90a", "13.0.88", "abc123def456"]
    k = tc.digest(parts, 24)
    assert k == tc.digest(list(parts), 24) and len(k) == 24 and tc.digest(parts, 20) == k[:20]
    # the known value: a prebuilt cache keyed by it must still be found
    assert tc.digest(["a", "b"], 24) == "023b8059a924f728a2155e4c"
    seen = {k}
    for i in range(len(parts)):
        changed = tc.digest(parts[:i] + [parts[i] + "x"] + parts[i + 1:], 24)
        assert changed not in seen, i
        seen.add(changed)
    assert tc.digest(["ab", "c"], 24) != tc.digest(["a", "bc"], 24)  # parts are separated
    assert tc.digest(parts + [""], 24) not in seen


def test_cuda_source_key_changes_with_each_input(monkeypatch):
    from gemmrl.kernels import cuda_source as cs

    monkeypatch.setattr(cs, "nvcc_version", lambda nvcc: {"nvcc-a": "13.0.88", "nvcc-b": "13.1.0"}[nvcc])
    src = cs.CudaSource("__global__ void k() {}", flags=("-DX=1",))
    k = cs.build_key(src, "90a", "nvcc-a", [])
    assert k == cs.build_key(cs.CudaSource("__global__ void k() {}", flags=("-DX=1",)), "90a", "nvcc-a", [])
    others = {cs.build_key(cs.CudaSource("__global__ void k() { }", flags=("-DX=1",)), "90a", "nvcc-a", []),
              cs.build_key(cs.CudaSource("__global__ void k() {}", flags=("-DX=2",)), "90a", "nvcc-a", []),
              cs.build_key(src, "100a", "nvcc-a", []), cs.build_key(src, "90a", "nvcc-b", []),
              cs.build_key(src, "90a", "nvcc-a", ["/some/include"])}
    assert k not in others and len(others) == 5


def test_import_runs_nothing():
    code = "import sys, gemmrl.kernels.toolchain; print('torch' in sys.modules, 'cutlass_library' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
