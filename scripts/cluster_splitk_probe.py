"""Where the cluster split-K kernel's time goes: the same shapes at every split S (1..16), graph protocol, beside
torch.matmul and the speed-of-light probe, with the device's cluster occupancy per S.

    PYTHONPATH=src GEMMRL_OUT=$OUT python3 scripts/cluster_splitk_probe.py [--shapes 512_256_2048,...]

Builds kernels/csrc/cluster_splitk.cu with nvcc (sm_90a) into a temp dir, loads it with ctypes, forces the split
through ``cluster_splitk_force_split`` and checks each output against torch.matmul (relative Frobenius error).
Writes ``cluster_splitk_probe.csv`` under $GEMMRL_OUT.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gemmrl" / "kernels" / "csrc" / "cluster_splitk.cu"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="512_256_2048,256_256_1024,1024_256_4096,64_512_2048,2048_2048_1024")
    args = ap.parse_args()
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels.touch import CONFIGS, TouchCandidate
    from gemmrl.problem import parse_mnk
    from gemmrl.results import collect_meta, now
    from gemmrl.timing import TimingConfig, time_graph

    out = Path(os.environ.get("GEMMRL_OUT", "."))
    so = Path(tempfile.mkdtemp()) / "cluster_splitk.so"
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-DNDEBUG", "-Xcompiler=-fPIC", "-shared",
                    "-gencode", "arch=compute_90a,code=sm_90a", str(SRC), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.gemmrl_gemm.restype = ctypes.c_int
    lib.gemmrl_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                              ctypes.c_void_p]
    torch.cuda.init()
    occ = {s: lib.cluster_splitk_max_active_clusters(s) for s in (1, 2, 4, 8, 16)}
    print("max active clusters per split:", occ, flush=True)
    meta = {**collect_meta().row(), "timestamp": now()}
    cfg = TimingConfig(settle_ms=50.0, settle_max_ms=200.0, graph_min_work_ms=2.0, graph_min_timed_ms=100.0,
                       graph_replays=10)
    rows = []
    for mnk in args.shapes.split(","):
        p = parse_mnk(mnk)
        bufs = make_buffers(p, "cuda")
        a, b, bt, c = bufs.args()
        ref = (a.float() @ b.float())
        fns, errs = {}, {}
        for s in (1, 2, 4, 8, 16):
            if p.K // s < 64:
                continue

            def call(s=s):
                lib.cluster_splitk_force_split(s)
                st = lib.gemmrl_gemm(a.data_ptr(), bt.data_ptr(), c.data_ptr(), p.M, p.N, p.K, p.K, p.K, p.N, None, 0,
                                     torch.cuda.current_stream().cuda_stream)
                if st:
                    raise RuntimeError(f"gemmrl_gemm returned {st}")

            c.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            errs[f"S{s}"] = float(torch.linalg.vector_norm(c.float() - ref) / torch.linalg.vector_norm(ref))
            fns[f"S{s}"] = call
        fns["torch"] = lambda: torch.matmul(a, b, out=c)
        probe = TouchCandidate(CONFIGS[0])
        probe.prepare(p, bufs, "graph", None)
        fns["probe"] = lambda: probe(a, b, bt, c)
        times = time_graph(fns, p, cfg, c=c)
        for name, t in times.items():
            rows.append({"mnk": mnk, "candidate": name, "time_us": round(t.time_ms * 1e3, 3),
                         "rel_err": errs.get(name, ""), "max_active_clusters": occ.get(int(name[1:]), "")
                         if name.startswith("S") else "", "reason": t.reason, **meta})
            print(f"{mnk:16} {name:6} {t.time_ms * 1e3:8.2f} us  err {errs.get(name, '')}", flush=True)
        del bufs, ref
    with open(out / "cluster_splitk_probe.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
