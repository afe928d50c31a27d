"""Retrieval of earlier screens' winners (search/retrieve.py) and their place in a screen (source ``retrieved``)."""

import glob

import pytest

from gemmrl.kernels.triton_gemm.configs import H100, parse_config, valid
from gemmrl.problem import GemmProblem, parse_mnk
from gemmrl.search.retrieve import RetrieveError, distance, expand, nearest, read_winners, winners
from gemmrl.search.screen import ScreenSpec, configs_for, exploration_pool

A = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=1)"
B = "splitk(BM=64,BN=64,BK=128,warps=4,stages=4,group_m=8,split=4,reduction=two_pass,tma=False,nondeterministic=False)"
C = "smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=2,reduction=fused,tma=False)"
PROBE = "benchmarks/results/h100/h100_decode_probe12_traffic-probe_triton-select-top4-explore0-pdl-off_18ec62482730_2026-11-26.csv.gz"


def row(mnk, cand, t, protocol="graph", verified="true", dtype="fp16", gpu="NVIDIA H100 80GB HBM3"):
    M, N, K = mnk.split("_")
    return {"mnk": mnk, "M": M, "N": N, "K": K, "dtype": dtype, "protocol": protocol, "candidate": cand,
            "time_ms": str(t), "verified": verified, "gpu": gpu}


def test_winners_keep_the_fastest_distinct_configs_per_shape_and_protocol():
    rows = [row("64_64_4096", f"triton:{A}:tn", 0.010), row("64_64_4096", f"triton:{A}:nn", 0.008),
            row("64_64_4096", f"triton:{B}:tn", 0.009), row("64_64_4096", f"triton:{C}:tn", 0.011),
            row("64_64_4096", f"triton:{C}:tn", 0.001, verified="false"),   # failed its check: never a winner
            row("64_64_4096", "cublas_tn", 0.002),                          # a reference, not a config
            row("64_64_4096", "triton-sel:graph", 0.003),                   # a re-measure row names a selection
            row("64_64_4096", f"triton:{C}:tn", 0.004, protocol="cold")]
    w = winners(rows, per_shape=2)
    graph = [x for x in w if x.protocol == "graph"]
    assert [str(x.config) for x in graph] == [A, B]
    assert graph[0].layout == "nn" and graph[0].time_ms == pytest.approx(0.008)   # the layout of its fastest row
    assert [str(x.config) for x in w if x.protocol == "cold"] == [C]
    assert len(winners(rows, per_shape=1)) == 2
    with pytest.raises(RetrieveError, match="per_shape must be >= 1"):
        winners(rows, per_shape=0)


@pytest.mark.parametrize("cand", ["triton:tiled(BM=64,BX=3):tn", f"triton:{A}", f"triton:{A}:tt", "cutlass:x:y",
                                  f"triton:{A[:-1]},pdl=True):tn"])
def test_winners_skip_names_that_are_not_plain_configs(cand):
    """Unparsable names, a missing or unknown layout, other families and PDL configs (the library serves none)."""
    assert winners([row("64_64_64", cand, 0.005)]) == []


def test_nearest_takes_the_shape_itself_first_then_its_neighbours():
    rows = [row("64_64_4096", f"triton:{A}:tn", 0.010), row("128_64_4096", f"triton:{B}:nn", 0.010),
            row("8192_8192_64", f"triton:{C}:tn", 0.010), row("128_64_4096", f"triton:{A}:tn", 0.020)]
    table = winners(rows)
    assert nearest(parse_mnk("64_64_4096"), table, 1) == [(parse_config(A), "tn")]
    # the shape itself, then 128_64_4096 (one octave away): A once (its first, faster row), then B
    assert [(str(c), lay) for c, lay in nearest(parse_mnk("64_64_4096"), table, 2)] == [(A, "tn"), (B, "nn")]
    # an unscreened shape: the nearest screened ones in log distance
    assert [str(c) for c, _ in nearest(parse_mnk("100_64_4096"), table, 1)] == [B, A]
    assert distance((64, 64, 4096), (128, 64, 4096)) == pytest.approx(1.0)
    with pytest.raises(RetrieveError, match="shapes must be >= 1"):
        nearest(parse_mnk("64_64_4096"), table, 0)


def test_winners_of_one_gpu_and_the_problems_dtype_first():
    rows = [row("64_64_4096", f"triton:{A}:tn", 0.010), row("64_64_4096", f"triton:{B}:tn", 0.005, gpu="NVIDIA H200"),
            row("64_64_4096", f"triton:{C}:tn", 0.004, dtype="bf16")]
    assert [str(w.config) for w in winners(rows, 1, gpu="NVIDIA H200")] == [B]
    assert {str(w.config) for w in winners(rows, 1, gpu="NVIDIA H100 80GB HBM3")} == {A, C}
    table = winners(rows, 3)
    assert [str(c) for c, _ in nearest(GemmProblem(64, 64, 4096, dtype="bf16"), table, 1)] == [C]
    assert [str(c) for c, _ in nearest(GemmProblem(64, 64, 4096), table, 1)] == [B, A]
    only_fp16 = winners(rows[:2], 3)   # no bf16 winner anywhere: a bf16 problem takes the fp16 ones
    assert [str(c) for c, _ in nearest(GemmProblem(64, 64, 4096, dtype="bf16"), only_fp16, 1)] == [B, A]


def test_read_winners_refuses_another_gpus_screens_and_says_which_it_holds():
    with pytest.raises(RetrieveError, match=r"no screen rows measured on this GPU \(NVIDIA B200\).*hold NVIDIA H100 "
                                            r"80GB HBM3.*--retrieve-any-gpu"):
        read_winners([PROBE], 1, gpu="NVIDIA B200")
    assert read_winners([PROBE], 1, gpu="NVIDIA H100 80GB HBM3") == read_winners([PROBE], 1)


def test_expand_refuses_a_missing_file_or_an_empty_glob(tmp_path):
    (tmp_path / "a.csv").write_text("x")
    assert expand([str(tmp_path / "*.csv")]) == [str(tmp_path / "a.csv")]
    with pytest.raises(RetrieveError, match="no such file"):
        expand([str(tmp_path / "b.csv")])
    with pytest.raises(RetrieveError, match="no such file"):
        expand([str(tmp_path / "z*.csv")])


def test_committed_probe_retrieves_its_decode_winner():
    """The traffic probe's decode probe: at 16_4096_4096 in graph a 4-warp small-M tile, split 2, won (8.22 us); it is what
    retrieval hands the next screen of that shape, and of 16_4096_4096's neighbours."""
    table = read_winners([PROBE], per_shape=1)
    best = [w for w in table if w.mnk == "16_4096_4096" and w.protocol == "graph"]
    assert [str(w.config) for w in best] == [C] and best[0].time_ms == pytest.approx(0.00822, rel=0.01)
    assert (parse_config(C), "tn") in nearest(parse_mnk("16_4096_4096"), table, 1)
    assert read_winners([PROBE], per_shape=1) is table  # read once per process


def test_committed_screens_all_parse_and_every_winner_is_valid_at_its_shape():
    files = glob.glob("benchmarks/results/h100/h100_*triton-select*.csv*")
    assert len(files) >= 40
    table = read_winners(files, per_shape=2)
    shapes = {w.mnk for w in table}
    assert len(shapes) >= 300
    for w in table:
        assert valid(w.config, GemmProblem(w.M, w.N, w.K, layout=w.layout), H100)[0], (w.mnk, str(w.config))


@pytest.mark.parametrize("mnk", ["1_7_13", "33_65_129", "64_64_64", "130_200_72", "3_4096_40", "16_4096_4096"])
def test_retrieved_configs_join_the_screen_where_valid_and_new(mnk):
    p = parse_mnk(mnk)
    pool = exploration_pool(0, 8)
    base = configs_for(p, H100, 4, 2, pool, diverse=True)
    cands = [parse_config(x) for x in (A, B, C)] + [base[0][0]]   # one already picked by the model
    got = configs_for(p, H100, 4, 2, pool, diverse=True, retrieved=cands)
    back = [c for c, src, _ in got if src == "retrieved"]
    assert [str(c) for c, _, _ in got[:len(base)]] == [str(c) for c, _, _ in base]
    assert str(base[0][0]) not in {str(c) for c in back}
    assert {str(c) for c in back} == {str(c) for c in cands[:3] if valid(c, p, H100)[0]}
    assert sorted(r for _, _, r in got) == list(range(len(got)))   # model ranks over the whole list


def test_screen_spec_checks_retrieval_before_the_gpu(tmp_path):
    p = (parse_mnk("64_64_64"),)
    assert ScreenSpec(problems=p, out="x.csv", top=0, explore=0, retrieve=(PROBE,)).retrieve == (PROBE,)
    with pytest.raises(ValueError, match="no such file"):
        ScreenSpec(problems=p, out="x.csv", retrieve=(str(tmp_path / "none.csv"),))
    with pytest.raises(ValueError, match="retrieve needs >= 1 shape"):
        ScreenSpec(problems=p, out="x.csv", retrieve=(PROBE,), retrieve_per_shape=0)
    with pytest.raises(ValueError, match="earlier Triton winners"):
        ScreenSpec(problems=p, out="x.csv", retrieve=(PROBE,), family="wgmma")
