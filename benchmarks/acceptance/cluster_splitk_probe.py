"""Where the cluster split-K kernel's time goes: the same shapes at every split S (1..16), graph protocol, beside
torch.matmul and the speed-of-light probe, with the device's cluster occupancy per S.

    PYTHONPATH=src GEMMRL_OUT=$OUT python3 benchmarks/acceptance/cluster_splitk_probe.py [--shapes 512_256_2048,...]

Builds kernels/csrc/cluster_splitk.cu through kernels/cuda_source.py (the device's arch, cached), forces the split
through ``cluster_splitk_force_split`` and checks each output against torch.matmul (relative Frobenius error).
Writes ``cluster_splitk_probe.csv`` (the results schema: candidates ``cuda:cluster_splitk_S<split>``, ``torch`` and the
probe; ``info`` holds the relative error and the clusters that fit at once) under $GEMMRL_OUT.
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gemmrl" / "kernels" / "csrc" / "cluster_splitk.cu"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="512_256_2048,256_256_1024,1024_256_4096,64_512_2048,2048_2048_1024")
    args = ap.parse_args()
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.measure.headroom import CHECK_RTOL, PROBE_REASON
    from gemmrl.kernels import cuda_source as cs
    from gemmrl.kernels.touch import CONFIGS, TouchCandidate
    from gemmrl.problem import parse_mnk
    from gemmrl.results import ResultsWriter, collect_meta, now
    from gemmrl.timing import TimingConfig, below_floor, floor_ms, l2_bytes, time_graph

    out = Path(os.environ.get("GEMMRL_OUT", "."))
    built = cs.build(cs.CudaSource(SRC.read_text(), entry="gemmrl_gemm", shapes=cs.ShapeRange.parse("K%8")))
    if not built.ok:
        raise SystemExit(f"cluster_splitk.cu did not build: {built.error}")
    lib = cs.load_library(built.so)
    lib.gemmrl_gemm.restype = ctypes.c_int
    lib.gemmrl_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                              ctypes.c_void_p]
    torch.cuda.init()
    occ = {s: lib.cluster_splitk_max_active_clusters(s) for s in (1, 2, 4, 8, 16)}
    print("max active clusters per split:", occ, flush=True)
    meta = collect_meta().row()
    writer = ResultsWriter(out / "cluster_splitk_probe.csv")
    cfg = TimingConfig(settle_ms=50.0, settle_max_ms=200.0, graph_min_work_ms=2.0, graph_min_timed_ms=100.0,
                       graph_replays=10)
    for mnk in args.shapes.split(","):
        p = parse_mnk(mnk)
        bufs = make_buffers(p, "cuda")
        a, b, bt, c = bufs.args()
        ref = (a.float() @ b.float())
        fns, info = {}, {}

        def add(name, fn, **extra):  # one checked call, then the callable is timed with the others
            c.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = float(torch.linalg.vector_norm(c.float() - ref) / torch.linalg.vector_norm(ref))
            fns[name], info[name] = fn, {"rel_err": f"{err:.3g}", **extra}

        for s in (1, 2, 4, 8, 16):
            if p.K // s < 64:
                continue

            def call(s=s):
                lib.cluster_splitk_force_split(s)
                st = lib.gemmrl_gemm(a.data_ptr(), bt.data_ptr(), c.data_ptr(), p.M, p.N, p.K, p.K, p.K, p.N, None, 0,
                                     torch.cuda.current_stream().cuda_stream)
                if st:
                    raise RuntimeError(f"gemmrl_gemm returned {st}")

            add(f"cuda:cluster_splitk_S{s}", call, max_active_clusters=occ[s])
        add("torch", lambda: torch.matmul(a, b, out=c))
        probe = TouchCandidate(CONFIGS[0])
        probe.prepare(p, bufs, "graph", None)
        fns[probe.name] = lambda: probe(a, b, bt, c)
        times = time_graph(fns, p, cfg, c=c)
        floor = floor_ms(p, meta["gpu"], "graph", l2_bytes())
        rows = []
        for name, t in times.items():
            checked = info.get(name)
            ok = checked is not None and float(checked["rel_err"]) <= CHECK_RTOL
            rows.append({**meta, "mnk": mnk, "M": p.M, "N": p.N, "K": p.K, "dtype": p.dtype, "acc": p.acc,
                         "layout": "nn" if name == "torch" else "tn", "candidate": name, "protocol": "graph",
                         "time_ms": t.time_ms, "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                         "verified": ok, "reason": t.reason or ("" if ok else PROBE_REASON if checked is None
                                                                 else f"relative error {checked['rel_err']}"),
                         "floor_ms": floor, "floor_ok": not below_floor(t.time_ms, floor), "rep": 0,
                         "info": ";".join(f"{k}={v}" for k, v in (checked or {}).items()), "timestamp": now()})
            print(f"{mnk:16} {name:24} {t.time_ms * 1e3:8.2f} us  {rows[-1]['info']}", flush=True)
        writer.write_batch(rows)
        del bufs, ref
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
