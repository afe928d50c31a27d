"""Where gemmrl.mm's extra host time in ``offline`` comes from (the serving bar: gemmrl measured 10-15 us slower per call
than the same cuBLASLt plan called by the bench on the H100).

Per shape (served from LIBRARY, a library JSON), interleaved in random order, each call bracketed by
``synchronize`` as the offline protocol does (C NaN-filled, synchronize, t0, call, synchronize, t1), the median
per-call time of:
  sync_only     synchronize alone (the floor of the loop)
  vendor        the bench's vendor candidate for the served entry (same plan), called as the bench calls it
  served        the dispatcher's served launcher (after the lookup)
  mm_out        gemmrl.mm(a, b, out=c)            (the compiled hot path where one builds: GEMMRL_FASTPATH)
  mm_out_py     the Python hot path of gemmrl.mm
  candidate     the bench's ``gemmrl`` candidate (GemmrlCandidate.__call__)
and, without synchronize (batches of 2000 back-to-back calls), the host cost of the lookup's pieces.
Writes offline_host_probe.csv under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out PYTHONPATH=src python benchmarks/acceptance/offline_host_probe.py LIBRARY.json 8_4096_4096:nn ...
"""

from __future__ import annotations

import csv
import os
import random
import statistics
import sys
import time

import torch

from gemmrl.serve import dispatch
from gemmrl.candidate import make_buffers
from gemmrl.serve.bench_candidate import GemmrlCandidate
from gemmrl.kernels.vendor import CtypesCandidate, TorchCandidate
from gemmrl.problem import parse_mnk
from gemmrl.results import collect_meta, now


def synced_us(fns: dict, c, iters: int = 600) -> dict:
    got = {k: [] for k in fns}
    sync, clock = torch.cuda.synchronize, time.perf_counter
    names = list(fns)
    for _ in range(iters):
        random.shuffle(names)
        for k in names:
            c.fill_(float("nan"))
            sync()
            t0 = clock()
            fns[k]()
            sync()
            got[k].append((clock() - t0) * 1e6)
    return {k: statistics.median(v) for k, v in got.items()}


def batch_us(fns: dict, n: int = 2000, rounds: int = 7) -> dict:
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                f()
            got[k].append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    return {k: min(v) for k, v in got.items()}


def vendor_for(desc: str, problem, bufs):
    """The bench's vendor candidate named in a served description ('vendor:cublaslt_heuristic_nn (...)')."""
    if desc.startswith("vendor: "):  # the vendor fallback's raced plan: the bench's candidate of its kind
        kind = desc.split(" ", 2)[1]
        impl = {"torch.matmul": "torch", "cublasGemmEx": "cublas_" + problem.layout}.get(
            kind, "cublaslt_heuristic_" + problem.layout)
    else:
        impl = desc.split(":", 1)[1].split(" ", 1)[0] if desc.startswith("vendor:") else \
            "cublaslt_heuristic_" + problem.layout
    if impl == "torch":
        c = TorchCandidate()
        c.prepare(problem.with_(layout="nn"), bufs, "offline", None)
        return c
    mode = {"cublas": "cublas", "cublaslt_heuristic": "heuristic", "cublaslt_autotuned": "heuristic"}[impl[:-3]]
    c = CtypesCandidate(impl, problem.layout, "fp32", mode)
    c.prepare(problem, bufs, "offline", None)
    return c


def setup(mnk: str, layout: str):
    """Buffers for one shape, what the dispatcher serves there, the bench's vendor candidate for the same entry
    and the bench's ``gemmrl`` candidate: (problem, bufs, w, served, vendor, candidate), w the [K, N] operand."""
    problem = parse_mnk(mnk).with_(layout=layout)
    bufs = make_buffers(problem, "cuda", seed=5)
    a, b, bt, c = bufs.args()
    w = b if layout == "nn" else bt.t()
    served = dispatch._mm_served(a, w)
    vend = vendor_for(served.eager_desc, problem, bufs)
    cand = GemmrlCandidate()
    cand.prepare(problem, bufs, "offline", None)
    return problem, bufs, w, served, vend, cand


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def stages(spec: str) -> list[dict]:
    """The bench's offline loop (timing.time_host, mean and median) over vendor / served / mm / candidate, then
    again after the correctness battery on the candidate, then again after a graph-protocol timing of all four:
    does anything the bench does before ``offline`` make gemmrl.mm slower?"""
    from gemmrl.timing import TimingConfig, time_graph, time_host
    from gemmrl.verify import verify

    mnk, layout = spec.split(":")
    problem, bufs, w, served, vend, cand = setup(mnk, layout)
    a, b, bt, c = bufs.args()
    fns = {"vendor": lambda: vend(a, b, bt, c), "served": lambda: served.eager(a, w, c),
           "mm_out": lambda: dispatch.mm(a, w, out=c), "candidate": lambda: cand(a, b, bt, c)}
    cfg = TimingConfig(warmup_s=0.25, benchmark_s=1.0)
    rows = []
    for stage in ("fresh", "after_battery", "after_graph"):
        if stage == "after_battery":
            v = verify(cand, problem, "cuda")
            print(f"  battery: {'passed' if v.passed else v.reason}", flush=True)
        if stage == "after_graph":
            time_graph(fns, problem, cfg)
        t = time_host(fns, bufs, cfg, "offline")
        print(f"  {stage:14} " + "  ".join(f"{k} mean {v.time_ms * 1e3:.2f} p20 {v.p20_ms * 1e3:.2f}" for k, v in t.items()),
              flush=True)
        rows.append({"mnk": mnk, "layout": layout, "stage": stage,
                     **{f"{k}_mean_us": round(v.time_ms * 1e3, 3) for k, v in t.items()},
                     **{f"{k}_p20_us": round(v.p20_ms * 1e3, 3) for k, v in t.items()}})
    return rows


def crowd(spec: str) -> list[dict]:
    """The same offline loop with 2 candidates (vendor, gemmrl) and with 8 (6 more vendor paths, as the bench
    has): does interleaving with many candidates that share the vendor's code path warm it for the vendor and
    not for gemmrl?"""
    from gemmrl.timing import TimingConfig, time_host

    mnk, layout = spec.split(":")
    problem, bufs, w, served, vend, cand = setup(mnk, layout)
    a, b, bt, c = bufs.args()
    two = {"vendor": lambda: vend(a, b, bt, c), "candidate": lambda: cand(a, b, bt, c)}
    more = dict(two)
    for lay in ("tn", "nn"):
        for mode in ("cublas", "heuristic"):
            x = CtypesCandidate(f"{mode}_{lay}", lay, "fp32", mode)
            x.prepare(problem.with_(layout=lay), bufs, "offline", None)
            more[f"{mode}_{lay}"] = (lambda f=x: f(a, b, bt, c))
    t_ = TorchCandidate()
    t_.prepare(problem.with_(layout="nn"), bufs, "offline", None)
    more["torch"] = lambda: t_(a, b, bt, c)
    more["torch2"] = lambda: t_(a, b, bt, c)
    # the crowd again, with gemmrl's call in 6 of the 8 slots (is the path that runs most often the one warmed?)
    heavy = {"vendor": two["vendor"], "candidate": two["candidate"], "torch": more["torch"],
             **{f"candidate{i}": (lambda: cand(a, b, bt, c)) for i in range(2, 7)}}
    # the crowd of 8 with gemmrl's compiled hot path called directly (no Python layer: mm, the bench candidate)
    hot = dispatch._hot
    direct = {**more, "candidate": lambda: hot(a, w, c)}
    # the crowd of 8 with the dispatcher's own launcher (its plan, through ctypes) in gemmrl's slot
    launcher = {**more, "candidate": lambda: served.eager(a, w, c)}
    cfg = TimingConfig(warmup_s=0.25, benchmark_s=1.0)
    rows = []
    loops = [("2 candidates", two), ("8 candidates", more), ("2 candidates again", two)]
    if os.environ.get("PROBE_CROWD") == "2":
        loops += [("8, gemmrl in 6 slots", heavy), ("8, hot path direct", direct), ("8, dispatcher launcher", launcher)]
    proto = os.environ.get("PROBE_PROTOCOL", "offline")  # server: the same loops with Poisson gaps (QPS 100)
    for label, fns in loops:
        t = time_host(fns, bufs, cfg, proto)
        gap = (t["candidate"].time_ms - t["vendor"].time_ms) * 1e3
        gap20 = (t["candidate"].p20_ms - t["vendor"].p20_ms) * 1e3
        print(f"  {label:18} vendor {t['vendor'].time_ms * 1e3:.2f}  gemmrl {t['candidate'].time_ms * 1e3:.2f}  "
              f"gap mean {gap:+.2f} us, p20 {gap20:+.2f} us", flush=True)
        rows.append({"mnk": mnk, "layout": layout, "protocol": proto, "loop": label, "vendor_mean_us": round(t["vendor"].time_ms * 1e3, 3),
                     "gemmrl_mean_us": round(t["candidate"].time_ms * 1e3, 3), "gap_mean_us": round(gap, 3),
                     "gap_p20_us": round(gap20, 3), "served": served.eager_desc[:80]})
    return rows


def main() -> None:
    lib_path, specs = sys.argv[1], sys.argv[2:] or ["8_4096_4096:nn", "32_4096_4096:nn", "16_4096_4096:nn"]
    meta = {**collect_meta().row(), "timestamp": now()}
    if os.environ.get("PROBE_CROWD"):  # 1: three loops; 2: three more (crowd variants)
        dispatch.use_library(lib_path)
        rows = [{**r, **meta} for s in specs for r in (print(s, flush=True), crowd(s))[1]]
        write_csv(os.path.join(os.environ.get("GEMMRL_OUT", "."), "offline_host_probe_crowd.csv"), rows)
        return
    if os.environ.get("PROBE_STAGES"):
        dispatch.use_library(lib_path)
        rows = [{**r, **meta} for s in specs for r in (print(s, flush=True), stages(s))[1]]
        write_csv(os.path.join(os.environ.get("GEMMRL_OUT", "."), "offline_host_probe_stages.csv"), rows)
        return
    dispatch.use_library(lib_path)
    rows = []
    for spec in specs:
        mnk, layout = spec.split(":")
        _, bufs, w, served, vend, cand = setup(mnk, layout)
        a, b, bt, c = bufs.args()
        cap = dispatch._capturing
        fns = {"sync_only": lambda: None,
               "vendor": lambda: vend(a, b, bt, c),
               "served": lambda: served.eager(a, w, c),
               "mm_out": lambda: dispatch.mm(a, w, out=c),
               "mm_out_py": lambda: dispatch._hot_py(a, w, c),
               "candidate": lambda: cand(a, b, bt, c)}
        for _ in range(50):
            for f in fns.values():
                f()
        t = synced_us(fns, c)
        key = (a.shape, w.shape, w.stride(), a.dtype, a.get_device())
        pieces = batch_us({"capturing": cap, "is_compiling": torch.compiler.is_compiling,
                           "grad_enabled": torch.is_grad_enabled, "fast_key": lambda: (a.shape, w.shape, w.stride(),
                                                                                      a.dtype, a.get_device()),
                           "fast_get": lambda: dispatch._FAST.get(key),
                           "vendor_nosync": lambda: vend(a, b, bt, c),
                           "served_nosync": lambda: served.eager(a, w, c),
                           "mm_out_nosync": lambda: dispatch.mm(a, w, out=c),
                           "mm_out_py_nosync": lambda: dispatch._hot_py(a, w, c),
                           "candidate_nosync": lambda: cand(a, b, bt, c)})
        row = {"mnk": mnk, "layout": layout, "served": served.eager_desc[:120], "hot_path": dispatch.hot_path(),
               **{f"{k}_us": round(v, 3) for k, v in t.items()}, **{f"{k}_us": round(v, 3) for k, v in pieces.items()},
               **meta}
        rows.append(row)
        print(f"{mnk} {layout} served {served.eager_desc[:60]}", flush=True)
        print("  synced: " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()), flush=True)
        print("  no sync: " + "  ".join(f"{k} {v:.3f}" for k, v in pieces.items()), flush=True)
    write_csv(os.path.join(os.environ.get("GEMMRL_OUT", "."), "offline_host_probe.csv"), rows)


if __name__ == "__main__":
    main()
