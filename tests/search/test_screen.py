"""`gemmrl select`: the screening run that selects one Triton config per shape and protocol (search/screen.py),
and the parallel precompile behind it (kernels/triton_gemm/precompile.py). CPU tier: what is chosen, grouped
and reported; the gpu tier screens two small shapes end to end and re-measures the selection through bench."""

import math

import pytest

from gemmrl.cli.main import main
from gemmrl.kernels.triton_gemm import H100, SmallMConfig, TiledConfig, valid
from gemmrl.kernels.triton_gemm.precompile import groups
from gemmrl.search.selection import load_selection
from gemmrl.problem import parse_mnk
from gemmrl.results import ResultsWriter, read_rows
from gemmrl.search.screen import ScreenSpec, configs_for, exploration_pool, selection_table, triton_configs
from gemmrl.search.space import VARIANTS

from conftest import HAS_CUDA, script_module


def test_exploration_pool_is_seeded_and_covers_every_variant():
    a, b, c = exploration_pool(0, 10), exploration_pool(0, 10), exploration_pool(1, 10)
    assert [str(x) for x in a] == [str(x) for x in b]
    assert [str(x) for x in a] != [str(x) for x in c]
    assert {x.variant for x in a} == set(VARIANTS) and len(a) == 10 * len(VARIANTS)
    assert not any(getattr(x, "nondeterministic", False) for x in a)


@pytest.mark.parametrize("mnk", ["1_4096_4096", "64_4096_64", "1024_1024_1024", "33_65_129", "3_4096_40"])
def test_configs_for_takes_the_model_top_then_valid_exploration(mnk):
    p = parse_mnk(mnk)
    pool = exploration_pool(0, 64)
    es = configs_for(p, H100, 8, 6, pool)
    srcs = [s for _, s, _ in es]
    assert srcs[:8] == ["top"] * 8 and 1 <= srcs.count("explore") <= 6
    names = [str(c) for c, _, _ in es]
    assert len(set(names)) == len(names)
    assert all(valid(c, p, H100)[0] for c, _, _ in es)
    assert sorted(r for _, _, r in es) == list(range(len(es)))  # the model's rank within the list
    assert [str(c) for c, _, _ in configs_for(p, H100, 8, 6, pool)] == names  # seeded per shape


@pytest.mark.parametrize("mnk", ["64_64_16384", "256_256_1024", "1_4096_4096"])
def test_configs_for_one_variant_only(mnk):
    """--variants splitk: the model's top and the explored configs are all split-K, the explored ones drawn from
    the same pool entries as in a screen of every variant (one generator, the others left out after)."""
    p = parse_mnk(mnk)
    full, sk = exploration_pool(0, 64), exploration_pool(0, 64, ("splitk",))
    assert sk and [str(c) for c in sk] == [str(c) for c in full if c.variant == "splitk"]
    es = configs_for(p, H100, 8, 6, sk, variants=("splitk",))
    assert [s for _, s, _ in es][:8] == ["top"] * 8 and all(c.variant == "splitk" for c, _, _ in es)
    assert all(valid(c, p, H100)[0] for c, _, _ in es)
    # the model's split-K top 8 here are its 8 best split-K configs of the whole space
    from gemmrl.search.costmodel import estimate
    from gemmrl.search.space import enumerate_space

    best = sorted(enumerate_space(p, H100, ["splitk"]), key=lambda c: (estimate(c, p, H100).seconds, str(c)))[:8]
    assert {str(c) for c, s, _ in es if s == "top"} == {str(c) for c in best}


@pytest.mark.parametrize("mnk", ["64_64_16384", "256_256_1024", "33_65_129"])
def test_diverse_top_is_one_config_per_kernel_shape(mnk):
    """--diverse: the top configs are the model's best of distinct (variant, tile, split, reduction) groups, the
    first of them the model's best overall, each the best of its group; the plain top crowds into twins."""
    from gemmrl.search.costmodel import estimate, prune, prune_diverse, shape_group
    from gemmrl.search.space import enumerate_space

    p = parse_mnk(mnk)
    div = prune_diverse(p, 8, H100, variants=("splitk",))
    groups = [shape_group(c) for c in div]
    assert len(set(groups)) == len(div) == 8
    key = lambda c: (estimate(c, p, H100).seconds, str(c))  # noqa: E731
    every = list(enumerate_space(p, H100, ["splitk"]))
    assert str(div[0]) == str(min(every, key=key))
    for c in div:
        assert key(c) == min(key(x) for x in every if shape_group(x) == shape_group(c))
    assert [key(c) for c in div] == sorted(key(c) for c in div)
    if mnk == "64_64_16384":  # the plain top 8 are twins of two or three kernels
        assert len({shape_group(c) for c in prune(p, 8, H100, min_per_variant=8, variants=("splitk",))}) < 8
    es = configs_for(p, H100, 8, 2, exploration_pool(0, 64, ("splitk",)), variants=("splitk",), diverse=True)
    assert [str(c) for c, s, _ in es if s == "top"] == [str(c) for c in div]
    with pytest.raises(ValueError, match="the cutlass family screens its own"):
        ScreenSpec(problems=(p,), out="x.csv", diverse=True, family="cutlass")


GIVEN = ("tiled(BM=16,BN=32,BK=64,warps=2,stages=5,group_m=1)", "tiled(BM=16,BN=32,BK=64,warps=2,stages=2,group_m=1)",
         "splitk(BM=32,BN=32,BK=256,warps=4,stages=4,group_m=8,split=8,reduction=fused)")


@pytest.mark.parametrize("mnk", ["64_64_64", "128_256_64", "64_64_4096", "33_65_129", "1_7_13"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_configs_for_adds_the_given_configs_where_valid(mnk, layout):
    """gemmrl select --configs (Triton): the given configs are screened beside the model's top and the explored
    ones, each only where its validity predicate accepts the shape, once, with source "given"."""
    p = parse_mnk(mnk, layout=layout)
    given = triton_configs(GIVEN + GIVEN[:1])  # a repeat is dropped
    assert len(given) == 3
    pool = exploration_pool(0, 16)
    es = configs_for(p, H100, 4, 2, pool, given=given)
    names = [str(c) for c, _, _ in es]
    assert len(set(names)) == len(names)
    assert all(valid(c, p, H100)[0] for c, _, _ in es)
    want = {str(c) for c in given if valid(c, p, H100)[0]}
    assert want <= set(names)  # each valid one is screened, as "given" unless the model or the pool had it
    assert {n for (c, s, _), n in zip(es, names) if s == "given"} <= want
    assert sorted(r for _, _, r in es) == list(range(len(es)))
    alone = configs_for(p, H100, 0, 0, pool, given=given)
    assert [str(c) for c, _, _ in alone] == [str(c) for c in given if valid(c, p, H100)[0]]
    assert all(s == "given" for _, s, _ in alone)


def test_triton_config_lists_are_read_before_the_gpu(tmp_path, capsys):
    one = ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", top=0, explore=0, configs=GIVEN)
    assert one.configs == GIVEN
    with pytest.raises(ValueError, match="Triton config 'tiled\\(BM=16,BX=3\\)'.*no field 'BX'"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", configs=("tiled(BM=16,BX=3)",))
    with pytest.raises(ValueError, match="cannot parse config"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", configs=("BM=16",))
    with pytest.raises(ValueError, match="cutlass or triton family"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", configs=GIVEN, family="wgmma")
    f = tmp_path / "configs.txt"
    f.write_text("# tiny shapes\n" + GIVEN[0] + "  # the fastest at K = 64\n\n" + GIVEN[1] + "\n")
    if not HAS_CUDA:  # the list is taken (both spellings); only the GPU is missing
        for arg in (f"@{f}", ";".join(GIVEN)):
            rc = main(["select", "--mnk", "64_64_64", "--top", "0", "--explore", "0", "--configs", arg,
                       "--out", str(tmp_path)])
            assert rc == 2 and "CUDA GPU" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--configs", f"@{tmp_path / 'missing.txt'}", "--out", str(tmp_path)])
    assert rc == 2 and "no such file" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--configs", "tiled(BM=16,BN=32,BK=64,warps=2,stages=5,group_m=1;bad)",
               "--out", str(tmp_path)])
    assert rc == 2 and "Triton config" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--top", "0", "--explore", "0", "--out", str(tmp_path)])
    assert rc == 2 and "or a config list" in capsys.readouterr().err


def test_screen_spec_rejects_bad_counts():
    with pytest.raises(ValueError, match="top \\+ explore"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", top=0, explore=0)
    with pytest.raises(ValueError, match="graph and cold"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", protocols=("offline",))
    with pytest.raises(ValueError, match="unknown Triton variant.*split_k.*use any of tiled"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", variants=("split_k",))
    with pytest.raises(ValueError, match="the cutlass family has none"):
        ScreenSpec(problems=(parse_mnk("64_64_64"),), out="x.csv", variants=("splitk",), family="cutlass")


def test_precompile_groups_by_what_triton_specializes_on():
    cfg = TiledConfig(64, 64, 32, 4, 3, 8)
    # all dims multiples of 16: one kernel for the three shapes; M=1 and an odd K are specializations of their own
    pairs = [(cfg, parse_mnk(m)) for m in ("64_4096_64", "128_256_512", "256_256_256", "1_256_256", "64_64_72")]
    reps, bad = groups(pairs, H100)
    assert not bad and len(reps) == 3
    bad_cfg = SmallMConfig(BM=32)  # smallm must cover M=1 with BM=16: invalid, reported, never compiled
    reps, bad = groups([(bad_cfg, parse_mnk("1_4096_4096"))], H100)
    assert not reps and len(bad) == 1 and "BM=16" in bad[0][2]


def _row(mnk, proto, cand, ms, info="screen;source=top", verified="true", algo=""):
    return {"mnk": mnk, "dtype": "fp16", "acc": "fp32", "protocol": proto, "candidate": cand, "time_ms": ms,
            "tflops": 1.0 / ms, "verified": verified, "info": info, "algo": algo or cand[len("triton:"):],
            "layout": "tn", "rep": 0}


def test_selection_table_and_load_selection_pick_fastest_checked_config(tmp_path):
    rows = [_row("64_64_64", "graph", "triton:tiled(BM=16)", 0.004),
            _row("64_64_64", "graph", "triton:tiled(BM=32)", 0.003),
            _row("64_64_64", "graph", "triton:tiled(BM=64)", 0.001, verified="false"),  # failed the quick check
            _row("64_64_64", "graph", "cublas_tn", 0.0033, info="screen_ref;chunk=0", algo="3"),
            _row("64_64_64", "graph", "cublaslt_heuristic_nn", 0.0036, info="screen_ref;chunk=0", algo="5"),
            _row("64_64_64", "cold", "triton:tiled(BM=16)", 0.006),
            _row("64_64_64", "cold", "cublas_tn", 0.005, info="screen_ref;chunk=0", algo="3")]
    t = {(r["mnk"], r["protocol"]): r for r in selection_table(rows)}
    assert t[("64_64_64", "graph")]["config"] == "tiled(BM=32)" and t[("64_64_64", "graph")]["ref"] == "cublas_tn"
    assert math.isclose(t[("64_64_64", "graph")]["ratio"], 0.0033 / 0.003)
    assert math.isclose(t[("64_64_64", "cold")]["ratio"], 0.005 / 0.006)
    # without BM=32 (a subset of the family), the screen would have picked BM=16; the references stay
    sub = {(r["mnk"], r["protocol"]): r for r in selection_table(rows, keep=lambda algo: "BM=32" not in algo)}
    assert sub[("64_64_64", "graph")]["config"] == "tiled(BM=16)" and sub[("64_64_64", "graph")]["ref"] == "cublas_tn"
    assert math.isclose(sub[("64_64_64", "graph")]["ratio"], 0.0033 / 0.004)
    assert not selection_table(rows, keep=lambda algo: False)
    path = tmp_path / "sel.csv"
    ResultsWriter(path).write_batch(rows)
    sel = load_selection([path], "triton")  # what bench --triton-from re-measures
    assert sel == {"64_64_64": {"graph": ("tiled(BM=32)", "tn"), "cold": ("tiled(BM=16)", "tn")}}
    assert len(read_rows([path])) == len(rows)


def test_cli_select_errors_are_clear(tmp_path, capsys):
    rc = main(["select", "--mnk", "64_64_64", "--top", "-1", "--out", str(tmp_path)])
    assert rc == 2 and "--top must be >= 0" in capsys.readouterr().err
    if not HAS_CUDA:
        rc = main(["select", "--mnk", "64_64_64", "--out", str(tmp_path)])
        assert rc == 2 and "CUDA GPU" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--protocol", "offline", "--out", str(tmp_path)])
    assert rc == 2
    rc = main(["select", "--mnk", "64_64_64", "--pdl", "on", "--family", "cutlass", "--out", str(tmp_path)])
    assert rc == 2 and "Triton launch option" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not a choice
        main(["select", "--mnk", "64_64_64", "--timing", "long", "--out", str(tmp_path)])
    if not HAS_CUDA:  # the flags are taken; only the GPU is missing
        rc = main(["select", "--mnk", "64_64_64", "--timing", "full", "--pdl", "both", "--out", str(tmp_path)])
        assert rc == 2 and "CUDA GPU" in capsys.readouterr().err
        rc = main(["select", "--mnk", "64_64_16384", "--variants", "splitk,smallm", "--out", str(tmp_path)])
        assert rc == 2 and "CUDA GPU" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--variants", "splitK", "--out", str(tmp_path)])
    assert rc == 2 and "unknown Triton variant(s) splitK" in capsys.readouterr().err
    rc = main(["select", "--mnk", "64_64_64", "--diverse", "--family", "cutlass", "--out", str(tmp_path)])
    assert rc == 2 and "screens its own" in capsys.readouterr().err


@pytest.mark.gpu
def test_select_then_remeasure_on_gpu(tmp_path):
    sel = tmp_path / "sel.csv"
    assert main(["select", "--mnk", "64_256_128,1_512_256", "--top", "4", "--explore", "2", "--workers", "2",
                 "--pdl", "both", "--out", str(sel), "--no-progress"]) == 0
    rows = read_rows([sel])
    assert {r["mnk"] for r in rows} == {"64_256_128", "1_512_256"}
    ours = {r["candidate"] for r in rows if r["candidate"].startswith("triton:")}
    twins = {n.replace(",pdl=True)", ")") for n in ours if ",pdl=True)" in n}
    assert twins and twins <= ours  # every PDL config screened beside the same config without it
    table = selection_table(rows)
    assert {(t["mnk"], t["protocol"]) for t in table} == {(m, p) for m in ("64_256_128", "1_512_256")
                                                          for p in ("graph", "cold")}
    assert all(t["best_ms"] > 0 and t["ref_ms"] > 0 for t in table)
    rem = tmp_path / "rem.csv"
    assert main(["bench", "--mnk", "64_256_128,1_512_256", "--triton-from", str(sel), "--protocol", "graph,cold",
                 "--out", str(rem), "--no-progress"]) == 0
    got = [r for r in read_rows([rem]) if r["candidate"].startswith("triton-sel:")]
    assert got and all(r["verified"] == "true" for r in got)


@pytest.mark.gpu
def test_select_retrieves_earlier_winners_on_gpu(tmp_path, capsys):
    """--retrieve: the committed decode probe's winner at 16_4096_4096 is screened (source=retrieved) beside the
    model's top 1; a screen file of another GPU is refused unless --retrieve-any-gpu."""
    import torch

    probe = ("benchmarks/results/h100/h100_decode_probe12_traffic-probe_triton-select-top4-explore0-pdl-off_"
             "18ec62482730_2026-11-26.csv.gz")
    win = "smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=2,reduction=fused,tma=False)"
    here = torch.cuda.get_device_name(0)
    rows = [r for r in read_rows([probe]) if r["mnk"] == "16_4096_4096"]
    mine = tmp_path / "mine.csv"
    ResultsWriter(mine).write_batch([{**r, "gpu": here} for r in rows])
    sel = tmp_path / "sel.csv"
    assert main(["select", "--mnk", "16_4096_4096", "--top", "1", "--explore", "0", "--layouts", "tn",
                 "--retrieve", str(mine), "--retrieve-shapes", "1", "--retrieve-per-shape", "1", "--workers", "2",
                 "--out", str(sel), "--no-progress"]) == 0
    got = {r["algo"]: r["info"] for r in read_rows([sel]) if r["candidate"].startswith("triton:")}
    assert win in got and "source=retrieved" in got[win]
    other = tmp_path / "other.csv"
    ResultsWriter(other).write_batch([{**r, "gpu": "NVIDIA B200"} for r in rows])
    rc = main(["select", "--mnk", "16_4096_4096", "--top", "1", "--explore", "0", "--retrieve", str(other),
               "--out", str(tmp_path / "sel2.csv"), "--no-progress"])
    assert rc == 2 and "--retrieve-any-gpu" in capsys.readouterr().err


def test_screen_subsets_script(tmp_path, capsys):
    """benchmarks/acceptance/screen_subsets.py: the screen's geomean with and without named configs, and where they won."""
    mod = script_module("screen_subsets")
    a, b = "pingpong_64x8x64_c2x4_persistent_tn_fp16_swap", "coop_128x128x64_c1x1_persistent_tn_fp16"
    rows = [_row("64_64_64", "graph", f"cutlass:{a}:s1", 0.002, algo=f"{a}:s1"),
            _row("64_64_64", "graph", f"cutlass:{b}:s1", 0.004, algo=f"{b}:s1"),
            _row("64_64_64", "graph", "cublas_tn", 0.003, info="screen_ref;chunk=0", algo="3"),
            _row("128_64_64", "graph", f"cutlass:{a}:s1", 0.005, algo=f"{a}:s1"),
            _row("128_64_64", "graph", f"cutlass:{b}:s1", 0.004, algo=f"{b}:s1"),
            _row("128_64_64", "graph", "cublas_tn", 0.004, info="screen_ref;chunk=0", algo="3")]
    path = tmp_path / "screen.csv"
    ResultsWriter(path).write_batch(rows)
    assert mod.main([str(path), "--configs", a, "--md", str(tmp_path / "t.md")]) == 0
    out = capsys.readouterr().out
    without, with_ = math.sqrt(0.75 * 1.0), math.sqrt(1.5 * 1.0)
    assert f"| graph | 2 | {without:.3f} | {with_:.3f} | 1 |" in out and "| graph | 64_64_64 |" in out
    assert "128_64_64 |" not in out.split("| gain |")[1]  # only the shapes where a named config was fastest
    assert mod.main([str(path), "--configs", "coop_1x1"]) == 2 and "not in the screen" in capsys.readouterr().err


def test_screen_ahead_script_keeps_shapes_near_the_earlier_vendor_best(tmp_path, capsys):
    """benchmarks/acceptance/screen_ahead.py: a shape is kept where the screen's best config is within --min of vendor_best as an
    earlier pass measured it, in any protocol; the screen's own (weaker) references do not decide; a later --against
    file overrides an earlier one cell by cell; no earlier vendor_best at all is an error."""
    mod = script_module("screen_ahead")
    a = "pingpong_64x16x128_c1x1_persistent_tn_fp16_swap"
    screen = [_row("128_4096_8192", "graph", f"cutlass:{a}:s1", 0.0100, algo=f"{a}:s1"),
              _row("128_4096_8192", "graph", "cublas_tn", 0.0120, info="screen_ref;chunk=0", algo="3"),  # weak ref
              _row("128_4096_8192", "cold", f"cutlass:{a}:s1", 0.0200, algo=f"{a}:s1"),
              _row("256_2048_4096", "graph", f"cutlass:{a}:s1", 0.0100, algo=f"{a}:s1"),
              _row("256_2048_4096", "cold", f"cutlass:{a}:s1", 0.0150, algo=f"{a}:s1"),
              _row("64_8192_2048", "graph", f"cutlass:{a}:s1", 0.0050, algo=f"{a}:s1")]
    earlier = [_row("128_4096_8192", "graph", "vendor_best", 0.0090, info=""),   # 0.90: not within 0.98
               _row("128_4096_8192", "cold", "vendor_best", 0.0190, info=""),    # 0.95
               _row("256_2048_4096", "graph", "vendor_best", 0.0090, info=""),
               _row("256_2048_4096", "cold", "vendor_best", 0.0148, info="")]    # 0.987: kept
    later = [_row("128_4096_8192", "cold", "vendor_best", 0.0199, info="")]     # re-measured: 0.995, kept
    for name, rows in (("screen", screen), ("earlier", earlier), ("later", later)):
        ResultsWriter(tmp_path / f"{name}.csv").write_batch(rows)
    out = tmp_path / "keep.txt"
    assert mod.main([str(tmp_path / "screen.csv"), "--against", str(tmp_path / "earlier.csv"), "--out", str(out)]) == 0
    assert out.read_text().split() == ["256_2048_4096"]
    assert "1 without an earlier vendor_best" in capsys.readouterr().out  # 64_8192_2048 was never measured
    assert mod.main([str(tmp_path / "screen.csv"), "--against", str(tmp_path / "earlier.csv"), str(tmp_path / "later.csv"),
                     "--out", str(out)]) == 0
    assert sorted(out.read_text().split()) == ["128_4096_8192", "256_2048_4096"]
    assert mod.main([str(tmp_path / "screen.csv"), "--against", str(tmp_path / "screen.csv"), "--out", str(out)]) == 2
    assert "no vendor_best" in capsys.readouterr().err


def test_served_vs_candidate_script_compares_each_run_over_its_own_vendor_best(tmp_path, capsys):
    """benchmarks/acceptance/served_vs_candidate.py: a cell counts where gemmrl.mm served a CUTLASS config the re-measure timed in
    the same protocol; x divides the served time over the measure run's vendor_best by the candidate's over the
    re-measure's, so a whole run drifting cancels; rechecks, vendor-served cells and configs the re-measure never
    timed are left out; nothing comparable is an error."""
    mod = script_module("served_vs_candidate")
    a, b = "pingpong_128x128x64_c1x1_persistent_tn_fp16:s1", "pingpong_64x256x64_c1x1_persistent_tn_fp16:s1"

    def served(mnk, proto, ms, cfg, recheck=""):
        r = _row(mnk, proto, "gemmrl", ms, info="", algo=f"eager=cutlass:{cfg} (cold entry {mnk}); "
                 f"graph=cutlass:{cfg} (graph entry {mnk}); hot=torch")
        return dict(r, recheck=recheck)

    rem = [_row("512_2048_4096", "graph", "cutlass-sel:graph", 0.0100, info="", algo=a),
           _row("512_2048_4096", "graph", "vendor_best", 0.0110, info="", algo="x"),
           _row("512_2048_4096", "cold", "cutlass-sel:cold", 0.0200, info="", algo=a),
           _row("512_2048_4096", "cold", "vendor_best", 0.0200, info="", algo="x"),
           _row("1024_512_2048", "graph", "cutlass-sel:graph", 0.0100, info="", algo=b),
           _row("1024_512_2048", "graph", "vendor_best", 0.0100, info="", algo="x")]
    meas = [served("512_2048_4096", "graph", 0.0120, a),                      # the run 10% slower: vendor too
            _row("512_2048_4096", "graph", "vendor_best", 0.0121, info="", algo="x"),
            served("512_2048_4096", "graph", 0.0500, a, recheck="1"),        # a recheck: not a first run
            served("512_2048_4096", "cold", 0.0210, a),
            _row("512_2048_4096", "cold", "vendor_best", 0.0200, info="", algo="x"),
            served("1024_512_2048", "graph", 0.0100, a),                      # config the re-measure never timed here
            _row("1024_512_2048", "graph", "vendor_best", 0.0100, info="", algo="x")]
    ResultsWriter(tmp_path / "rem.csv").write_batch(rem)
    ResultsWriter(tmp_path / "meas.csv").write_batch(meas)
    recs = {(r["protocol"], r["mnk"]): r for r in mod.cells([str(tmp_path / "rem.csv")], str(tmp_path / "meas.csv"))}
    assert set(recs) == {("graph", "512_2048_4096"), ("cold", "512_2048_4096")}
    assert math.isclose(recs[("graph", "512_2048_4096")]["x"], (0.0120 / 0.0121) / (0.0100 / 0.0110))
    assert math.isclose(recs[("graph", "512_2048_4096")]["raw"], 1.2)
    assert math.isclose(recs[("cold", "512_2048_4096")]["x"], 1.05)
    assert mod.main(["--pair", str(tmp_path / "rem.csv"), str(tmp_path / "meas.csv")]) == 0
    assert "| cold | 1 | 1.0500 | 1.0500 |" in capsys.readouterr().out
    assert mod.main(["--pair", str(tmp_path / "rem.csv"), str(tmp_path / "rem.csv")]) == 2
    assert "no cell served" in capsys.readouterr().err


def test_oracle_ceiling_takes_each_cells_best_generated_run_floored_at_one(tmp_path, capsys):
    """benchmarks/acceptance/oracle_ceiling.py: per (protocol, shape) the best generated time over its own run's vendor_best
    across files, floored at 1; files without cuBLASLt autotuned rows (selection screens), rechecks, failed
    verifications and other CSV schemas do not count; nothing usable is an error."""
    mod = script_module("oracle_ceiling")

    def vendor(mnk, proto, ms):
        return [_row(mnk, proto, "cublaslt_autotuned_tn", ms, info="", algo="1"),
                _row(mnk, proto, "vendor_best", ms, info="", algo="1")]

    run1 = (vendor("64_64_64", "graph", 0.0040) + vendor("256_4096_1024", "graph", 0.0100)
            + [_row("64_64_64", "graph", "triton-sel:graph", 0.0032, info="", algo="t"),         # 1.25
               _row("256_4096_1024", "graph", "cutlass-sel:graph", 0.0125, info="", algo="c")])  # 0.8 -> floor 1
    run2 = (vendor("64_64_64", "graph", 0.0030)
            + [_row("64_64_64", "graph", "cutlass-sel:graph", 0.0020, info="", algo="c", verified="false"),
               dict(_row("64_64_64", "graph", "gemmrl", 0.0010, info="", algo="g"), recheck="1"),
               _row("64_64_64", "graph", "gemmrl", 0.0025, info="", algo="g")])                  # 1.2 < 1.25
    screen = [_row("64_64_64", "graph", "triton:tiled(BM=16)", 0.0001),                          # no autotuned path
              _row("64_64_64", "graph", "cublas_tn", 0.0040, info="screen_ref;chunk=0", algo="3")]
    for name, rows in (("run1", run1), ("run2", run2), ("screen", screen)):
        ResultsWriter(tmp_path / f"{name}.csv").write_batch(rows)
    (tmp_path / "other.csv").write_text("attack,verdict\nnan,caught\n")
    shapes = {"64_64_64", "256_4096_1024"}
    best, used = mod.best_ratios([str(tmp_path / f) for f in ("run1.csv", "run2.csv", "screen.csv", "other.csv")],
                                 shapes)
    assert used == 2 and math.isclose(best[("graph", "64_64_64")], 1.25) and best[("graph", "256_4096_1024")] == 1.0
    (tmp_path / "shapes.txt").write_text("# two\n64_64_64\n256_4096_1024\n")
    assert mod.main([str(tmp_path / "run1.csv"), str(tmp_path / "run2.csv"), "--shapes", str(tmp_path / "shapes.txt")]) == 0
    out = capsys.readouterr().out
    assert f"| graph | all | 2 | 2 | {math.sqrt(1.25):.4f} | 1 |  |" in out
    assert "| graph | min(M,N) <= 256 | 2 |" in out and "| cold |" not in out
    assert mod.main([str(tmp_path / "screen.csv"), "--shapes", str(tmp_path / "shapes.txt")]) == 2
    assert "no file with every vendor path" in capsys.readouterr().err
    best, _ = mod.best_ratios([str(tmp_path / "run1.csv")], shapes, families=("cutlass",), floor=0.0)
    assert math.isclose(best[("graph", "256_4096_1024")], 0.8) and ("graph", "64_64_64") not in best  # no floor
    recs = {r["class"]: r for r in mod.table(best, shapes, floor=0.0)}
    assert recs["all"]["shapes"] == 2 and recs["all"]["measured"] == 1 and math.isclose(recs["all"]["ceiling"], 0.8)
    floored = {r["class"]: r for r in mod.table(best, shapes)}  # floored: the untimed shape counts at 1
    assert math.isclose(floored["all"]["ceiling"], math.sqrt(0.8))
