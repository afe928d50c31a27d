"""`gemmrl report` without --out: ./gemmrl-report, and inside a gemmrl checkout the user cache, never the repository."""

from __future__ import annotations

from pathlib import Path

from gemmrl.cli.report import default_out


def test_outside_a_checkout_the_report_goes_to_the_cwd(tmp_path):
    assert default_out(tmp_path) == tmp_path.resolve() / "gemmrl-report"


def test_inside_a_checkout_it_goes_to_the_cache(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "src" / "gemmrl").mkdir(parents=True)
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    for cwd in (repo, repo / "benchmarks" / "results"):
        out = default_out(cwd)
        assert out == tmp_path / "cache" / "report"
        assert repo.resolve() not in out.resolve().parents


def test_this_repository_is_recognised():
    root = Path(__file__).resolve().parents[2]
    assert root not in default_out(root).resolve().parents
