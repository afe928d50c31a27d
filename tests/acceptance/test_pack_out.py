"""benchmarks/acceptance/pack_out.sh: a GPU call's output folder left with at most 8 files (what the device returns):
the results as they are where they are few, everything else packed; nothing lost."""

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "acceptance" / "pack_out.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None,
                                reason="needs bash and tar")


def pack(folder: Path) -> set[str]:
    subprocess.run(["bash", str(SCRIPT), str(folder)], check=True, capture_output=True, text=True)
    return {p.name for p in folder.iterdir()}


def members(tgz: Path) -> set[str]:
    with tarfile.open(tgz) as t:
        return {m.name for m in t.getmembers() if m.isfile()}


@pytest.mark.parametrize("results, others", [
    (["a.csv", "b.csv.gz", "lib.json", "journey_cache_qwen2.5-7b_fp16.tgz", "journey_cache_llama-3-8b_bf16.tgz"],
     ["a.summary.md", "job0.log", "vendor-choices.tgz"]),
    (["a.csv"], []),
    ([], ["job0.log", "job1.log"]),
])
def test_few_results_stay_and_the_rest_is_packed(tmp_path, results, others):
    for name in results + others:
        (tmp_path / name).write_text(name)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.txt").write_text("x")
    left = pack(tmp_path)
    assert left == set(results) | {"extras.tgz"} and len(left) <= 8
    assert members(tmp_path / "extras.tgz") == set(others) | {"sub/deep.txt"}


def test_many_results_go_into_one_tarball(tmp_path):
    names = [f"r{i}.csv" for i in range(9)] + ["s.summary.md"]
    for name in names:
        (tmp_path / name).write_text(name)
    assert pack(tmp_path) == {"results.tgz", "extras.tgz"}
    assert members(tmp_path / "results.tgz") == set(names[:9]) and members(tmp_path / "extras.tgz") == {names[9]}


def test_a_missing_folder_is_an_error(tmp_path):
    got = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "none")], capture_output=True, text=True)
    assert got.returncode != 0
