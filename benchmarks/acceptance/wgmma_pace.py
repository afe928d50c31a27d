"""Where the wgmma family's time goes (kernels/csrc/wgmma_splitk.cu): the per-K-step pace and the fixed cost of a call,
under build variants that take one side of the main loop away.

Variants (``-DGEMMRL_PACE``; results are wrong on purpose in all but base, so nothing is checked there):
  base              the kernel as shipped
  no_mma            the consumers wait for each stage and free it without an MMA: the TMA feed's pace alone
  no_tma            the producer marks each stage full without loading it: the MMAs' pace alone, on stale shared memory
  launch_only       every CTA returns at once: the launch of that grid, shared memory and cluster shape alone
  prologue_only     returns after the mbarrier init, the tensor-map prefetch and the first __syncthreads
  no_gsplit_reduce  a global split writes its partials but skips the barrier and the reduction
  spin_nosleep      the global split's barrier polls without __nanosleep between polls (results correct)
Cases (M_N_K with WG, BN, cluster split S, stages, global split G) span 1 to 256 K steps per CTA, one CTA to 128, the
cluster and the global reductions. Each is timed in the graph protocol (calls captured back to back in one CUDA graph,
warm L2; short settings) and written in the results schema, candidate ``wgmma-pace:<variant>:<config>``; ``info``
holds the K steps per CTA and the time per step.

    PYTHONPATH=src python3 benchmarks/acceptance/wgmma_pace.py --out pace.csv            # on the GPU machine
    PYTHONPATH=src python3 benchmarks/acceptance/wgmma_pace.py --once 64_64_16384:1,64,1,8,1 --calls 3   # one case, eager (for ncu)

The wgmma-family run ran an earlier version (back-to-back events, no variants but the mbarrier wait and L2 promotion):
benchmarks/results/h100/h100_wgmma-pace-variants_back-to-back-events_5f752d6_2026-11-25.csv."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.kernels import cuda_source as cs  # noqa: E402
from gemmrl.kernels.wgmma_gemm import SOURCE, WgmmaConfig, typed  # noqa: E402
from gemmrl.problem import GemmProblem  # noqa: E402

VARIANTS = {"base": (), "no_mma": ("-DGEMMRL_PACE=1",), "no_tma": ("-DGEMMRL_PACE=2",),
            "launch_only": ("-DGEMMRL_PACE=3",), "prologue_only": ("-DGEMMRL_PACE=4",),
            "no_gsplit_reduce": ("-DGEMMRL_PACE=6",), "spin_nosleep": ("-DGEMMRL_SPIN_SLEEP_NS=0",)}
CASES = [  # (mnk, (wg, bn, s, stages, g))
    ("64_64_64", (1, 64, 1, 2, 1)), ("64_64_1024", (1, 64, 1, 8, 1)), ("64_64_16384", (1, 64, 1, 8, 1)),
    ("64_64_16384", (1, 64, 1, 3, 1)), ("64_64_16384", (1, 256, 1, 5, 1)), ("64_64_16384", (2, 128, 1, 6, 1)),
    ("64_64_16384", (1, 64, 16, 8, 1)), ("64_64_16384", (1, 64, 1, 8, 4)), ("64_64_16384", (1, 64, 1, 4, 64)),
    ("64_64_16384", (1, 64, 1, 2, 128)), ("256_256_1024", (1, 64, 4, 4, 1)), ("4096_4096_4096", (2, 256, 1, 4, 1)),
]


def parse_case(text: str) -> tuple[str, tuple[int, ...]]:
    mnk, cfg = text.split(":")
    return mnk, tuple(int(x) for x in cfg.split(","))


def build(flags: tuple[str, ...]):
    b = cs.build(cs.CudaSource(SOURCE.read_text(), entry="gemmrl_gemm", shapes=cs.ShapeRange(k_mult=8), flags=flags))
    if not b.ok:
        raise SystemExit(f"wgmma_splitk.cu {flags}: {b.error}")
    return typed(cs.load_library(b.so))


def caller(lib, mnk: str, cfg: tuple[int, ...]):
    """(call, a, bt, c) for one case on fresh operands; the workspace of a global split zeroed once."""
    import torch

    M, N, K = map(int, mnk.split("_"))
    wg, bn, s, st, g = cfg
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    bt = torch.randn(N, K, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    ws_bytes = int(lib.gemmrl_wgmma_workspace_bytes(wg, bn, g, M, N))
    ws = torch.zeros(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def call() -> None:
        rc = lib.gemmrl_wgmma_gemm(a.data_ptr(), bt.data_ptr(), c.data_ptr(), M, N, K, K, K, N, ws.data_ptr(),
                                   ws_bytes, torch.cuda.current_stream().cuda_stream, wg, bn, s, st, g)
        if rc:
            raise RuntimeError(f"{mnk} {cfg}: gemmrl_wgmma_gemm returned {rc}")

    call.keep = (ws,)  # the workspace lives as long as the call
    return call, a, bt, c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--cases", nargs="*", help="M_N_K:wg,bn,s,stages,g (default: the built-in list)")
    ap.add_argument("--tag", default="", help="appended to each candidate name (tells runs apart in one file)")
    ap.add_argument("--once", help="one case, called --calls times eagerly with the base build (for ncu), then exit")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    import torch

    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.search.screen import SCREEN_TIMING
    from gemmrl.timing import time_graph

    torch.cuda.init()
    if args.once:
        mnk, cfg = parse_case(args.once)
        call = caller(build(()), mnk, cfg)[0]
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
        return 0
    cases = [parse_case(c) for c in args.cases] if args.cases else CASES
    meta = collect_meta().row()
    writer = ResultsWriter(args.out) if args.out else None
    timing = replace(SCREEN_TIMING, graph_replays=10)
    for mnk in dict.fromkeys(m for m, _ in cases):  # torch.matmul at each shape, the same protocol: a reference
        M, N, K = map(int, mnk.split("_"))
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        bt = torch.randn(N, K, device="cuda", dtype=torch.float16)
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        t = time_graph({"torch": lambda: torch.matmul(a, bt.t(), out=c)}, GemmProblem(M, N, K, layout="tn"), timing,
                       c=c)["torch"]
        print(f"torch   {mnk:15} {'torch.matmul':24} {t.time_ms * 1e3:9.2f} us/call", flush=True)
        if writer:
            writer.write_batch([{"mnk": mnk, "dtype": "fp16", "acc": "fp32", "layout": "tn", "candidate": "torch",
                                 "protocol": "graph", "time_ms": t.time_ms, "tflops": t.tflops, "n": t.n,
                                 "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "verified": "", "reason": t.reason, **meta,
                                 "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(), "M": M, "N": N, "K": K,
                                 "info": f"reference for the pace probe{args.tag}"}])
    for vname in args.variants.split(","):
        lib = build(VARIANTS[vname])
        for mnk, cfg in cases:
            M, N, K = map(int, mnk.split("_"))
            wg, bn, s, st, g = cfg
            conf = WgmmaConfig(wg, bn, s, st, "fp16", g)
            p = GemmProblem(M, N, K, layout="tn")
            call, a, bt, c = caller(lib, mnk, cfg)
            call()
            torch.cuda.synchronize()
            err = ""
            if vname in ("base", "spin_nosleep"):
                ref = a.float() @ bt.float().t()
                err = f"{float((c.float() - ref).norm() / ref.norm()):.2g}"
            t = time_graph({"x": call}, p, timing, c=c if err else None)["x"]
            steps = -(-K // 64) // (s * g)
            us = t.time_ms * 1e3
            print(f"{vname:7} {mnk:15} {str(conf):24} {us:9.2f} us/call {us / max(steps, 1):7.3f} us/K-step "
                  f"({steps} steps/CTA) rel_err {err or '-'} {t.reason or ''}", flush=True)
            if writer:
                writer.write_batch([{
                    "mnk": mnk, "dtype": "fp16", "acc": "fp32", "layout": "tn",
                    "candidate": f"wgmma-pace:{vname}:{conf}{args.tag}", "protocol": "graph", "time_ms": t.time_ms,
                    "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                    "verified": err != "" and float(err) < 1e-2,
                    "reason": "" if err else f"{vname}: wrong results on purpose (a pace probe)",
                    "algo": str(conf), **meta, "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(),
                    "M": M, "N": N, "K": K,
                    "info": f"steps_per_cta={steps};us_per_step={us / max(steps, 1):.4f};rel_err={err or '-'}"}])
            del call
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
