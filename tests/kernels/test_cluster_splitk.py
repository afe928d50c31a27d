"""The cluster split-K CUDA kernel (kernels/csrc/cluster_splitk.cu) through the CUDA-source path: it builds for
sm_90a without spills (CPU tier, where nvcc exists), and on the GPU passes the battery and graph capture on odd and
few-tile long-K shapes, at every split its heuristic picks (1 to 16)."""

from pathlib import Path

import pytest

from conftest import assert_serves
from gemmrl.kernels import cuda_source as cs
from gemmrl.kernels import toolchain
from gemmrl.problem import GemmProblem

SRC = Path(cs.__file__).with_name("csrc") / "cluster_splitk.cu"
needs_nvcc = pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc (the CUDA toolkit) to compile")


def _source() -> cs.CudaSource:
    return cs.CudaSource(SRC.read_text(), entry="gemmrl_gemm", abi="gemmrl", layout="tn",
                         shapes=cs.ShapeRange.parse("K%8"), name="cuda:cluster_splitk")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_declares_k_multiple_of_8():
    src = _source()
    assert src.admits(GemmProblem(33, 65, 136)) and not src.admits(GemmProblem(33, 65, 129))


@needs_nvcc
def test_builds_without_spills(cache):
    b = cs.build(_source(), "90a")
    assert b.ok, b.error
    assert b.ptxas.kernels >= 5  # one kernel per split
    assert b.ptxas.spill_store_bytes == 0 and b.ptxas.max_registers <= 255


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 8), (33, 65, 136), (129, 257, 4104), (512, 256, 2048), (64, 64, 16384),
                                   (1024, 256, 4096), (300, 1000, 64)])
def test_passes_battery_and_graph(shape):
    assert_serves(_source(), GemmProblem(*shape))
