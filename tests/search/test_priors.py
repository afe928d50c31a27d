"""Priors from another GPU's library (search/priors.py, ``gemmrl tune --priors``): which entries are priors at a shape
and in what order, the GPU they come from, and a proposer that puts them first."""

from __future__ import annotations

import argparse
import csv
import random

import pytest
from fake_proposers import Inner

from gemmrl.cli import tune
from gemmrl.cli.main import main
from gemmrl.kernels.toolchain import CutlassNotFound
from gemmrl.library import Entry, Library, packaged
from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.problem import GemmProblem
from gemmrl.search.priors import Primed, PriorsError, prior_gpu, prior_specs
from gemmrl.search.proposer import Context, Outcome

H100 = "NVIDIA H100 80GB HBM3"
TILED = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"
SMALLM = "smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=1,reduction=none,tma=False)"
GEMV = "smallm(BM=1,BN=16,BK=512,warps=4,stages=1,split=1,reduction=none,tma=False,mma=False)"


def entry(M, impl=TILED, N=4096, K=4096, gpu=H100, layout="tn", family="triton", dtype="fp16", members=None, **kw):
    d = dict(gpu=gpu, cc="9.0", dtype=dtype, acc="fp32", layout=layout, protocol="graph", M=M, N=N, K=K,
             family=family, impl=impl, algo=impl, time_ms=0.01, vendor_best_ms=0.011, vendor_best="cublas_tn",
             m_lo=M, m_hi=M, members=members or (f"{M}_{N}_{K}",), verified=True)
    d.update(kw)
    return Entry(**d)


def test_the_priors_gpu_is_named_or_the_librarys_only_one():
    one = Library([entry(64), entry(64, gpu="NVIDIA H200", family="vendor", impl="cublas_tn")])
    assert prior_gpu(one, None) == H100  # vendor entries are not priors, their GPU does not count
    with pytest.raises(PriorsError, match="several GPUs .*NVIDIA H100 80GB HBM3, NVIDIA H20.*--priors-gpu"):
        prior_gpu(Library([entry(64), entry(64, gpu="NVIDIA H20")]), None)
    with pytest.raises(PriorsError, match="'NVIDIA H300' has no generated kernel.*it holds NVIDIA H100"):
        prior_gpu(one, "NVIDIA H300")
    with pytest.raises(PriorsError, match="no generated kernel"):
        prior_gpu(Library([entry(64, family="vendor", impl="cublas_tn")]), None)


@pytest.mark.parametrize("M, want", [
    (1, [(GEMV, "tn"), (SMALLM, "nn"), (SMALLM, "tn"), (TILED, "nn"), (TILED, "tn")]),
    (16, [(SMALLM, "nn"), (SMALLM, "tn"), (TILED, "nn"), (TILED, "tn")]),   # exact entries, then log-distance
    (40, [(TILED, "nn"), (TILED, "tn")]),    # a measured member of the nn bucket first; smallm(BM=16) is not valid
    (50, [(TILED, "tn"), (TILED, "nn")]),    # inside the bucket but not a member: nearer to 64 than to 32
])
def test_priors_are_the_shapes_kernels_nearest_m_first_valid_here_and_once_each(M, want):
    lib = Library([
        entry(64, TILED),
        entry(16, SMALLM),
        entry(16, SMALLM, layout="nn"),                       # another layout: another prior
        entry(256, TILED, protocol="cold"),                   # the same kernel again, farther: once
        entry(1, GEMV),                                       # an M = 1 GEMV: not valid above M = 8
        entry(16, SMALLM, N=2048),                            # another N
        entry(16, SMALLM, dtype="bf16"),                      # another dtype
        entry(16, "cublas_tn", family="vendor", protocol="cold"),  # a vendor entry
        entry(16, SMALLM, gpu="NVIDIA H20"),                  # another GPU
        entry(32, TILED, layout="nn", m_lo=32, m_hi=63, members=("32_4096_4096", "40_4096_4096", "63_4096_4096")),
    ])
    got = [(s.payload, s.layout) for s in prior_specs(lib, H100, GemmProblem(M, 4096, 4096))]
    assert got == want
    assert all(s.family == "triton" and s.name == f"triton:{s.payload}:{s.layout}"
               for s in prior_specs(lib, H100, GemmProblem(M, 4096, 4096)))


def spec(impl, layout="tn"):
    return CandidateSpec("triton", impl, name=f"triton:{impl}:{layout}", layout=layout)


def test_primed_proposes_untried_priors_first_at_most_its_share_and_the_rest_from_its_policy():
    lib = Library([entry(16, SMALLM), entry(16, SMALLM, layout="nn"), entry(64, TILED)])
    t128 = "tiled(BM=128,BN=64,BK=64,warps=4,stages=3,group_m=8)"
    inner = Inner([spec(SMALLM), spec(t128), spec(t128, "nn")])
    pr = Primed(inner, lib, H100, most=2)
    p = GemmProblem(16, 4096, 4096)
    first = pr.propose(Context(p), 4, random.Random(0))
    assert [(x.source, x.spec.payload, x.spec.layout) for x in first] == [
        ("prior", SMALLM, "nn"), ("prior", SMALLM, "tn"), ("rl", t128, "tn"), ("rl", t128, "nn")]
    assert len({x.key for x in first}) == 4  # the policy's own SMALLM tn is the prior's: not twice
    done = tuple(Outcome(p, x, "ok", 0.1) for x in first)
    second = pr.propose(Context(p, own=done), 4)
    assert [(x.source, x.spec.payload) for x in second] == [("prior", TILED)]  # the last prior; the policy has none
    assert pr.propose(Context(p, own=done + tuple(Outcome(p, x, "ok", 0.1) for x in second)), 4) == []
    pr.update(Context(p), done)
    assert inner.updates == [list(done)] and pr.name == "rl"
    with pytest.raises(PriorsError, match=">= 1"):
        Primed(inner, lib, H100, most=0)


def test_tune_with_the_packaged_h100_library_as_priors_proposes_its_picks_first(tmp_path):
    p = GemmProblem(16, 4096, 4096)
    want = prior_specs(packaged(), H100, p)
    assert want, "the packaged H100 library holds 16_4096_4096"
    out = tmp_path / "s.csv"
    assert main(["tune", "--executor", "model", "--no-progress", "--mnk", p.mnk, "--trials", str(tmp_path / "t.sqlite"),
                 "--policy", str(tmp_path / "pol.json"), "--priors", "package", "--priors-gpu", H100,
                 "--rounds", "1", "--group", "4", "--summary-out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [r["candidate"] for r in rows[:len(want[:2])]] == [s.name for s in want[:2]]
    assert len(rows) == 4


CUTLASS = "pingpong_64x32x128_c1x1_persistent_tn_bf16_swap:s1_rh_dheuristic_k1"


@pytest.mark.parametrize("families, want", [(None, {"triton", "cutlass"}), ({"triton"}, {"triton"}),
                                            ({"triton", "cutlass"}, {"triton", "cutlass"})])
def test_primed_proposes_only_the_families_this_machine_builds(families, want):
    lib = Library([entry(16, CUTLASS, N=3584, K=18944, family="cutlass", dtype="bf16", protocol="cold"),
                   entry(16, SMALLM, N=3584, K=18944, dtype="bf16")])
    p = GemmProblem(16, 3584, 18944, dtype="bf16")
    assert {s.family for s in prior_specs(lib, H100, p)} == {"triton", "cutlass"}  # both valid at the shape
    pr = Primed(Inner([]), lib, H100, most=2, families=families)
    assert {x.spec.family for x in pr.propose(Context(p), 4)} == want


def test_tune_without_cutlass_headers_leaves_the_family_out_and_says_so(monkeypatch, capsys):
    def missing():
        raise CutlassNotFound("CUTLASS headers not found: pip install nvidia-cutlass")

    here = argparse.Namespace(scheduler=None, executor="sandbox")
    monkeypatch.setattr(tune, "cutlass_include_dirs", missing)
    monkeypatch.setattr(tune, "find_nvcc", lambda: None)
    assert tune.buildable_families(here) == {"triton"}
    assert "the CUTLASS family is left out" in capsys.readouterr().out
    # a dry run builds nothing (the cost model times the policy's families) and a scheduler's workers build
    # elsewhere: neither asks this machine
    assert tune.buildable_families(argparse.Namespace(scheduler=None, executor="model")) == {"triton", "cutlass"}
    assert tune.buildable_families(argparse.Namespace(scheduler="tcp://h:1", executor="sandbox")) == {
        "triton", "cutlass", "decode"}
    monkeypatch.setattr(tune, "cutlass_include_dirs", lambda: [])
    assert tune.buildable_families(here) == {"triton", "cutlass"}
    monkeypatch.setattr(tune, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")  # nvcc builds the decode family
    assert tune.buildable_families(here) == {"triton", "cutlass", "decode"}
    ns = argparse.Namespace(proposer="rl", policy=None, policy_lr=0.0)
    monkeypatch.setattr(tune, "user_policy", lambda: tune.Path("/nonexistent/policy.json"))
    _, pol = tune.make_proposers(ns, ("tn",), frozenset({"triton"}))
    specs, _ = pol.actions(GemmProblem(64, 4096, 4096))
    assert specs and {s.family for s in specs} == {"triton"}
    _, pol = tune.make_proposers(ns, ("tn",), frozenset({"triton", "cutlass"}))
    assert "cutlass" in {s.family for s in pol.actions(GemmProblem(64, 4096, 4096))[0]}
