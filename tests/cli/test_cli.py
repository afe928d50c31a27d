"""CLI errors come back clear and non-zero (without a GPU, bench verifies instead: test_bench_cpu.py)."""


import pytest

from gemmrl.cli.main import main


def _run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["bench", "--mnk", "64_64"], "cannot parse shape"),
    (["bench", "--mnk", "0_64_64"], ">= 1"),
    (["bench", "--mnk", "64_64_64", "--protocol", "warm"], "--protocol takes"),
    (["bench", "--mnk", "64_64_64", "--mode", "graph"], "--mode is"),
    (["bench", "--grid", "cuda-l2", "--sample", "0"], "--sample must be"),
    (["bench", "--grid", "other"], "knows only"),
    (["bench", "--shapes", "/nonexistent/shapes.txt"], "no such file"),
    (["bench"], "exactly one of"),
    (["bench", "--mnk", "64_64_64", "--grid", "cuda-l2"], "exactly one of"),
])
def test_cli_errors(argv, needle, capsys):
    code, err = _run(argv, capsys)
    assert code == 2 and needle in err


@pytest.mark.parametrize("extra,needle", [
    (["--cuda-source", "/nonexistent/k.cu"], "no such file"),
    (["--cuda-source", "{src}", "--declare", "Q=3"], "cannot read"),
    (["--cuda-source", "{src}", "--abi", "cuda_l2"], "M_N_K"),
    (["--cuda-source", "{src}", "--entry", "9x"], "not a C identifier"),
    (["--cuda-source", "{src}", "--triton-top", "4"], "sandbox"),
    (["--cutlass-from", "/nonexistent/sel.csv"], "no such file"),
])
def test_cuda_source_flag_errors(extra, needle, capsys, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" int gemmrl_gemm() { return 0; }')
    code, err = _run(["bench", "--mnk", "64_64_64", *[x.format(src=src) for x in extra]], capsys)
    assert code == 2 and needle in err


def test_select_family_flag(capsys):
    with pytest.raises(SystemExit):
        main(["select", "--mnk", "64_64_64", "--family", "cublas"])


def test_unknown_dtype_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--mnk", "64_64_64", "--dtype", "fp8"])
    assert e.value.code == 2


@pytest.mark.parametrize("flags, sweep, want", [
    ([], False, ("pairs", 5.0)), (["--host-loop", "all"], False, ("all", 5.0)),
    (["--host-loop", "pairs", "--mode", "server", "--pin-cpu"], True, ("pairs", 0.25)),
])
def test_bench_host_loop_flag_reaches_the_timing_config(flags, sweep, want):
    from gemmrl.cli.bench import timing_config
    from gemmrl.cli.main import build_parser

    cfg = timing_config(build_parser().parse_args(["bench", "--mnk", "64_64_64", *flags]), sweep)
    assert (cfg.host_loop, cfg.warmup_s) == want and cfg.pin_cpu == ("--pin-cpu" in flags)


def test_bench_host_loop_flag_refuses_other_values(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--mnk", "64_64_64", "--host-loop", "crowd"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --host-loop: invalid choice: 'crowd' (choose from" in err
