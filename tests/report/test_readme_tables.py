"""report/readme.py: the README's per-GPU results tables are what `gemmrl report --readme README.md` makes from the
indexed files (a README edited by hand, or a result file changed without regenerating, fails here), every figure of
the Results section sits inside a generated block, and the generator's numbers are checked by hand on synthetic rows."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

from gemmrl.cli.main import main as gemmrl
from gemmrl.report import index
from gemmrl.report import readme as RM
from gemmrl.results import COLUMNS

ROOT = Path(__file__).resolve().parents[2]
MAX_README_LINES = 250


def _row(mnk, cand, tflops, proto="graph", dtype="fp16", **kw):
    m, n, k = (int(x) for x in mnk.split("_"))
    flops = 2 * m * n * k
    r = {c: "" for c in COLUMNS}
    r.update(mnk=mnk, dtype=dtype, acc="fp32", layout="tn", candidate=cand, protocol=proto, tflops=str(tflops),
             time_ms=str(flops / (tflops * 1e9)), n="10", verified="true", gpu="NVIDIA H100 80GB HBM3", cc="9.0",
             git_sha="abc1234def56", timestamp="2026-11-26T00:00:00Z", M=str(m), N=str(n), K=str(k), driver="580.1",
             torch="2.11.0", cuda="13.0", floor_ms=str(flops / 1e15), floor_ok="true", rep="0")
    r.update(kw)
    return r


# per shape: gemmrl.mm's speed and the seven vendor paths' (vendor_best: the fastest of them)
SPEEDS = {"64_64_64": (2.0, {"torch": 1.0, "cublas_tn": 1.0, "cublas_nn": 1.6, "cublaslt_heuristic_tn": 1.0,
                             "cublaslt_heuristic_nn": 1.0, "cublaslt_autotuned_tn": 1.0, "cublaslt_autotuned_nn": 2.5}),
          "128_128_128": (3.0, {"torch": 2.0, "cublas_tn": 2.5, "cublas_nn": 2.0, "cublaslt_heuristic_tn": 2.0,
                                "cublaslt_heuristic_nn": 2.0, "cublaslt_autotuned_tn": 2.0, "cublaslt_autotuned_nn": 2.4})}


# per shape: the three head-to-head rechecks, (gemmrl.mm, vendor_best's member) speeds in each batch
RECHECKED = {"64_64_64": ("cublaslt_autotuned_nn", [(2.0, 2.5), (2.2, 2.0), (1.8, 2.4)]),   # medians 2.0 / 2.4
             "128_128_128": ("cublas_tn", [(3.0, 2.5), (2.9, 2.6), (3.3, 2.4)])}          # medians 3.0 / 2.5


def _repo(tmp_path: Path, protos=("graph",), dtype="fp16", ours=True, rechecks=()) -> tuple[Path, str]:
    root = tmp_path / "repo"
    d = root / "benchmarks" / "results" / "h100"
    d.mkdir(parents=True)
    name = "h100_serve2_gemmrl-mm_graph_abc1234_2026-11-26.csv"
    rows = []
    for p in protos:
        for mnk, (g, vendor) in SPEEDS.items():
            rows += [_row(mnk, c, v, p, dtype) for c, v in vendor.items()]
            if ours:
                rows.append(_row(mnk, "gemmrl", g, p, dtype))
            if mnk in rechecks:
                member, batches = RECHECKED[mnk]
                rows.append(_row(mnk, "vendor_best", vendor[member], p, dtype, members=member))
                for k, (ours_k, theirs_k) in enumerate(batches, 1):
                    rows += [_row(mnk, "gemmrl", ours_k, p, dtype, recheck=str(k)),
                             _row(mnk, member, theirs_k, p, dtype, recheck=str(k))]
    rows.append(dict(_row("64_64_64", "gemmrl", 99.0, protos[0], dtype), verified="false", reason="failed",
                     tflops="", time_ms=""))  # an unverified row never counts
    with open(d / name, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (root / "README.md").write_text(f"# x\n\n## Results\n\n<!-- gpu-results h100: {name} -->\nstale\n"
                                    f"{RM.END}\n\n## Limits\n")
    index.write(root)
    return root, name


@pytest.mark.parametrize("protos", [("graph",), ("graph", "offline"), ("cold", "server")])
def test_table_numbers_by_hand(tmp_path, protos):
    root, name = _repo(tmp_path, protos)
    text = RM.render(root, (root / "README.md").read_text())
    lines = [ln for ln in text.splitlines() if ln.startswith("| 1 |")]
    assert [ln.split(" | ")[1] for ln in lines] == list(protos)
    # per shape over torch 2/1, 3/2; cublas (the faster layout) 2/1.6, 3/2.5; cublaslt_heuristic 2/1, 3/2;
    # cublaslt_autotuned 2/2.5, 3/2.4; vendor_best 2/2.5, 3/2.5
    want = [math.sqrt(2 * 1.5), math.sqrt(1.25 * 1.2), math.sqrt(2 * 1.5), math.sqrt(0.8 * 1.25),
            math.sqrt(0.8 * 1.2)]
    for ln in lines:
        cells = ln.strip("| ").split(" | ")
        assert cells[2:4] == ["fp16", "2"]
        assert cells[4:9] == [f"{x:.3f}" for x in want], ln
        assert cells[9:] == ["0.800", "1", "–"]  # min over vendor_best, shapes below 1.00, no second run
    assert f"1. `{name}`: git abc1234def56, 2026-11-26, made by `gemmrl bench`" in text
    assert "NVIDIA H100 80GB HBM3, driver 580.1, torch 2.11.0, CUDA 13.0" in text
    assert "stale" not in text


@pytest.mark.parametrize("rechecked, want", [(tuple(RECHECKED), f"{math.sqrt(2.0 / 2.4 * 3.0 / 2.5):.3f}"),
                                              (("64_64_64",), "–")])
def test_the_second_run_column_is_the_rechecks_median_ratio_where_every_shape_has_them(tmp_path, rechecked, want):
    """vendor_best's member chosen on the first run, the pair's ratio from the head-to-head rechecks (median of each
    side over the batches); a file where one shape has no rechecks shows none rather than a biased subset."""
    root, _ = _repo(tmp_path, rechecks=rechecked)
    text = RM.render(root, (root / "README.md").read_text())
    cells = next(ln for ln in text.splitlines() if ln.startswith("| 1 |")).strip("| ").split(" | ")
    assert cells[8] == f"{math.sqrt(0.8 * 1.2):.3f}" and cells[11] == want  # the first run's column is unchanged


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_check_then_write_then_check(tmp_path, monkeypatch, capsys, dtype):
    root, _ = _repo(tmp_path, dtype=dtype)
    monkeypatch.chdir(root)
    before = (root / "README.md").read_text()
    assert gemmrl(["report", "--readme", "README.md", "--check"]) == 1
    assert (root / "README.md").read_text() == before and "out of date: README.md" in capsys.readouterr().out
    assert gemmrl(["report", "--readme", "README.md"]) == 0
    assert f"| 1 | graph | {dtype} | 2 |" in (root / "README.md").read_text()
    assert gemmrl(["report", "--readme", "README.md", "--check"]) == 0


@pytest.mark.parametrize("case,needle", [
    ("unindexed", "no row in benchmarks/results/h100/INDEX.csv"),
    ("no_ours", "no verified gemmrl rows"),
    ("unclosed", "has no '<!-- gpu-results end -->' line"),
    ("no_block", "no '<!-- gpu-results GPU: FILE... -->'"),
])
def test_bad_blocks_say_what_to_do(tmp_path, monkeypatch, capsys, case, needle):
    root, name = _repo(tmp_path, ours=case != "no_ours")
    readme = root / "README.md"
    if case == "unindexed":
        readme.write_text(readme.read_text().replace(name, "h100_other_2026-11-26.csv"))
    elif case == "unclosed":
        readme.write_text(readme.read_text().replace(RM.END, ""))
    elif case == "no_block":
        readme.write_text("# x\n")
    monkeypatch.chdir(root)
    before = readme.read_text()
    assert gemmrl(["report", "--readme", "README.md"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert readme.read_text() == before


def test_readme_tables_are_what_the_indexed_files_give():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = RM.blocks(text)
    assert {b.gpu for b in found} >= {"h100", "h200"}, "one results table per GPU with a library or a transfer run"
    assert len({b.gpu for b in found}) == len(found), "one block per GPU"
    assert RM.render(ROOT, text) == text, "README.md's results differ: run `gemmrl report --readme README.md`"


def test_readme_results_figures_are_all_generated():
    """Outside the generated blocks, the Results section states no number (file names and paths aside)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    section = text[text.index("## Results"):text.index("\n## ", text.index("## Results") + 3)]
    for b in reversed(RM.blocks(section)):
        section = section[:b.head] + section[b.tail:]
    prose = re.sub(r"`[^`]*`", "", section)
    figures = re.findall(r"\d+(?:\.\d+)?\s*(?:%|x\b)|\b\d\.\d+\b|\b\d{2,}\b", prose)
    assert not figures, f"hand-written figures in the README's Results section: {figures}"


# ------------------------------------------------------------------------ hf-generate blocks (examples/hf_generate.py)

HF_COLUMNS = ("model", "layers", "dtype", "mode", "batch", "prompt_len", "new_tokens", "prefill_tokens_per_s",
              "decode_tokens_per_s", "ttft_ms", "decode_ms_per_token", "peak_mem_gib", "tokens_vs",
              "tokens_equal_stock", "first_diff_step", "patched_layers", "compiled_graphs", "graph_breaks", "compile",
              "order", "first_generate_s", "warmup", "repeats", "device", "gpu", "torch", "transformers", "git_sha",
              "timestamp", "command")
HF_NAME = "h100_hf-generate_tiny_bf16_eager-compiled_abc1234_2026-11-26.csv"
# (mode, batch, prompt, prefill tok/s, decode tok/s, decode ms per token, peak GiB, tokens equal, first diff step)
HF_CELLS = [("stock-eager", 1, 8, 100.0, 10.0, 40.0, 1.0, "", ""),
            ("patched-eager", 1, 8, 125.0, 8.0, 50.0, 1.0, "True", ""),
            ("stock-eager", 2, 8, 300.0, 30.0, 30.0, 1.5, "", ""),            # no patched-eager at batch 2: no row
            ("stock-compiled", 1, 8, 200.0, 40.0, 5.0, 2.0, "", ""),
            ("patched-compiled", 1, 8, 150.0, 50.0, 4.0, 2.25, "False", "3")]


def _hf_row(mode, batch, prompt, prefill, decode, ms, peak, equal, step, drop=()):
    r = {c: "" for c in HF_COLUMNS}
    r.update(model="tiny", layers="2", dtype="bf16", mode=mode, batch=str(batch), prompt_len=str(prompt),
             new_tokens="4", prefill_tokens_per_s=str(prefill), decode_tokens_per_s=str(decode),
             decode_ms_per_token=str(ms), peak_mem_gib=str(peak), tokens_equal_stock=equal, first_diff_step=step,
             order="interleaved" if mode.endswith("eager") else "sequential", device="cuda",
             gpu="NVIDIA H100 80GB HBM3", torch="2.11.0", transformers="5.24.0", git_sha="abc1234def56",
             timestamp="2026-11-26T00:00:00Z", command="python examples/hf_generate.py --model tiny")
    return {c: v for c, v in r.items() if c not in drop}


def _hf_repo(tmp_path: Path, cells=HF_CELLS, drop=(), gpu_block=False) -> tuple[Path, str]:
    """A repository with one hf_generate CSV (and, with ``gpu_block``, the gpu-results file of ``_repo``), indexed,
    and a README naming it in a stale hf-generate block."""
    if gpu_block:
        root, gpu_name = _repo(tmp_path)
    else:
        root, gpu_name = tmp_path / "repo", ""
        (root / "benchmarks" / "results" / "h100").mkdir(parents=True)
    cols = [c for c in HF_COLUMNS if c not in drop]
    with open(root / "benchmarks" / "results" / "h100" / HF_NAME, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        w.writerows(_hf_row(*c, drop=drop) for c in cells)
    gpu = f"## Results\n\n<!-- gpu-results h100: {gpu_name} -->\nstale\n{RM.END}\n\n" if gpu_block else ""
    (root / "README.md").write_text(f"# x\n\n## Quick start\n\n<!-- hf-generate h100: {HF_NAME} -->\nstale\n"
                                    f"{RM.HF_END}\n\n{gpu}## Limits\n")
    index.write(root)
    return root, HF_NAME


@pytest.mark.parametrize("drop", [(), ("order", "first_generate_s")])  # older files lack these two columns
def test_hf_table_numbers_by_hand(tmp_path, drop):
    root, name = _hf_repo(tmp_path, drop=drop)
    text = RM.render(root, (root / "README.md").read_text())
    rows = [ln.strip("| ").split(" | ") for ln in text.splitlines() if ln.startswith("| 1 |")]
    # eager b1: prefill 125/100, decode 8/10; compiled b1: prefill 150/200, decode 50/40; eager b2 has no patched row
    assert rows == [["1", "eager", "1", "8", "100", "125", "1.250", "10.0", "8.0", "0.800", "1.00/1.00", "yes"],
                    ["1", "compiled", "1", "8", "200", "150", "0.750", "40.0", "50.0", "1.250", "2.00/2.25",
                     "from step 3"]]
    assert "tiny, bf16, 4 new tokens, on NVIDIA H100 80GB HBM3, torch 2.11.0, transformers 5.24.0" in text
    assert "Decode ms per token (stock and patched): eager 40.0-50.0, compiled 4.0-5.0." in text
    order = "" if drop else ", timed generates interleaved, sequential"
    assert f"1. `{name}`: git abc1234def56, 2026-11-26, made by " \
           f"`benchmarks/acceptance/gpu_hf_generate.sh (examples/hf_generate.py)`{order}\n{RM.HF_END}" in text
    assert "stale" not in text


def test_hf_table_shows_the_noise_rules_ratio_where_a_cell_was_rechecked(tmp_path):
    """A patched row with counted ratios (hf_generate's interleaved cells): the table shows them, marked (rN) where
    rechecks re-measured the cell, and says what the mark means."""
    root, name = _hf_repo(tmp_path)
    path = root / "benchmarks" / "results" / "h100" / name
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    extra = {"patched-eager": dict(prefill_vs_stock="1.25", decode_vs_stock="0.8", rechecks="3",
                                   prefill_vs_stock_recheck="1.2", decode_vs_stock_recheck="1.004",
                                   prefill_vs_stock_counted="1.2", decode_vs_stock_counted="1.004"),
             "patched-compiled": dict(prefill_vs_stock="1.3", decode_vs_stock="1.25", rechecks="0",
                                      prefill_vs_stock_recheck="", decode_vs_stock_recheck="",
                                      prefill_vs_stock_counted="1.3", decode_vs_stock_counted="1.25")}
    cols = list(rows[0]) + list(extra["patched-eager"])
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, cols, restval="")
        w.writeheader()
        w.writerows({**r, **extra.get(r["mode"], {})} for r in rows)
    index.write(root)
    text = RM.render(root, (root / "README.md").read_text())
    got = [ln.strip("| ").split(" | ") for ln in text.splitlines() if ln.startswith("| 1 |")]
    assert [r[6] for r in got] == ["1.200 (r3)", "1.300"] and [r[9] for r in got] == ["1.004 (r3)", "1.250"]
    assert "(rN): the cell ran under 1.00 at first" in text


def test_hf_check_then_write_then_check(tmp_path, monkeypatch, capsys):
    root, _ = _hf_repo(tmp_path)
    monkeypatch.chdir(root)
    before = (root / "README.md").read_text()
    assert gemmrl(["report", "--readme", "README.md", "--check"]) == 1
    assert (root / "README.md").read_text() == before and "out of date: README.md" in capsys.readouterr().out
    assert gemmrl(["report", "--readme", "README.md"]) == 0
    assert "| 1 | compiled | 1 | 8 | 200 | 150 | 0.750 |" in (root / "README.md").read_text()
    assert gemmrl(["report", "--readme", "README.md", "--check"]) == 0
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("| 0.750 |", "| 0.751 |"))  # a figure edited by hand
    assert gemmrl(["report", "--readme", "README.md", "--check"]) == 1


@pytest.mark.parametrize("case,needle", [
    ("unindexed", "no row in benchmarks/results/h100/INDEX.csv"),
    ("no_pair", "no stock/patched pair"),
    ("not_hf", "no column mode"),
    ("unclosed", "has no '<!-- hf-generate end -->' line"),
    ("no_block", "nor '<!-- hf-generate GPU: FILE... -->'"),
])
def test_hf_bad_blocks_say_what_to_do(tmp_path, monkeypatch, capsys, case, needle):
    cells = [c for c in HF_CELLS if c[0].startswith("stock")] if case == "no_pair" else HF_CELLS
    root, name = _hf_repo(tmp_path, cells=cells, drop=("mode",) if case == "not_hf" else ())
    readme = root / "README.md"
    if case == "unindexed":
        readme.write_text(readme.read_text().replace(name, "h100_hf-generate_other_2026-11-26.csv"))
    elif case == "unclosed":
        readme.write_text(readme.read_text().replace(RM.HF_END, ""))
    elif case == "no_block":
        readme.write_text("# x\n")
    monkeypatch.chdir(root)
    before = readme.read_text()
    assert gemmrl(["report", "--readme", "README.md"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert readme.read_text() == before


def test_gpu_results_blocks_beside_an_hf_block_render_as_before(tmp_path):
    root, _ = _hf_repo(tmp_path, gpu_block=True)
    text = (root / "README.md").read_text()
    both = RM.render(root, text)
    alone = text[text.index("## Results"):]
    assert RM.render(root, alone) in both                       # the gpu-results block: the same text as on its own
    assert "| 1 | graph | fp16 | 2 |" in both and "| 1 | eager | 1 | 8 |" in both and "stale" not in both
    assert [b.gpu for b in RM.blocks(both)] == ["h100"] and [b.gpu for b in RM.hf_blocks(both)] == ["h100"]
    assert RM.render(root, both) == both


def test_readme_hf_block_is_what_the_indexed_files_give():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = RM.hf_blocks(text)
    assert found and text.index("## Quick start") < found[0].head < text.index("## Results")
    assert RM.render(ROOT, text) == text, "README.md's tables differ: run `gemmrl report --readme README.md`"
