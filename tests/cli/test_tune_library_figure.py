"""`gemmrl tune --library-out`'s closing line: the built library's own figure (its entries over vendor_best where
they were measured), or that it holds none; never the clipped rewards of the run."""

from __future__ import annotations

from gemmrl.cli.tune import library_figure
from gemmrl.library import Entry, Library

CFG = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"


def entry(M, t, vb):
    return Entry(gpu="NVIDIA H200", cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=M, N=64,
                 K=64, family="triton", impl=CFG, algo=CFG, time_ms=t, vendor_best_ms=vb, vendor_best="cublas_tn",
                 m_lo=M, m_hi=M, members=(f"{M}_64_64",), verified=True)


def test_the_figure_is_the_entries_geomean():
    text = library_figure(Library([entry(1, 0.010, 0.012), entry(2, 0.010, 0.0075)]))
    assert "geomean 0.949x over 2 entries" in text and "min 0.750x" in text  # sqrt(1.2 * 0.75)


def test_no_entry_says_so():
    assert library_figure(Library([])).startswith("no entry")
