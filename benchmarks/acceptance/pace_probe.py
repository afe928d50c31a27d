"""How fast one CTA streams a GEMM's K slices from L2 into a shared-memory ring, by load method: the tiny family's
per-step floor (NOTES the tiny-family run section 5: ~8 KB per 0.2 us step, ~35 GB/s a CTA, whatever the warp count).

Probe kernels (``benchmarks/acceptance/pace_probe.cu``, built through ``cuda_source.build``, loaded with ctypes): each CTA reads
ROWS rows of 128 bytes a step (one 64-deep K step of a BM + BN tile) from a warm 16 MiB buffer through a STAGES-deep
ring, with a consumer that costs nothing. Methods: 0 cp.async 16 B a thread (the family's Loader), 1 a 1-D bulk copy
(TMA) a row, 2 two 2-D TMA boxes a step, 3 and 4 two 3-D TMA boxes of 4 K chunks each a step (4 x the bytes a box;
3 in the layout a wgmma mainloop needs, over a view whose strides do not increase, 4 over a plain 3-D view). Launches: 8 or 16 CTAs spread over the device, 16 in one cluster (one GPC),
128 spread (every SM pulling). Timed in the graph protocol at 64 and 8 steps; the per-step time is the difference
over 56 steps (the launch, the ring's fill and the drain cancel). Rows are in the results schema (candidate
``pace-probe:m<method>_r<rows>_t<threads>_st<stages>_g<grid>_c<cluster>_k<steps>``); the table is printed last.

    PYTHONPATH=src python3 benchmarks/acceptance/pace_probe.py --out pace.csv   # on the GPU
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SRC = Path(__file__).with_name("pace_probe.cu")
ROWS_TOTAL = 3072            # the buffer: [3072, 4096] fp16, 24 MiB (L2-resident once warm; whole blocks of 48, 96,
#                              128 and 256 rows)
LAUNCHES = ((8, 1), (16, 1), (16, 16), (128, 1))  # (CTAs, cluster size along x)
STEPS = (8, 64)
METHODS = {0: "cp.async", 1: "bulk-1d-rows", 2: "tma-2d", 3: "tma-3d-kc4", 4: "tma-3d-kc4-rows"}
TMA = (2, 3, 4)              # methods that load through a tensor map (pace_make_map)


def build() -> ctypes.CDLL:
    from gemmrl.kernels import cuda_source as cs

    built = cs.build(cs.CudaSource(SRC.read_text(), entry="pace_run", name="pace-probe"))
    if not built.ok:
        raise SystemExit(f"pace_probe.cu did not build: {built.error}")
    lib = cs.load_library(built.so)
    vp, ci = ctypes.c_void_p, ctypes.c_int
    lib.pace_configs.argtypes = [vp]
    lib.pace_run.argtypes = [ci, ci, ci, ci, ci, ci, ci, vp, ci, vp, vp, vp]
    lib.pace_make_map.argtypes = [vp, vp, ci, ci, ci]
    lib.pace_kc.argtypes = [ci]
    return lib


def per_step(t_short_ms: float, t_long_ms: float) -> float:
    """us a step from two timings of the same launch at STEPS[0] and STEPS[1] steps."""
    return (t_long_ms - t_short_ms) * 1e3 / (STEPS[1] - STEPS[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--methods", default=",".join(map(str, METHODS)),
                    help="the load methods to time, comma-separated (one process per method keeps a fault in one "
                         "from losing the others)")
    args = ap.parse_args(argv)
    methods = {int(m) for m in args.methods.split(",")}
    if not methods <= set(METHODS):
        ap.error(f"--methods: known methods are {', '.join(f'{k} ({v})' for k, v in METHODS.items())}")
    import torch

    from gemmrl.problem import parse_mnk
    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.timing import TimingConfig, time_graph

    torch.cuda.init()
    lib = build()
    buf = torch.zeros(ROWS_TOTAL * 4096, dtype=torch.float16, device="cuda")
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    raw = (ctypes.c_int * 256)()
    n = lib.pace_configs(ctypes.addressof(raw))
    configs = [c for c in (tuple(raw[4 * i:4 * i + 4]) for i in range(n)) if c[0] in methods]
    maps = {}
    for m, rows, _, _ in configs:
        if m in TMA and (m, rows) not in maps:
            mem = ctypes.create_string_buffer(256)
            addr = (ctypes.addressof(mem) + 63) & ~63
            rc = lib.pace_make_map(addr, buf.data_ptr(), ROWS_TOTAL, rows // 2, m)
            if rc:
                raise SystemExit(f"cuTensorMapEncodeTiled failed ({rc}) for method {m} ({METHODS[m]}), box rows "
                                 f"{rows // 2}")
            maps[(m, rows)] = (mem, addr)

    def s():
        return torch.cuda.current_stream().cuda_stream

    fns, keys = {}, {}
    for m, rows, threads, stages in configs:
        for grid, cluster in LAUNCHES:
            for k in STEPS:
                name = f"m{m}_r{rows}_t{threads}_st{stages}_g{grid}_c{cluster}_k{k}"
                mp = maps[(m, rows)][1] if m in TMA else None

                def fn(m=m, rows=rows, threads=threads, stages=stages, grid=grid, cluster=cluster, k=k, mp=mp):
                    rc = lib.pace_run(m, rows, threads, stages, grid, cluster, k, buf.data_ptr(), ROWS_TOTAL,
                                      out.data_ptr(), mp, s())
                    if rc:
                        raise RuntimeError(f"pace_run failed: CUDA error {rc}")

                fns[name] = fn
                keys[name] = (m, rows, threads, stages, grid, cluster, k)
    for name, fn in fns.items():  # warm the buffer into L2; a launch that faults is named (the context is lost then)
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported with the config that raised it
            raise SystemExit(f"{name}: {e}".splitlines()[0]) from e
    cfg = replace(TimingConfig(), graph_min_work_ms=2.0, graph_min_timed_ms=30.0, settle_ms=30.0, settle_max_ms=100.0)
    res = time_graph(fns, parse_mnk("64_64_4096"), cfg)
    meta = collect_meta().row()
    rows_out, times = [], {}
    for name, t in res.items():
        times[keys[name]] = t.time_ms
        rows_out.append({"mnk": "", "dtype": "fp16", "acc": "", "candidate": f"pace-probe:{name}", "protocol": "graph",
                         "time_ms": t.time_ms, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "reason": t.reason,
                         **meta, "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(),
                         "info": f"method={METHODS[keys[name][0]]};probe"})
    if args.out:
        ResultsWriter(args.out).write_batch(rows_out)
    print(f"{'method':13} {'rows':>4} {'thr':>4} {'st':>3} {'CTAs':>5} {'clus':>4} {'us k8':>7} {'us k64':>7} "
          f"{'us/step':>8} {'GB/s/CTA':>9} {'B/clk/CTA':>9}")
    mhz = float(sm_clock_mhz() or 1980.0)
    for m, rows, threads, stages in configs:
        for grid, cluster in LAUNCHES:
            a = times.get((m, rows, threads, stages, grid, cluster, STEPS[0]), float("nan"))
            b = times.get((m, rows, threads, stages, grid, cluster, STEPS[1]), float("nan"))
            us = per_step(a, b)
            gbs = rows * 128 * lib.pace_kc(m) / (us * 1e3) if us > 0 else float("nan")  # bytes a step
            print(f"{METHODS[m]:13} {rows:4d} {threads:4d} {stages:3d} {grid:5d} {cluster:4d} {a * 1e3:7.2f} "
                  f"{b * 1e3:7.2f} {us:8.3f} {gbs:9.1f} {gbs * 1e3 / mhz:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
