"""gemmrl.ncu: which shapes are profiled, how ncu's raw CSV is read, and the reason rules (CPU tier)."""

import pytest

from gemmrl import ncu as N


def _row(mnk, cand, proto, ms, verified="true", members="", algo="tiled(BM=64)"):
    return {"mnk": mnk, "candidate": cand, "protocol": proto, "time_ms": str(ms), "tflops": str(1 / ms),
            "verified": verified, "members": members, "algo": algo, "layout": "nn", "rep": "0"}


def test_worst_shapes_compares_the_config_selected_in_that_protocol():
    rows = [_row("a", "vendor_best", "cold", 1.0, members="cublas_tn"),
            _row("a", "triton-sel:cold", "cold", 2.0),          # 0.5: the worst
            _row("a", "triton-sel:graph", "cold", 0.5),         # selected in graph: not compared in cold
            _row("b", "vendor_best", "cold", 1.0, members="torch"),
            _row("b", "triton-sel:cold+graph", "cold", 1.25),   # 0.8
            _row("c", "vendor_best", "cold", 1.0, members="torch"),
            _row("c", "triton-sel:cold", "cold", 0.1, verified="false"),  # failed the battery: ignored
            _row("d", "vendor_best", "graph", 1.0, members="torch"),
            _row("d", "triton-sel:graph", "graph", 4.0)]
    got = N.worst_shapes(rows, "cold", n=5)
    assert [(x.mnk, round(x.speedup, 3), x.vendor) for x in got] == [("a", 0.5, "cublas_tn"), ("b", 0.8, "torch")]
    assert N.worst_shapes(rows, "cold", n=1)[0].mnk == "a"
    assert [x.mnk for x in N.worst_shapes(rows, "graph")] == ["d"]


NCU_OUT = '''==PROF== Connected to process 123 (/usr/bin/python3)
some program output, "with quotes"
==PROF== Profiling "splitk_kernel" - 0: 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","launch__grid_size","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","nsecond","byte","byte","","%"
"0","123","python3","h","splitk_kernel","1","7","12,000","33,554,432","8,192","128","n/a"
"1","123","python3","h","reduce_kernel","1","7","2,000","16,384","8,192","4","n/a"
==PROF== Disconnected from process 123
'''


def test_parse_raw_csv_skips_noise_and_units_and_combine_sums_kernels():
    rows = N.parse_raw_csv(NCU_OUT)
    assert [r["Kernel Name"] for r in rows] == ["splitk_kernel", "reduce_kernel"]
    rec = N.combine(rows)
    assert rec["gpu__time_duration.sum"] == 14000 and rec["dram__bytes_read.sum"] == 33554432 + 16384
    assert rec["launch__grid_size"] == 128 and rec["kernels"] == 2 and rec["name"] == "splitk_kernel"
    assert rec[N.TENSOR_METRIC] != rec[N.TENSOR_METRIC]  # n/a -> nan
    assert N.parse_raw_csv("==PROF== error: no kernels were profiled\n") == []


def _m(**kw):
    base = {"gpu__time_duration.sum": 10000.0, "dram__throughput.avg.pct_of_peak_sustained_elapsed": 80.0,
            "dram__bytes_read.sum": 3.3e7, "dram__bytes_write.sum": 1e4, "lts__t_sector_hit_rate.pct": 50.0,
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": 20.0,
            "sm__warps_active.avg.pct_of_peak_sustained_active": 40.0, "launch__grid_size": 512.0,
            N.TENSOR_METRIC: 5.0, "kernels": 1}
    base.update(kw)
    return base


@pytest.mark.parametrize("ours,expect", [
    (_m(**{"dram__throughput.avg.pct_of_peak_sustained_elapsed": 40.0}), "memory-bound: DRAM at 40%"),
    (_m(**{"dram__bytes_read.sum": 6.6e7}), "moves 2.00x the vendor's DRAM bytes"),
    (_m(launch__grid_size=64.0), "grid of 64 CTAs on 132 SMs"),
    (_m(kernels=2), "2 kernels against 1"),
    (_m(**{"sm__warps_active.avg.pct_of_peak_sustained_active": 10.0}), "achieved occupancy 10% vs 40%"),
    (_m(**{"lts__t_sector_hit_rate.pct": 20.0}), "L2 hit rate 20% vs 50%"),
    (_m(), "no single counter explains it"),
])
def test_reason_names_the_cause(ours, expect):
    text = N.reason(ours, _m())
    assert expect in text and text.startswith("10.0 vs 10.0 us")


def test_reason_compute_bound_tensor_pipe():
    v = _m(**{N.TENSOR_METRIC: 80.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 80.0,
              "dram__throughput.avg.pct_of_peak_sustained_elapsed": 20.0})
    o = _m(**{N.TENSOR_METRIC: 40.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 45.0,
              "dram__throughput.avg.pct_of_peak_sustained_elapsed": 20.0})
    text = N.reason(o, v)
    assert text.index("tensor pipe active 40% vs the vendor's 80%") < text.index("SM throughput 45%")


def test_cli_errors(tmp_path, capsys, monkeypatch):
    assert N.main(["losses", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    f = tmp_path / "r.csv"
    f.write_text("mnk\n")
    assert N.main(["losses", str(f), "--out", str(tmp_path / "o.txt")]) == 2
    assert "give a .csv path" in capsys.readouterr().err
    monkeypatch.setattr(N.shutil, "which", lambda name: None)
    assert N.main(["losses", str(f), "--out", str(tmp_path / "o.csv")]) == 2
    assert "ncu (Nsight Compute) is not on PATH" in capsys.readouterr().err
