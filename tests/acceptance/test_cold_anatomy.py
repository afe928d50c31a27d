"""benchmarks/acceptance/cold_anatomy.py: the probe kernels build with nvcc and export every entry the script calls; the library's
tiny-shape Triton configs are read per protocol (CPU; the timing is GPU work)."""
import ctypes
from pathlib import Path

import pytest

from gemmrl.kernels.triton_gemm.configs import parse_config
from conftest import script_module

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "benchmarks" / "results" / "h100" / "libraries" / ("h100_grid1000_library_selection-every-vendor-host-order-tiny278-cutlass-"
                                             "k64-128-k256-512-smalllongk-fewtile-tri-mid-unscreened-generated-only_"
                                             "2026-11-27.json.gz")


def _probe():
    return script_module("cold_anatomy")


def _entry(M, N, K, protocol, family, layout="nn", algo="tiled(BM=16,BN=32,BK=64,warps=2,stages=2,group_m=1)"):
    return {"M": M, "N": N, "K": K, "protocol": protocol, "family": family, "layout": layout, "algo": algo}


def _library(entries: list[dict]):
    """A library of these entries in gemmrl's own format (the fields the probe does not read filled in)."""
    from gemmrl.library import Entry, Library

    return Library(Entry.from_dict({"gpu": "NVIDIA H100 80GB HBM3", "cc": "9.0", "dtype": "fp16", "acc": "fp32",
                                    "impl": e["algo"], "time_ms": 1.0, "vendor_best_ms": 1.0,
                                    "vendor_best": "cublaslt_autotuned_tn", "m_lo": e["M"], "m_hi": e["M"],
                                    "verified": True, "members": [], **e}) for e in entries)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_library_configs_takes_the_first_triton_entry_per_shape_and_protocol(tmp_path, suffix):
    mod = _probe()
    entries = [_entry(64, 64, 64, "graph", "vendor", "tn", "cublaslt_autotuned_tn"),
               _entry(64, 64, 64, "graph", "triton"),
               _entry(64, 64, 64, "graph", "triton", "tn", "tiled(BM=32,BN=32,BK=64,warps=4,stages=3,group_m=1)"),
               _entry(64, 64, 64, "cold", "triton", "tn", "tiled(BM=16,BN=64,BK=128,warps=2,stages=2,group_m=1)"),
               _entry(4096, 4096, 4096, "graph", "triton")]  # not a tiny shape: left out
    path = _library(entries).save(tmp_path / f"lib.json{suffix}")
    got = mod.library_configs(str(path))
    assert got == {("64_64_64", "graph"): ("nn", entries[1]["algo"]), ("64_64_64", "cold"): ("tn", entries[3]["algo"])}
    assert mod.library_configs(None) == {}


@pytest.mark.skipif(not LIBRARY.is_file(), reason="the committed grid library is not in this checkout")
def test_the_committed_grid_library_serves_triton_on_each_probe_shape_in_some_protocol():
    mod = _probe()
    got = mod.library_configs(str(LIBRARY))
    for mnk in mod.GEMM_SHAPES:
        assert any(k[0] == mnk for k in got), mnk
    for layout, text in got.values():
        assert layout in ("tn", "nn")
        parse_config(text)  # every served config parses


def test_probe_kernels_build_and_export_every_entry(sm90_build):
    mod = _probe()
    lib = mod.build()
    names = ["cold_empty", "cold_load1", "cold_chain_init", "cold_chain", "cold_tile"]
    names += [f"cold_code{n}" for n in mod.CODE_SIZES]
    for name in names:
        assert isinstance(getattr(lib, name), ctypes._CFuncPtr), name
    with pytest.raises(AttributeError):
        lib.cold_not_an_entry
