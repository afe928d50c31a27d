"""Families that pick their own configs at a shape, proposed ahead of the policy (search/own_configs.py)."""

from __future__ import annotations

import pytest
from fake_proposers import Inner

from gemmrl.kernels import decode_gemm as dg
from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.problem import GemmProblem
from gemmrl.search.own_configs import OwnConfigsError, OwnFirst, own_specs
from gemmrl.search.proposer import Context, Hardware, Outcome

TILED = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"


def triton(layout="tn"):
    return CandidateSpec("triton", TILED, name=f"triton:{TILED}:{layout}", layout=layout)


@pytest.mark.parametrize("mnk,dtype", [("1_14336_4096", "fp16"), ("8_4096_14336", "bf16"), ("32_3584_18944", "fp16"),
                                       ("3_37_72", "bf16"), ("17_1000_1032", "fp16")])
def test_own_specs_are_the_decode_screen_valid_at_the_shape(mnk, dtype):
    M, N, K = map(int, mnk.split("_"))
    p = GemmProblem(M, N, K, dtype=dtype)
    specs = own_specs(p, ("tn", "nn"), ("decode",))
    want = [str(c) for c in dg.screen_configs(p.with_(layout="tn"))]
    assert specs and [s.payload for s in specs] == want
    for s in specs:
        assert (s.family, s.layout, s.name) == ("decode", "tn", f"decode:{s.payload}:tn")
        assert dg.valid(dg.DecodeConfig.parse(s.payload), p.with_(layout="tn"))[0]
        assert s.payload.endswith(dtype)


@pytest.mark.parametrize("mnk,layouts", [("64_4096_4096", ("tn", "nn")),   # past the decode family's token tiles
                                         ("33_4096_4096", ("tn",)),
                                         ("1_4096_4100", ("tn",)),          # K % 8: no 16-byte loads
                                         ("1_4096_4096", ("nn",))])         # the family reads the weight as stored
def test_no_own_specs_where_the_family_does_not_apply(mnk, layouts):
    M, N, K = map(int, mnk.split("_"))
    assert own_specs(GemmProblem(M, N, K), layouts, ("decode",)) == []


def test_own_first_takes_at_most_its_share_untried_and_the_policy_fills_the_rest():
    p = GemmProblem(8, 4096, 14336)
    inner = Inner([triton(), triton("nn")])
    prop = OwnFirst(inner, ("tn", "nn"), ("decode",), most=2)
    own = own_specs(p, ("tn", "nn"), ("decode",))
    ctx = Context(p, Hardware())
    got = prop.propose(ctx, 4)
    assert [x.spec.name for x in got] == [s.name for s in own[:2]] + [triton().name, triton("nn").name]
    assert [x.source for x in got[:2]] == ["screened", "screened"]
    done = tuple(Outcome(p, x, "ok", reward=0.1) for x in got)
    again = prop.propose(Context(p, Hardware(), own=done), 4)
    assert [x.spec.name for x in again] == [s.name for s in own[2:4]]  # the next untried two; the policy has none left
    prop.update(ctx, done)
    assert inner.updates == [list(done)]  # the policy sees every outcome (its update keeps those it proposed)
    assert [x.spec.name for x in prop.propose(ctx, 1)] == [own[0].name]


def test_own_first_at_a_shape_the_family_skips_is_the_policy_alone():
    p = GemmProblem(256, 4096, 4096)
    inner = Inner([triton(), triton("nn")])
    got = OwnFirst(inner, ("tn", "nn"), ("decode",), most=2).propose(Context(p), 4)
    assert [x.source for x in got] == ["rl", "rl"]


def test_own_first_refuses_unknown_families_and_no_share():
    with pytest.raises(OwnConfigsError, match="triton do not pick their own configs; use some of decode"):
        OwnFirst(Inner([]), ("tn",), ("triton",))
    with pytest.raises(OwnConfigsError, match=">= 1"):
        OwnFirst(Inner([]), ("tn",), ("decode",), most=0)
