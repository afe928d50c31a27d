"""The speed-of-light probe and the headroom bound (headroom.py, kernels/touch.py).

CPU tier: the probe under the Triton interpreter reads every word of A and B exactly once and zero-fills C, on odd
and tiny shapes, both dtypes and layouts; the bound's arithmetic and class table on rows made here; the CLI's errors.
GPU tier: one measured shape, where the probe must not be slower than the vendor by much and the bound is >= 1.
"""

import math

import pytest

from gemmrl.cli.main import main
from gemmrl.measure.headroom import (CLASSES, PROBE_REASON, Bound, bounds, by_class, geomean, mma_peak_flops, parse_info)
from gemmrl.kernels.touch import CONFIGS, TouchCandidate, TouchConfig, TouchError, check, grid_parts, invalid, parse
from gemmrl.problem import GemmProblem

SHAPES = [(1, 7, 13), (33, 65, 129), (64, 64, 64), (130, 200, 72), (3, 4096, 40)]


@pytest.mark.parametrize("mnk", SHAPES, ids=lambda s: "_".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_probe_reads_every_word_once_and_zero_fills_c(mnk, dtype, layout):
    import torch

    from gemmrl.candidate import make_buffers

    p = GemmProblem(*mnk, dtype=dtype)
    bufs = make_buffers(p, device="cpu", seed=3)
    cand = TouchCandidate(TouchConfig(2048, 4), layout=layout, store_all=True)
    cand.prepare(p, bufs, "graph", None)
    cand(*bufs.args())
    bop = bufs.bt if layout == "tn" else bufs.b
    pa, pb, _ = grid_parts(p, 2048)
    sink = cand.sink.long()
    assert int(sink[:pa].sum()) == int(bufs.a.view(torch.int16).long().sum())
    assert int(sink[pa:pa + pb].sum()) == int(bop.view(torch.int16).long().sum())
    assert bool((bufs.c == 0).all())


def test_probe_keeps_the_sink_clean_without_store_all():
    import torch

    from gemmrl.candidate import make_buffers

    p = GemmProblem(33, 65, 129)
    bufs = make_buffers(p, device="cpu")
    cand = TouchCandidate(TouchConfig(2048, 8))
    cand.prepare(p, bufs, "cold", None)
    cand(*bufs.args())
    assert int(torch.count_nonzero(cand.sink)) == 0 and bool((bufs.c == 0).all())


def test_probe_called_before_prepare_says_so():
    with pytest.raises(TouchError, match="prepare"):
        TouchCandidate(CONFIGS[0])(None, None, None, None)


@pytest.mark.parametrize("cfg,needle", [
    (TouchConfig(3000, 4), "power of two"),
    (TouchConfig(512, 4), "at least 1024"),
    (TouchConfig(131072, 4), "at most 65536"),
    (TouchConfig(8192, 3), "warps=3"),
])
def test_invalid_configs_are_named(cfg, needle):
    assert needle in invalid(cfg)
    with pytest.raises(TouchError, match="touch config"):
        check(cfg)


def test_shipped_configs_are_valid_and_names_round_trip():
    assert all(invalid(c) is None for c in CONFIGS)
    assert [parse(c.name) for c in CONFIGS] == list(CONFIGS)
    for bad in ("touch_8192_w8", "touchb8192w8", "touch_bx_w8", "touch_b8192_w3"):
        with pytest.raises(TouchError):
            parse(bad)


# -- the bound ----------------------------------------------------------------------------------------

H100 = {"cc": "9.0", "info": "sms=132;max_mhz=1980;settle_mhz=1755"}


def _rows(mnk, protocol, vendor: dict, touch: dict, **kw):
    out = []
    for name, t in vendor.items():
        ok = not name.startswith("bad")
        out.append({"mnk": mnk, "dtype": "fp16", "protocol": protocol, "candidate": name, "time_ms": str(t),
                    "verified": "true" if ok else "false", **H100, **kw})
    for name, t in touch.items():
        out.append({"mnk": mnk, "dtype": "fp16", "protocol": protocol, "candidate": name, "time_ms": str(t),
                    "verified": "false", "reason": PROBE_REASON, **H100, **kw})
    return out


def test_mma_peak_is_the_datasheet_rate_at_its_clock():
    assert mma_peak_flops("9.0", 132, 1830) == pytest.approx(989.4e12, rel=1e-3)
    assert mma_peak_flops("8.0", 108, 1410) == pytest.approx(311.9e12, rel=1e-3)
    assert mma_peak_flops("7.5", 40, 1590) is None
    assert parse_info("sms=132;max_mhz=1980;x") == {"sms": "132", "max_mhz": "1980"}


def test_bound_takes_the_fastest_verified_vendor_and_the_fastest_probe():
    rows = _rows("64_4096_4096", "cold", {"cublas_tn": 0.030, "torch": 0.025, "bad_path": 0.001},
                 {"touch_b2048_w4": 0.024, "touch_b8192_w8": 0.0215})
    (b,) = bounds(rows)
    assert (b.vendor, b.touch) == ("torch", "touch_b8192_w8")
    assert b.headroom == pytest.approx(0.025 / 0.0215)
    assert b.limit == "touch"
    assert b.touch_gbs == pytest.approx(2 * (64 * 4096 * 2 + 4096 * 4096) / 0.0215e-3 / 1e9)


def test_vendor_faster_than_the_probe_means_no_room_shown():
    (b,) = bounds(_rows("64_64_64", "graph", {"cublas_tn": 0.003}, {"touch_b2048_w4": 0.004}))
    assert b.headroom == 1.0 and b.limit == "vendor"


def test_compute_bound_shapes_rest_on_the_tensor_core_peak():
    mnk = "16384_16384_16384"
    (b,) = bounds(_rows(mnk, "graph", {"cublaslt_heuristic_tn": 11.0}, {"touch_b32768_w8": 0.4}))
    t_mma = 2 * 16384 ** 3 / (132 * 4096 * 1980e6) * 1e3
    assert b.t_mma_ms == pytest.approx(t_mma) and b.limit == "mma"
    assert b.headroom == pytest.approx(11.0 / t_mma)


def test_unknown_architecture_leaves_the_probe_alone():
    rows = _rows("8192_8192_8192", "graph", {"torch": 2.0}, {"touch_b32768_w8": 0.1}, cc="7.5")
    (b,) = bounds(rows)
    assert math.isnan(b.t_mma_ms) and b.headroom == pytest.approx(20.0)


def test_groups_without_a_vendor_or_a_probe_row_are_left_out():
    rows = _rows("64_64_64", "cold", {"bad_path": 0.01}, {"touch_b2048_w4": 0.004})
    rows += _rows("128_128_128", "cold", {"torch": 0.01}, {})
    rows += _rows("256_256_256", "cold", {"torch": 0.01}, {"touch_b2048_w4": "inf"})
    assert bounds(rows) == []


def test_class_table_says_when_even_the_bound_misses_the_bar():
    bs = [Bound("64_4096_4096", 64, 4096, 4096, "cold", 0.025, "torch", 0.0235, "t", math.nan),
          Bound("128_1024_512", 128, 1024, 512, "cold", 0.010, "torch", 0.008, "t", math.nan),
          Bound("4096_4096_4096", 4096, 4096, 4096, "cold", 0.2, "torch", 0.05, "t", 0.13)]
    hs = {(h.cls, h.protocol): h for h in by_class(bs, CLASSES, {("min(M,N) <= 256", "cold"): 1.10,
                                                                  ("all", "cold"): 1.10})}
    small = hs[("min(M,N) <= 256", "cold")]
    assert small.n == 2 and small.geomean == pytest.approx(geomean([0.025 / 0.0235, 1.25]))
    assert small.reachable is True  # geomean 1.153
    assert hs[("all dims >= 4096", "cold")].reachable is None and hs[("all dims >= 4096", "cold")].n == 1
    assert hs[("all", "cold")].at_floor == 0
    tight = by_class(bs[:1], CLASSES, {("all", "cold"): 1.10})
    assert [h.reachable for h in tight if h.cls == "all"] == [False]


# -- CLI -----------------------------------------------------------------------------------------------

def test_table_of_a_finished_run(tmp_path, capsys):
    from gemmrl.results import ResultsWriter

    w = ResultsWriter(tmp_path / "h.csv")
    rows = _rows("64_4096_4096", "cold", {"torch": 0.025}, {"touch_b8192_w8": 0.02})
    w.write_batch([{**r, "acc": "fp32", "rep": 0} for r in rows])
    assert main(["headroom", "--table", str(tmp_path / "h.csv")]) == 0
    out = capsys.readouterr().out
    assert "| min(M,N) <= 256 | cold | 1 | 1.250 |" in out


@pytest.mark.parametrize("argv,needle", [
    (["headroom", "--mnk", "64_64_64", "--protocol", "offline"], "device time"),
    (["headroom", "--mnk", "64_64_64", "--touch", "touch_b100_w4"], "--touch"),
    (["headroom", "--mnk", "64_64_64", "--vendor", ","], "names no path"),
    (["headroom", "--mnk", "64_64_64", "--kernel-dir", "x"], "gemmrl bench --kernel-dir"),
    (["headroom", "--table", "/nonexistent/h.csv"], "no such file"),
])
def test_headroom_cli_errors(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_table_of_rows_without_a_probe_is_refused(tmp_path, capsys):
    from gemmrl.results import ResultsWriter

    w = ResultsWriter(tmp_path / "v.csv")
    w.write_batch([{**r, "acc": "fp32", "rep": 0} for r in _rows("64_64_64", "cold", {"torch": 0.01}, {})])
    assert main(["headroom", "--table", str(tmp_path / "v.csv")]) == 2
    assert "probe row" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", ["64_4096_4096", "129_257_4099", "2048_2048_2048"])
def test_measured_headroom_on_the_gpu(mnk):
    import torch

    from gemmrl.measure.headroom import measure_shape
    from gemmrl.problem import parse_mnk
    from gemmrl.results import collect_meta
    from gemmrl.timing import TimingConfig

    torch.set_grad_enabled(False)
    cfg = TimingConfig(settle_ms=20.0, settle_max_ms=50.0, graph_min_work_ms=1.0, graph_min_timed_ms=20.0,
                       graph_replays=5, cold_calls=10)
    got = measure_shape(parse_mnk(mnk), ("graph", "cold"), ("cublaslt_heuristic_tn", "torch"), CONFIGS[:2], cfg,
                        collect_meta().row())
    for proto, rows in got.items():
        names = {r["candidate"] for r in rows}
        assert {"cublaslt_heuristic_tn", "torch", CONFIGS[0].name, CONFIGS[1].name} <= names
        assert all(r.get("verified") is True for r in rows if not r["candidate"].startswith("touch_")), rows
        (b,) = bounds([{k: str(v) for k, v in r.items()} for r in rows])
        assert b.headroom >= 1.0
        assert b.t_touch_ms < 1.5 * b.t_vendor_ms  # the probe does less than any GEMM: never much slower
