"""report/index.py: benchmarks/results/<gpu>/INDEX.csv from the files and the documents that cite them, and the
committed indexes are what the generator gives (a result added without re-indexing fails here)."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

from gemmrl.cli.main import main as gemmrl
from gemmrl.report import index

ROOT = Path(__file__).resolve().parents[2]
HEAD = "mnk,candidate,protocol,time_ms,gpu,git_sha,timestamp\n"


def _repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "benchmarks" / "results" / "h100" / "logs").mkdir(parents=True)
    (r / "docs").mkdir()
    d = r / "benchmarks" / "results" / "h100"
    rows = HEAD + ("64_64_64,torch,graph,0.01,NVIDIA H100 80GB HBM3,abc1234def56,2026-11-26T04:05:03Z\n"
                   "64_64_128,torch,cold,0.02,NVIDIA H100 80GB HBM3,0123456789ab,2026-11-27T01:00:00Z\n")
    (d / "h100_grid2_vendor_graph-cold_abc1234_2026-11-26.csv.gz").write_bytes(gzip.compress(rows.encode()))
    (d / "h100_grid2_library-table_abc1234_2026-11-26.md").write_text(
        "# table\n\nCommand: `gemmrl bench --library lib.json --shapes s.txt`\n")
    (d / "logs" / "h100_gpu-tier_abc1234_2026-11-26.log").write_text("passed\n")
    (r / "README.md").write_text("# gemmrl\n\n## Results (H100)\nFrom `h100_grid2_vendor_graph-cold_abc1234_2026-11-26"
                                 ".csv.gz`.\n")
    (r / "docs" / "findings.md").write_text("# Findings\n\n## Timing\n- see h100_gpu-tier_abc1234_2026-11-26.log\n")
    return r


def _rows(text: str) -> dict[str, dict[str, str]]:
    return {row["file"]: row for row in csv.DictReader(io.StringIO(text))}


def test_entries_from_columns_names_and_docs(tmp_path):
    r = _repo(tmp_path)
    (path, text), = index.build(r).items()
    assert path == r / "benchmarks" / "results" / "h100" / "INDEX.csv"
    rows = _rows(text)
    assert list(rows) == ["h100_grid2_library-table_abc1234_2026-11-26.md",
                          "h100_grid2_vendor_graph-cold_abc1234_2026-11-26.csv.gz",
                          "logs/h100_gpu-tier_abc1234_2026-11-26.log"]
    res = rows["h100_grid2_vendor_graph-cold_abc1234_2026-11-26.csv.gz"]
    assert res["gpu"] == "NVIDIA H100 80GB HBM3"
    assert res["git_sha"] == "0123456789ab+abc1234def56"          # every sha its rows carry
    assert res["date"] == "2026-11-26..2026-11-27"
    assert res["measures"] == "grid2_vendor_graph-cold, 2 shapes, protocols cold,graph"
    assert res["command"] == "gemmrl bench"
    assert res["cited_by"] == "README.md#Results (H100)"
    md = rows["h100_grid2_library-table_abc1234_2026-11-26.md"]
    assert md["command"] == "gemmrl bench --library lib.json --shapes s.txt" and md["git_sha"] == "abc1234"
    log = rows["logs/h100_gpu-tier_abc1234_2026-11-26.log"]
    assert (log["gpu"], log["date"], log["cited_by"]) == ("NVIDIA H100", "2026-11-26", "docs/findings.md#Timing")


def test_a_comment_in_a_code_block_is_not_a_heading(tmp_path):
    r = _repo(tmp_path)
    (r / "README.md").write_text("# gemmrl\n\n## Quick start\n```bash\n# measure it\ngemmrl bench\n```\nFrom "
                                 "`h100_grid2_vendor_graph-cold_abc1234_2026-11-26.csv.gz`.\n")
    (_, text), = index.build(r).items()
    assert _rows(text)["h100_grid2_vendor_graph-cold_abc1234_2026-11-26.csv.gz"]["cited_by"] == "README.md#Quick start"


def test_a_result_added_without_reindexing_is_stale(tmp_path, capsys):
    r = _repo(tmp_path)
    assert index.run(r) == 0 and index.stale(r) == []
    assert index.run(r, check=True) == 0
    (r / "benchmarks" / "results" / "h100" / "h100_new_2026-11-28.csv").write_text(HEAD)
    assert index.stale(r) == [r / "benchmarks" / "results" / "h100" / "INDEX.csv"]
    assert index.run(r, check=True) == 1 and "out of date" in capsys.readouterr().out
    # and a document that starts citing a file changes its row too
    index.run(r)
    (r / "docs" / "findings.md").write_text("# Findings\n\n## Serving\nh100_new_2026-11-28.csv\n")
    assert index.stale(r)


def test_cli_index(tmp_path, monkeypatch, capsys):
    r = _repo(tmp_path)
    monkeypatch.chdir(r)
    assert gemmrl(["report", "--index"]) == 0
    assert (r / "benchmarks" / "results" / "h100" / "INDEX.csv").is_file()
    assert gemmrl(["report", "--index", "--check"]) == 0
    assert gemmrl(["report", "--check"]) == 2      # --check alone is a usage error


def test_committed_indexes_are_current():
    old = index.stale(ROOT)
    assert not old, f"stale: {old}; run `gemmrl report --index` in the repository root and commit the INDEX.csv files"


def test_every_results_folder_is_a_gpu_with_measurements_beside_logs():
    results = ROOT / "benchmarks" / "results"
    loose = [p.name for p in results.iterdir() if p.is_file()]
    assert not loose, f"files directly in benchmarks/results (put them in a <gpu>/ folder): {loose}"
    for d in results.iterdir():
        subs = {p.name for p in d.iterdir() if p.is_dir()}
        assert subs <= {"logs", "libraries", "trials"}, (d, subs)
        assert not [p for p in d.glob("*.log")], f"{d}: logs belong in {d}/logs"
