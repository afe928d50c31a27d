import pytest

from gemmrl.problem import (GRID_DIMS, GemmProblem, ProblemError, grid, parse_mnk, parse_part, part_of,
                            peaks_for, read_shapes, sample_grid)


@pytest.mark.parametrize("text,mnk", [("64_4096_64", (64, 4096, 64)), ("1x7x13", (1, 7, 13)), (" 3_5_7 ", (3, 5, 7))])
def test_parse(text, mnk):
    p = parse_mnk(text)
    assert (p.M, p.N, p.K) == mnk
    assert p.dtype == "fp16" and p.acc == "fp32" and p.layout == "tn"


@pytest.mark.parametrize("text", ["", "64_64", "64_64_64_64", "a_b_c", "64_-1_64", "0_64_64", "64.5_64_64"])
def test_parse_errors(text):
    with pytest.raises(ProblemError):
        parse_mnk(text)


@pytest.mark.parametrize("kw,needle", [
    ({"M": 0, "N": 1, "K": 1}, ">= 1"), ({"M": -3, "N": 1, "K": 1}, ">= 1"),
    ({"M": 1 << 21, "N": 1, "K": 1}, "exceeds"), ({"M": 1 << 19, "N": 1 << 19, "K": 1}, "too large"),
    ({"M": 1, "N": 1, "K": 1, "dtype": "fp8"}, "unknown dtype"), ({"M": 1, "N": 1, "K": 1, "acc": "int32"}, "accumulator"),
    ({"M": 1, "N": 1, "K": 1, "layout": "tt"}, "layout"), ({"M": 2.0, "N": 1, "K": 1}, "int"),
    ({"M": True, "N": 1, "K": 1}, "int"),
])
def test_problem_errors(kw, needle):
    with pytest.raises(ProblemError, match=needle):
        GemmProblem(**kw)


def test_features_and_floor():
    p = GemmProblem(64, 4096, 4096)
    assert p.flops == 2 * 64 * 4096 * 4096
    assert p.bytes == 2 * (64 * 4096 + 4096 * 4096 + 64 * 4096)
    assert p.intensity == pytest.approx(p.flops / p.bytes)
    # memory-bound on H100: bytes / 3.35 TB/s
    assert p.floor_s("NVIDIA H100 80GB HBM3") == pytest.approx(p.bytes / 3.35e12)
    assert p.floor_s("H200") == pytest.approx(p.bytes / 4.8e12)
    big = GemmProblem(8192, 8192, 8192)
    assert big.floor_s("H100") == pytest.approx(big.flops / 989e12)
    # in L2 only the math term remains
    assert p.floor_s("H100", in_l2=True) == pytest.approx(p.flops / 989e12)
    with pytest.raises(ProblemError, match="no datasheet"):
        peaks_for("Tesla K80")


def test_grid_and_sample():
    g = grid()
    assert len(g) == 1000 and len(set(g)) == 1000
    assert {p.M for p in g} == set(GRID_DIMS)
    s1, s2 = sample_grid(60, seed=0), sample_grid(60, seed=0)
    assert s1 == s2 and len(set(s1)) == 60 and set(s1) <= set(g)
    assert sample_grid(60, seed=1) != s1
    assert [p.flops for p in s1] == sorted(p.flops for p in s1)
    with pytest.raises(ProblemError):
        sample_grid(0)
    with pytest.raises(ProblemError):
        sample_grid(1001)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 1000])
def test_parts_are_disjoint_cover_and_mixed(n):
    g = grid()
    parts = [part_of(g, k, n) for k in range(1, n + 1)]
    assert sum(len(p) for p in parts) == 1000
    assert set().union(*map(set, parts)) == set(g)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # the order the shapes come in does not change the parts; within a part, smallest first
    assert part_of(list(reversed(g)), 1, n) == parts[0]
    assert [p.flops for p in parts[-1]] == sorted(p.flops for p in parts[-1])
    if n == 5:  # each part a like mix: its FLOPs within 25% of the mean part's
        total = [sum(p.flops for p in part) for part in parts]
        assert max(total) < 1.25 * sum(total) / n and min(total) > 0.75 * sum(total) / n


@pytest.mark.parametrize("text, want", [("1/5", (1, 5)), (" 5 / 5 ", (5, 5)), ("1/1", (1, 1))])
def test_parse_part(text, want):
    assert parse_part(text) == want


@pytest.mark.parametrize("text", ["0/5", "6/5", "1/0", "a/b", "1", "1/5/2", "-1/5", ""])
def test_parse_part_refuses(text):
    with pytest.raises(ProblemError, match="K/N with 1 <= K <= N"):
        parse_part(text)


def test_read_shapes(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("# decode\n1_4096_4096\n\n7_7_7  # odd\n1_4096_4096\n")
    ps = read_shapes(str(f))
    assert [p.mnk for p in ps] == ["1_4096_4096", "7_7_7"]
    c = tmp_path / "s.csv"
    c.write_text("x,mnk\n1,64_64_64\n2,128_64_64\n")
    assert [p.mnk for p in read_shapes(str(c))] == ["64_64_64", "128_64_64"]
    bad = tmp_path / "bad.txt"
    bad.write_text("64_64_64\n64_64\n")
    with pytest.raises(ProblemError, match="bad.txt:2"):
        read_shapes(str(bad))
    empty = tmp_path / "e.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ProblemError, match="no shapes"):
        read_shapes(str(empty))
