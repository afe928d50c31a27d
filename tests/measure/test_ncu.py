"""gemmrl.measure.ncu: which shapes are profiled, how ncu's raw CSV is read, and the reason rules (CPU tier)."""

import pytest

from gemmrl.measure import ncu as N


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
"ID","Process ID","Process Name","Host Name","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","Context","Stream","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","launch__grid_size","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","nsecond","byte","byte","","%"
"0","123","python3","h","123  ""<default domain>:gemmrl:triton:none:none:none:none:none:none"" ","splitk_kernel","1","7","12,000","33,554,432","8,192","128","n/a"
"1","123","python3","h","123  ""<default domain>:gemmrl:triton:none:none:none:none:none:none"" ","reduce_kernel","1","7","2,000","16,384","8,192","4","n/a"
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
            N.TENSOR_METRIC: 5.0, "launch__waves_per_multiprocessor": 1.0, "kernels": 1}
    base.update(kw)
    return base


@pytest.mark.parametrize("ours,expect", [
    (_m(**{"dram__throughput.avg.pct_of_peak_sustained_elapsed": 40.0}), "memory-bound: DRAM at 40%"),
    (_m(**{"dram__bytes_read.sum": 6.6e7}), "moves 2.00x the vendor's DRAM bytes"),
    (_m(launch__grid_size=64.0, launch__waves_per_multiprocessor=0.48), "grid of 64 CTAs on 132 SMs, 0.48 waves"),
    (_m(launch__waves_per_multiprocessor=1.25), "wave tail: 1.25 waves, the last 25% full (vendor 1.00 waves)"),
    (_m(kernels=2), "2 kernels against 1"),
    (_m(**{"sm__warps_active.avg.pct_of_peak_sustained_active": 10.0}), "achieved occupancy 10% vs 40%"),
    (_m(**{"lts__t_sector_hit_rate.pct": 20.0}), "L2 hit rate 20% vs 50%"),
    (_m(), "no single counter explains it"),
    (_m(**{"dram__throughput.avg.pct_of_peak_sustained_elapsed": 77.0}), "no single counter explains it"),  # 96%
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


def test_reason_tolerates_missing_and_zero_metrics():
    ours = _m(**{"dram__bytes_read.sum": 1e6, "dram__bytes_write.sum": 0.0, "launch__waves_per_multiprocessor": 1.3})
    vend = _m(**{"dram__bytes_read.sum": 0.0, "dram__bytes_write.sum": 0.0})
    del vend["launch__waves_per_multiprocessor"]      # absent: read as full waves, not as a cause by itself
    text = N.reason(ours, vend)
    assert "DRAM bytes" not in text and "wave tail: 1.30 waves" in text
    assert N.reason(_m(launch__waves_per_multiprocessor=2.0), _m()).endswith("no single counter explains it "
                                                                           "(same DRAM, SM and occupancy levels)")


def test_metrics_are_the_hopper_names():
    assert len(set(N.METRICS)) == len(N.METRICS) and N.METRICS[0] == "gpu__time_duration.sum"
    assert N.TENSOR_METRIC in N.METRICS and "gmma_cycles" not in N.TENSOR_METRIC  # absent on gh100
    for m in ("launch__waves_per_multiprocessor", "launch__shared_mem_per_block_dynamic",
              "sm__warps_active.avg.pct_of_peak_sustained_active"):
        assert m in N.METRICS


LOSS = N.Loss("256_512_1024", "cold", "tiled(BM=64)", "tn", "cublas_tn", 2.0, 1.0, 0.5)


class _Proc:
    def __init__(self, stdout, rc=0, stderr=""):
        self.stdout, self.returncode, self.stderr = stdout, rc, stderr


@pytest.mark.parametrize("protocol,cache", [("cold", None), ("graph", "none")])
def test_profile_runs_one_ncu_with_clocks_left_alone(monkeypatch, protocol, cache):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return _Proc(NCU_OUT)

    monkeypatch.setattr(N.subprocess, "run", fake_run)
    loss = N.Loss(**{**LOSS.__dict__, "protocol": protocol})
    rec = N.profile(loss, "triton", "/opt/ncu")
    assert rec["kernels"] == 2 and rec["gpu__time_duration.sum"] == 14000
    (cmd,) = calls
    assert cmd[0] == "/opt/ncu" and cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(N.METRICS)
    assert (cmd[cmd.index("--cache-control") + 1] if "--cache-control" in cmd else None) == cache
    child = cmd[cmd.index("gemmrl.measure.ncu") + 1:]
    assert child[0] == "run" and child[child.index("--which") + 1] == "triton"
    assert child[child.index("--protocol") + 1] == protocol and child[child.index("--mnk") + 1] == "256_512_1024"


def test_profile_without_rows_says_what_ncu_said(monkeypatch):
    monkeypatch.setattr(N.subprocess, "run", lambda cmd, **kw: _Proc("", 1, "==ERROR== ERR_NVGPUCTRPERM"))
    with pytest.raises(N.NcuError, match="exit 1.*ERR_NVGPUCTRPERM"):
        N.profile(LOSS, "vendor", "ncu")


def test_losses_goes_on_after_a_failed_shape(tmp_path, monkeypatch, capsys):
    rows = [_row(m, "vendor_best", "cold", 1.0, members="cublas_tn") for m in ("1_2_3", "4_5_6")]
    rows += [_row("1_2_3", "triton-sel:cold", "cold", 2.0), _row("4_5_6", "triton-sel:cold", "cold", 1.25)]
    monkeypatch.setattr("gemmrl.results.read_rows", lambda paths: rows)
    monkeypatch.setattr(N.shutil, "which", lambda name: "/opt/ncu")

    def fake_profile(loss, which, ncu):
        if loss.mnk == "1_2_3":
            raise N.NcuError("ncu gave no kernel rows")
        return _m(**{"gpu__time_duration.sum": 12500.0 if which == "triton" else 10000.0})

    monkeypatch.setattr(N, "profile", fake_profile)
    out = N.losses(["x.csv"], "cold", 10, tmp_path / "l.csv")
    import csv
    got = list(csv.DictReader(open(out)))
    assert [r["mnk"] for r in got] == ["1_2_3", "4_5_6"]
    assert "no kernel rows" in got[0]["error"] and not got[0]["reason"]
    assert got[1]["reason"].startswith("12.5 vs 10.0 us") and not got[1]["error"]
    md = (tmp_path / "l.md").read_text()
    assert "profiling failed: NcuError" in md and "| 4_5_6 | 0.800 |" in md
    assert "[2/2] 4_5_6" in capsys.readouterr().out
