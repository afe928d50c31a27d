"""Where a tiny call's time goes in the ``cold`` protocol: one call after the L2 is overwritten with dirty lines
(timing.time_cold), against the same call in ``graph`` (warm, back to back).

Probe kernels (``benchmarks/acceptance/cold_anatomy.cu``, built through ``cuda_source.build`` for the device's arch, loaded with
ctypes): an empty kernel; one 16-byte load; chains of 1-16 dependent loads 4 KiB apart (DRAM latency per trip); one CTA
loading 2-32 KiB (a one-CTA GEMM's operands); straight-line code of 1.6-394 KiB of SASS (after the flush the
instructions come from DRAM too). Beside them, GEMMs of the tiny shapes: torch.matmul and the Triton config the
grid library serves there (``--library``, read with ``Library.load``). Rows are in the results schema (candidate
``cold-anatomy:<probe>``, ``info`` holds the probe's parameter); each line of the table is printed as measured.

    PYTHONPATH=src python3 benchmarks/acceptance/cold_anatomy.py --out cold_anatomy.csv [--library LIB.json.gz]   # on the GPU
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SRC = Path(__file__).with_name("cold_anatomy.cu")
CODE_SIZES = (64, 512, 2048, 8192, 32768)  # FFMAs per thread, the entries cold_code<N>
CHAIN_HOPS = (1, 4, 16)
TILE_BYTES = (2048, 8192, 32768)
GEMM_SHAPES = ("64_64_64", "128_128_128", "256_256_256", "64_64_512")
STRIDE_WORDS = 512  # 4 KiB between the chain's links: each hop a new DRAM page region, no sector shared


def build() -> ctypes.CDLL:
    """The probe kernels, built (or found in the build cache) by cuda_source.build for this device's arch."""
    from gemmrl.kernels import cuda_source as cs

    built = cs.build(cs.CudaSource(SRC.read_text(), entry="cold_empty", name="cold-anatomy"))
    if not built.ok:
        raise SystemExit(f"cold_anatomy.cu did not build: {built.error}")
    return cs.load_library(built.so)


def library_configs(path: str | None) -> dict[tuple[str, str], tuple[str, str]]:
    """(mnk, protocol) -> (layout, Triton config) the library serves, for the tiny shapes (first Triton entry)."""
    if not path:
        return {}
    from gemmrl.library import Library

    out = {}
    for e in Library.load(path).entries:
        if e.mnk in GEMM_SHAPES and e.family == "triton" and (e.mnk, e.protocol) not in out:
            out[(e.mnk, e.protocol)] = (e.layout, e.impl)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="results CSV (schema of DESIGN.md)")
    ap.add_argument("--library", help="a grid library (.json[.gz]): its Triton configs on the tiny shapes are timed")
    ap.add_argument("--cold-calls", type=int, default=40)
    args = ap.parse_args(argv)
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels.triton_gemm import TritonGemm
    from gemmrl.kernels.triton_gemm.configs import parse_config
    from gemmrl.problem import parse_mnk
    from gemmrl.results import ResultsWriter, collect_meta, now, sm_clock_mhz
    from gemmrl.timing import TimingConfig, measure, time_cold, time_graph

    torch.cuda.init()
    lib = build()
    vp = ctypes.c_void_p
    lib.cold_empty.argtypes = [vp]
    lib.cold_load1.argtypes = [vp, vp, vp]
    lib.cold_chain_init.argtypes = [vp, ctypes.c_int, ctypes.c_int, vp]
    lib.cold_chain.argtypes = [vp, ctypes.c_int, vp, vp]
    lib.cold_tile.argtypes = [vp, ctypes.c_int, vp, vp]
    for n in CODE_SIZES:
        getattr(lib, f"cold_code{n}").argtypes = [ctypes.c_float, vp, vp]

    meta = collect_meta().row()
    writer = ResultsWriter(args.out) if args.out else None
    cfg = replace(TimingConfig(), cold_calls=args.cold_calls, graph_min_work_ms=2.0, graph_min_timed_ms=50.0,
                  settle_ms=50.0, settle_max_ms=200.0)
    x = torch.zeros(max(CHAIN_HOPS) * STRIDE_WORDS * 8 + (1 << 16), dtype=torch.uint8, device="cuda")
    y = torch.zeros(1 << 12, dtype=torch.uint8, device="cuda")
    lib.cold_chain_init(x.data_ptr(), max(CHAIN_HOPS) + 1, STRIDE_WORDS, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()

    def s():
        return torch.cuda.current_stream().cuda_stream

    def check(rc: int) -> None:
        if rc:
            raise RuntimeError(f"launch failed: CUDA error {rc}")

    probes = {"empty": (lambda: check(lib.cold_empty(s())), "")}
    probes["load1"] = (lambda: check(lib.cold_load1(x.data_ptr(), y.data_ptr(), s())), "bytes=16")
    for h in CHAIN_HOPS:
        probes[f"chain{h}"] = (lambda h=h: check(lib.cold_chain(x.data_ptr(), h, y.data_ptr(), s())), f"hops={h}")
    for b in TILE_BYTES:
        probes[f"tile{b}"] = (lambda b=b: check(lib.cold_tile(x.data_ptr(), b, y.data_ptr(), s())), f"bytes={b}")
    for n in CODE_SIZES:
        probes[f"code{n}"] = (lambda n=n: check(getattr(lib, f"cold_code{n}")(1.0, y.data_ptr(), s())),
                              f"ffma_per_thread={n}")
    fns = {k: f for k, (f, _) in probes.items()}
    p0 = parse_mnk("64_64_64")
    res = {"graph": time_graph(fns, p0, cfg), "cold": time_cold(fns, p0, cfg)}
    rows = []
    print(f"{'probe':44} {'graph us':>9} {'cold us':>9} {'cold-graph':>10}", flush=True)

    def line(k: str, g: float, c: float) -> None:
        print(f"{k:44} {g:9.2f} {c:9.2f} {c - g:10.2f}", flush=True)

    for k, (_, info) in probes.items():
        g, c = res["graph"][k], res["cold"][k]
        line(k, g.time_ms * 1e3, c.time_ms * 1e3)
        for proto, t in (("graph", g), ("cold", c)):
            rows.append({"mnk": "", "dtype": "", "acc": "", "candidate": f"cold-anatomy:{k}", "protocol": proto,
                         "time_ms": t.time_ms, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "reason": t.reason,
                         **meta,
                         "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(), "info": f"{info};probe"})

    served = library_configs(args.library)
    for mnk in GEMM_SHAPES:
        for proto in ("graph", "cold"):
            layout, text = served.get((mnk, proto), ("tn", ""))
            p = parse_mnk(mnk).with_(layout=layout)
            bufs = make_buffers(p, "cuda")
            a, b, bt, c = bufs.args()
            cands = {"torch": (lambda: torch.matmul(a, bt.t(), out=c)) if layout == "tn"
                     else (lambda: torch.matmul(a, b, out=c))}
            if text:
                tg = TritonGemm(parse_config(text), layout)
                tg.prepare(p, bufs, proto, None)
                cands["triton"] = lambda tg=tg: tg(a, b, bt, c)
            ts = measure(cands, bufs, proto, cfg)
            for k, t in ts.items():
                line(f"{mnk} {layout} {k} ({proto})", t.time_ms * 1e3 if proto == "graph" else float("nan"),
                     t.time_ms * 1e3 if proto == "cold" else float("nan"))
                rows.append({"mnk": mnk, "dtype": p.dtype, "acc": p.acc, "layout": layout,
                             "candidate": f"cold-anatomy:gemm:{k}", "protocol": proto, "time_ms": t.time_ms,
                             "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                             "reason": t.reason, "algo": text if k == "triton" else "", **meta,
                             "sm_clock_mhz": sm_clock_mhz(), "timestamp": now(), "M": p.M, "N": p.N, "K": p.K,
                             "info": "gemm"})
            del bufs
    if writer:
        writer.write_batch(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
