"""examples/hf_generate.py on the CPU (the tier that needs no GPU): the tiny Llama preset in bf16 (the dtype the
transformers patch tier uses on CPU too), served from an empty library (torch.matmul serves every CPU call).

One run of all four modes on one (batch, prompt) cell: the CSV has a row per mode with the run's provenance, patched
greedy tokens equal stock's (eager and compiled; compiled on CPU is torch.compile with the aot_eager backend, which
the CSV and the printout state), the served-by breakdown names every distinct nn.Linear shape at the decode and the
prefill M. An eager-only run covers a batch x prompt grid; bad arguments get one-line errors.
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

from gemmrl.library import Library
from gemmrl.serve import dispatch
from gemmrl.serve.patching import is_patched

ROOT = Path(__file__).resolve().parents[2]
MODES = ["stock-eager", "patched-eager", "stock-compiled", "patched-compiled"]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("hf_generate", ROOT / "examples" / "hf_generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def empty_library(tmp_path):
    path = tmp_path / "empty_library.json"
    Library().save(path)
    yield str(path)
    dispatch.use_library(None)


def rows_of(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def tiny(lib: str, out: Path, *extra: str) -> list[str]:
    return ["--model", "tiny", "--dtype", "bf16", "--device", "cpu", "--new-tokens", "4", "--warmup", "1",
            "--repeats", "1", "--library", lib, "--out", str(out), *extra]


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a .functools.lru_cache:UserWarning")
def test_four_modes_tokens_equal_and_every_linear_shape_served(example, empty_library, tmp_path, capsys):
    torch._dynamo.reset()
    try:
        assert example.main(tiny(empty_library, tmp_path, "--batches", "2", "--prompt-lens", "5")) == 0
    finally:
        torch._dynamo.reset()
    printed = capsys.readouterr().out
    rows = rows_of(tmp_path / "hf_generate_tiny_bf16.csv")
    assert [r["mode"] for r in rows] == MODES
    for r in rows:
        assert (r["batch"], r["prompt_len"], r["new_tokens"], r["dtype"]) == ("2", "5", "4", "bf16")
        assert float(r["prefill_tokens_per_s"]) > 0 and float(r["decode_tokens_per_s"]) > 0
        assert r["git_sha"] and r["gpu"] == "cpu" and r["torch"] == torch.__version__
        assert r["transformers"] == __import__("transformers").__version__
        assert r["peak_mem_gib"] == ""  # CUDA only
        assert float(r["cpu_per_wall"]) > 0 and int(r["os_threads"]) >= 1
    by = {r["mode"]: r for r in rows}
    for mode in ("patched-eager", "patched-compiled"):
        assert by[mode]["tokens_equal_stock"] == "True", by[mode]
        assert by[mode]["tokens_vs"] == mode.replace("patched", "stock")
        assert by[mode]["patched_layers"] == "15"  # 7 per layer x 2 layers + lm_head
    for mode in ("stock-compiled", "patched-compiled"):
        assert "backend='aot_eager'" in by[mode]["compile"] and "on CPU" in by[mode]["compile"]
        assert int(by[mode]["compiled_graphs"]) >= 1 and by[mode]["graph_breaks"] == "0"
    assert by["stock-eager"]["compile"] == "eager"
    assert ("note: compiled modes are generate's decode steps compiled: CompileConfig(backend='aot_eager', "
            "dynamic=False); prefill eager on CPU") in printed

    served = rows_of(tmp_path / "hf_generate_tiny_bf16_served.csv")
    # hidden 64, 4 heads of 16, 2 KV heads, MLP 128, vocab 256: (N, K) of q/o, k/v, gate/up, down, lm_head
    shapes = {"64_64", "32_64", "128_64", "64_128", "256_64"}
    assert {r["shape_nk"] for r in served} == shapes
    assert {(r["shape_nk"], r["phase"], r["M"]) for r in served} == \
        {(s, ph, m) for s in shapes for ph, m in (("decode", "2"), ("prefill", "10"))}
    assert all(r["eager"] == "torch.matmul" and r["graph"] for r in served)
    assert {r["layers"] for r in served} == {"q_proj, o_proj (4 layers)", "k_proj, v_proj (4 layers)",
                                             "gate_proj, up_proj (4 layers)", "down_proj (2 layers)",
                                             "lm_head (1 layer)"}
    for s in shapes:
        assert f"2_{s}" in printed and f"10_{s}" in printed
    table = printed.rstrip().splitlines()
    assert table[-1].endswith("hf_generate_tiny_bf16.csv")
    assert table[-4].startswith("kind") and table[-3].startswith("eager") and table[-2].startswith("compiled")
    assert table[-3].endswith("| yes") and table[-2].endswith("| yes")


def test_eager_grid_one_row_per_mode_batch_and_prompt(example, empty_library, tmp_path):
    args = tiny(empty_library, tmp_path, "--batches", "1,3", "--prompt-lens", "4,7", "--modes",
                "patched-eager,stock-eager")
    assert example.main(args) == 0
    rows = rows_of(tmp_path / "hf_generate_tiny_bf16.csv")
    cells = [(b, p) for b in ("1", "3") for p in ("4", "7")]
    # cell by cell, stock first whatever the order given: the two eager modes' timed generates interleave
    assert [(r["mode"], r["batch"], r["prompt_len"]) for r in rows] == \
        [(m, b, p) for b, p in cells for m in ("stock-eager", "patched-eager")]
    assert {r["order"] for r in rows} == {"interleaved"}
    for r in rows:  # each timed generate kept, the median among them
        each = [float(x) for x in r["decode_ms_per_token_each"].split()]
        assert len(each) == 1 and len(r["ttft_ms_each"].split()) == 1 and float(r["decode_ms_per_token"]) == \
            pytest.approx(each[0], abs=1e-3)
    assert all(r["tokens_equal_stock"] == "True" for r in rows if r["mode"] == "patched-eager")
    served = rows_of(tmp_path / "hf_generate_tiny_bf16_served.csv")
    assert {r["M"] for r in served if r["phase"] == "decode"} == {"1", "3"}
    assert {r["M"] for r in served if r["phase"] == "prefill"} == {"4", "7", "12", "21"}


@pytest.mark.parametrize("order", ["interleaved", "sequential"])
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a .functools.lru_cache:UserWarning")
def test_compiled_modes_interleave_on_one_compiled_call_or_run_one_after_the_other(example, empty_library, tmp_path,
                                                                                   order):
    """--compiled-order interleaved (the default): the compiled modes' timed generates alternate on generate's one
    compiled call, dynamo keeping a graph per mode (the switch by patch / unpatch recompiles nothing after the
    first generate of each), tokens equal; sequential: each mode compiled afresh, one after the other."""
    torch._dynamo.reset()
    compiled = []
    real = example.set_mode

    def spy(model, mode, *a, **k):
        got = real(model, mode, *a, **k)
        compiled.append(mode)
        return got

    example.set_mode = spy
    try:
        extra = () if order == "interleaved" else ("--compiled-order", "sequential")
        assert example.main(tiny(empty_library, tmp_path, "--batches", "2", "--prompt-lens", "5", "--modes",
                                 "stock-compiled,patched-compiled", "--repeats", "2", *extra)) == 0
    finally:
        example.set_mode = real
        torch._dynamo.reset()
    rows = rows_of(tmp_path / "hf_generate_tiny_bf16.csv")
    assert [r["mode"] for r in rows] == ["stock-compiled", "patched-compiled"]
    assert {r["order"] for r in rows} == {order}
    assert rows[1]["tokens_equal_stock"] == "True" and all(r["graph_breaks"] == "0" for r in rows)
    # set_mode (a dynamo reset each) once per mode before any generate, or once per mode between them; the last
    # call leaves the model as it was built
    assert compiled == ["stock-compiled", "patched-compiled", "stock-eager"]
    graphs = [int(r["compiled_graphs"]) for r in rows]  # interleaved: one decode graph per mode, both counted
    assert graphs == ([2, 2] if order == "interleaved" else [1, 1])


@pytest.mark.parametrize("args, says", [
    (["--model", "llama-2"], "--model 'llama-2': use one of llama-3-8b, qwen2.5-7b, mixtral-8x7b, tiny"),
    (["--dtype", "fp32"], "--dtype 'fp32': use fp16 or bf16"),
    (["--batches", "1,x"], "--batches takes comma-separated positive integers, got '1,x'"),
    (["--prompt-lens", "0"], "--prompt-lens takes comma-separated positive integers"),
    (["--new-tokens", "1"], "--new-tokens 1: give at least 2"),
    (["--modes", "eager"], "--modes eager: use some of stock-eager"),
    (["--device", "tpu"], "--device 'tpu': use cuda, cpu or auto"),
    (["--model", "llama-3-8b", "--prompt-lens", "8190"], "is past llama-3-8b's 8192 positions"),
    (["--library", "/nonexistent.json"], "--library '/nonexistent.json': no such file"),
    (["--warmup", "0"], "give at least 1 of each"),
    (["--new-tokens", "many"], "argument --new-tokens: invalid int value: 'many'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_get_one_line_errors(example, capsys, args, says):
    assert example.main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("hf_generate.py: error: ") and says in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_asked_for_without_a_gpu_is_a_one_line_error(example, capsys):
    assert example.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == "hf_generate.py: error: --device cuda: torch sees no CUDA GPU here\n"


def patched_per_generate(example, monkeypatch) -> list[bool]:
    """Whether the model was patched at each generate the example runs, in order (filled as it runs)."""
    real = example.generate_once
    seen = []

    def spy(model, ids, new_tokens, sync):
        seen.append(any(is_patched(m) for m in model.modules()))
        return real(model, ids, new_tokens, sync)

    monkeypatch.setattr(example, "generate_once", spy)
    return seen


def test_eager_modes_alternate_stock_and_patched_generates(example, empty_library, tmp_path, monkeypatch):
    seen = patched_per_generate(example, monkeypatch)
    args = tiny(empty_library, tmp_path, "--batches", "1", "--prompt-lens", "4", "--modes", "stock-eager,patched-eager",
                "--repeats", "3", "--recheck", "0")
    assert example.main(args) == 0
    # one untimed each, then timed: stock, patched | patched, stock | stock, patched
    assert seen == [False, True, False, True, True, False, False, True]


@pytest.mark.parametrize("bar,rechecked", [("1000", True), ("0.001", False)])
def test_a_cell_under_the_bar_is_rechecked_interleaved_and_its_rechecks_count(example, empty_library, tmp_path,
                                                                             monkeypatch, capsys, bar, rechecked):
    """The noise rule: a patched mode under --bar x stock's gets --recheck further interleaved pairs (the ABBA order
    continued), and the ratio of their medians is the one the row counts and the table prints."""
    seen = patched_per_generate(example, monkeypatch)
    args = tiny(empty_library, tmp_path, "--batches", "2", "--prompt-lens", "3", "--modes", "stock-eager,patched-eager",
                "--repeats", "2", "--recheck", "3", "--bar", bar)
    assert example.main(args) == 0
    base = [False, True, False, True, True, False]  # untimed each; timed stock, patched | patched, stock
    more = [False, True, True, False, False, True]  # rechecks: stock, patched | patched, stock | stock, patched
    assert seen == base + (more if rechecked else [])
    stock, patched = rows_of(tmp_path / "hf_generate_tiny_bf16.csv")
    assert stock["decode_vs_stock"] == "" and stock["recheck_decode_ms_per_token_each"] == ("" if not rechecked else
                                                                                             stock["recheck_decode_ms_per_token_each"])
    first = float(stock["ttft_ms"]) / float(patched["ttft_ms"])
    assert float(patched["prefill_vs_stock"]) == pytest.approx(first, rel=1e-3)
    if rechecked:
        assert patched["rechecks"] == "3" and len(stock["recheck_decode_ms_per_token_each"].split()) == 3
        s_each = sorted(map(float, stock["recheck_decode_ms_per_token_each"].split()))
        p_each = sorted(map(float, patched["recheck_decode_ms_per_token_each"].split()))
        assert float(patched["decode_vs_stock_counted"]) == pytest.approx(s_each[1] / p_each[1], rel=2e-3)
        assert patched["decode_vs_stock_counted"] == patched["decode_vs_stock_recheck"]
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("eager "))
        assert line.split("|")[-2].strip() == "3"  # the table's rechecks column
        assert line.split("|")[2].split()[-1] == f"{float(patched['decode_vs_stock_counted']):.3f}"
    else:
        assert patched["rechecks"] == "0" and patched["decode_vs_stock_recheck"] == ""
        assert patched["decode_vs_stock_counted"] == patched["decode_vs_stock"]


def test_a_bad_recheck_or_bar_is_a_one_line_error(example, capsys):
    assert example.main(["--recheck", "-1"]) == 2
    assert example.main(["--bar", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("--recheck" in e and "--bar" in e for e in err)


@pytest.mark.parametrize("modes", ["stock-eager,patched-eager", "stock-compiled,patched-compiled"])
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a .functools.lru_cache:UserWarning")
def test_profile_writes_each_modes_kernels_per_cell(example, empty_library, tmp_path, capsys, modes):
    """--profile: one more generate per cell and mode under torch.profiler; its kernels (on a CPU, the CPU ops) by
    name, launches and time, with the matrix products among them, and the longest printed per cell."""
    torch._dynamo.reset()
    try:
        assert example.main(tiny(empty_library, tmp_path, "--batches", "1,2", "--prompt-lens", "5", "--modes", modes,
                                 "--profile")) == 0
    finally:
        torch._dynamo.reset()
    rows = rows_of(tmp_path / "hf_generate_tiny_bf16_kernels.csv")
    cells = {(r["mode"], r["batch"]) for r in rows}
    assert cells == {(m, b) for m in modes.split(",") for b in ("1", "2")}
    for cell in cells:
        mine = [r for r in rows if (r["mode"], r["batch"]) == cell]
        assert all(int(r["launches"]) >= 1 and float(r["total_us"]) >= 0 for r in mine)
        assert [float(r["total_us"]) for r in mine] == sorted((float(r["total_us"]) for r in mine), reverse=True)
        assert any(r["kernel"] in ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear") for r in mine), mine[:8]
        assert float(mine[0]["us_per_new_token"]) == pytest.approx(float(mine[0]["total_us"]) / 4, rel=1e-3, abs=1e-2)
    tl = rows_of(tmp_path / "hf_generate_tiny_bf16_timeline.csv")
    assert {(r["mode"], r["batch"]) for r in tl} == cells
    for r in tl:
        span, busy = float(r["span_us"]), float(r["busy_us"])
        idle = float(r["idle_short_us"]) + float(r["idle_long_us"])
        assert busy > 0 and span == pytest.approx(busy + idle, rel=1e-3, abs=0.1)
    assert all(float(r["idle_before_us"]) >= 0 for r in rows)
    host = rows_of(tmp_path / "hf_generate_tiny_bf16_host.csv")
    assert {(r["mode"], r["batch"]) for r in host} == cells
    for cell in cells:
        mine = [r for r in host if (r["mode"], r["batch"]) == cell]
        assert 0 < len(mine) <= example.HOST_TOP and all(int(r["count"]) >= 1 for r in mine)
        assert [float(r["self_us"]) for r in mine] == sorted((float(r["self_us"]) for r in mine), reverse=True)
    out = capsys.readouterr().out
    assert "longest kernels per cell (--profile" in out and "the timeline per cell" in out


@pytest.mark.parametrize("spans, before, tot", [
    ([], {}, {"span_us": 0.0, "busy_us": 0.0, "idle_short_us": 0.0, "idle_long_us": 0.0, "long_gaps": 0}),
    # back to back, a short gap, a long one
    ([("a", 0, 10), ("b", 10, 15), ("a", 17, 20), ("c", 60, 70)], {"a": 2.0, "c": 40.0},
     {"span_us": 70.0, "busy_us": 28.0, "idle_short_us": 2.0, "idle_long_us": 40.0, "long_gaps": 1}),
    # nested and overlapping spans add no idle and count busy once; unsorted input
    ([("c", 30, 31), ("a", 0, 10), ("b", 2, 5), ("d", 8, 12)], {"c": 18.0},
     {"span_us": 31.0, "busy_us": 13.0, "idle_short_us": 18.0, "idle_long_us": 0.0, "long_gaps": 0}),
    # a gap of exactly the threshold is long
    ([("a", 0, 1), ("b", 21, 22)], {"b": 20.0},
     {"span_us": 22.0, "busy_us": 2.0, "idle_short_us": 0.0, "idle_long_us": 20.0, "long_gaps": 1}),
])
def test_idle_before_splits_the_timeline(example, spans, before, tot):
    """The profile's timeline: idle time before each kernel name, busy time as the union of spans, gaps split at
    SHORT_GAP_US (between kernels of one burst, or waiting on the host)."""
    assert example.SHORT_GAP_US == 20.0
    got_before, got_tot = example.idle_before([(n, float(a), float(b)) for n, a, b in spans])
    assert got_before == pytest.approx(before) and got_tot == pytest.approx(tot)
