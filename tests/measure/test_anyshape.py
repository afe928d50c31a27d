"""The seeded shapes "any shape" is measured on (measure/anyshape.py): the same seed gives the same shapes; model
shapes take every model in turn, M inside the bands (never a tuned token count or a bucket edge), none the library
holds; random shapes stay in [1, 16384] with a third off multiples of 8."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemmrl.library import Entry, Library
from gemmrl.measure import anyshape as A
from gemmrl.models import MODELS, TOKENS, model_shapes

GPU = "NVIDIA H200"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_model_shapes_are_seeded_banded_and_cover_every_model(dtype):
    ps = A.model_shapes(30, 0, dtype)
    assert ps == A.model_shapes(30, 0, dtype) and ps != A.model_shapes(30, 1, dtype)
    assert len(set(ps)) == 30 and all(p.dtype == dtype and p.layout == "tn" for p in ps)
    counts = [sum(lo <= p.M <= hi for p in ps) for lo, hi in A.M_BANDS]
    assert counts == [5, 5, 4, 4, 4, 4, 4]
    assert not {p.M for p in ps} & {1, 8, 16, 64, 256, 1024, 4096}
    layers = {(N, K): m for m, ls in MODELS.items() for (N, K) in ls.values()}
    assert all((p.N, p.K) in layers for p in ps)
    covered = {m for m, ls in MODELS.items() for p in ps if (p.N, p.K) in ls.values()}
    assert covered == set(MODELS)


def test_shapes_the_library_holds_are_left_out():
    ps = A.model_shapes(30, 0, "fp16")
    p = ps[0]
    cfg = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"
    held = Entry(gpu=GPU, cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=p.M, N=p.N, K=p.K,
                 family="triton", impl=cfg, algo=cfg, time_ms=0.01, vendor_best_ms=0.02, vendor_best="cublas_tn",
                 m_lo=p.M, m_hi=p.M, members=(p.mnk,), verified=True)
    again = A.model_shapes(30, 0, "fp16", Library([held]), GPU)
    assert p not in again and len(again) == 30
    assert p in A.model_shapes(30, 0, "fp16", Library([held]), "NVIDIA H100 80GB HBM3")  # another GPU's entry


def test_random_shapes():
    ps = A.random_shapes(40, 0)
    assert ps == A.random_shapes(40, 0) and len(set(ps)) == 40
    assert all(1 <= d <= A.MAX_DIM for p in ps for d in (p.M, p.N, p.K))
    off = [p for p in ps if p.N % 8 or p.K % 8]
    assert len(off) == 13 and all(ps[i] in off for i in range(2, 40, 3))


def test_the_command_writes_the_files(tmp_path):
    assert A.main(["--seed", "3", "--out", str(tmp_path), "--models", "14", "--random", "9"]) == 0
    names = sorted(f.name for f in tmp_path.iterdir())
    assert names == ["anyshape_models14_bf16_seed3.txt", "anyshape_models14_bf16_seed3_fewest-flops20-of-28.txt",
                     "anyshape_models14_fp16_seed3.txt", "anyshape_models14_fp16_seed3_fewest-flops20-of-28.txt",
                     "anyshape_random9_seed3.txt"]
    lines = (tmp_path / "anyshape_random9_seed3.txt").read_text().splitlines()
    assert lines[0].startswith("#") and lines[1:] == [p.mnk for p in A.random_shapes(9, 3)]


def test_the_server_set_is_the_fewest_flops_over_both_dtypes_kept_per_dtype():
    drawn = {dt: A.model_shapes(30, 0, dt) for dt in ("fp16", "bf16")}
    got = A.fewest_flops(drawn, 20)
    assert sum(map(len, got.values())) == 20
    flops = lambda p: 2 * p.M * p.N * p.K  # noqa: E731
    kept = [p for ps in got.values() for p in ps]
    left = [p for dt, ps in drawn.items() for p in ps if p not in got[dt]]
    assert max(map(flops, kept)) <= min(map(flops, left))
    for dt, ps in got.items():  # each dtype's in the order it was drawn
        assert ps == [p for p in drawn[dt] if p in ps] and all(p.dtype == dt for p in ps)
    assert A.fewest_flops(drawn, 0) == {"fp16": [], "bf16": []}


def test_the_committed_shape_files_are_what_the_generator_draws(tmp_path):
    """benchmarks/shapes' any-shape files are this generator's output at seed 0 (the H100 library left out): a change
    to the draw would change the sets measured against, so it must show here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert A.main(["--seed", "0", "--library", str(root / "src/gemmrl/libraries/h100.json"), "--gpu",
                   "NVIDIA H100 80GB HBM3", "--out", str(tmp_path)]) == 0
    for f in sorted(tmp_path.iterdir()):
        body = f.read_text().split("\n", 1)[1]
        assert body == (root / "benchmarks/shapes" / f.name).read_text().split("\n", 1)[1], f.name


@pytest.mark.parametrize("model, per_band", [("qwen2.5-7b", 2), ("llama3-8b", 1), ("deepseek-v2-lite", 3)])
def test_a_journeys_ladder_is_the_tuned_token_counts_and_the_rest_lies_between(model, per_band):
    ladder, off = A.journey_shapes(model, seed=0, per_band=per_band)
    assert ladder == [p.with_(layout="tn") for p in model_shapes(model)] and {p.M for p in ladder} == set(TOKENS)
    assert len(off) == per_band * len(A.M_BANDS) and len(set(off)) == len(off)
    assert not {p.M for p in off} & set(TOKENS) and all(p.layout == "tn" and p.dtype == "fp16" for p in off)
    for i, p in enumerate(off):  # per_band in each band, in order
        lo, hi = A.M_BANDS[i // per_band]
        assert lo <= p.M <= hi and (p.N, p.K) in {(q.N, q.K) for q in ladder}
    assert A.journey_shapes(model, seed=0, per_band=per_band) == (ladder, off)  # seeded
    assert A.journey_shapes(model, seed=1, per_band=per_band)[1] != off


def test_the_journey_files_are_written_and_an_unknown_model_is_a_one_line_error(tmp_path, capsys):
    assert A.main(["--journey", "qwen2.5", "--seed", "0", "--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["journey_qwen2.5-7b_ladder.txt", "journey_qwen2.5-7b_off-ladder_seed0.txt"]
    assert (tmp_path / names[1]).read_text() == (ROOT / "benchmarks" / "shapes" / names[1]).read_text()
    with pytest.raises(SystemExit):
        A.main(["--journey", "nope", "--out", str(tmp_path)])
    assert "unknown model 'nope'" in capsys.readouterr().err
