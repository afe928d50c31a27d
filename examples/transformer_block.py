"""A Llama-3-8B transformer block, stock PyTorch against the same block with gemmrl.patch, end to end.

Dimensions of Llama-3-8B (hidden 4096, 32 query heads and 8 KV heads of 128, SwiGLU MLP of 14336), the QKV
projection fused (6144 x 4096) as vLLM lays it out, RMSNorm, rotary embedding, causal SDPA; fp16 on one GPU.
Four measurements, each stock and patched (same weights, same inputs):
  eager forward      block(x) under no_grad
  graph forward      the same captured once in a CUDA graph and replayed
  eager train step   forward, loss, backward (grads into .grad)
  graph train step   torch.cuda.make_graphed_callables(block) forward + backward
Time per call: CUDA events around ITERS calls, median of ROUNDS rounds, stock and patched interleaved.
Writes transformer_block.csv (one row per measurement, the command line in it) under --out.

    python examples/transformer_block.py --tokens 16 --library lib.json --out DIR
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, pos, theta: float = 500000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, head_dim
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv_proj = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, x):  # x [B, S, hidden]
        B, S, _ = x.shape
        q, k, v = self.qkv_proj(self.norm1(x)).split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        pos = torch.arange(S, device=x.device)
        q = rope(q.view(B, S, self.h, self.hd).transpose(1, 2), pos)
        k = rope(k.view(B, S, self.kv, self.hd).transpose(1, 2), pos)
        v = v.view(B, S, self.kv, self.hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(att.transpose(1, 2).reshape(B, S, self.h * self.hd))
        h = self.norm2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def gemm_shapes(self, tokens: int) -> list[tuple[int, int, int]]:
        return [(tokens, m.out_features, m.in_features) for m in (self.qkv_proj, self.o_proj, self.gate_proj,
                                                                  self.down_proj)]


def timed(fn, iters: int) -> float:
    """ms per call over ``iters`` back-to-back calls (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def compare(fns: dict, iters: int, rounds: int) -> dict:
    for f in fns.values():  # warm
        for _ in range(3):
            f()
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            got[k].append(timed(f, iters))
    return {k: statistics.median(v) for k, v in got.items()}


def graphed_forward(block, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            block(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = block(x)
    return g.replay, y


def train_step(block, x):
    def step():
        for p in block.parameters():
            p.grad = None
        y = block(x)
        y.float().pow(2).mean().backward()
    return step


def graphed_train_step(block, x):
    xg = x.detach().clone().requires_grad_(True)
    gb = torch.cuda.make_graphed_callables(block, (xg,), num_warmup_iters=3)

    def step():
        for p in block.parameters():
            p.grad = None
        y = gb(xg)
        y.float().pow(2).mean().backward()
    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16, help="tokens in the batch (M of every GEMM)")
    ap.add_argument("--seq", type=int, default=1, help="sequence length (tokens = batch x seq)")
    ap.add_argument("--library", help="library JSON to serve from (default: the package's + the user's)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("transformer_block.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.tokens % args.seq:
        ap.error("--tokens must be a multiple of --seq")
    import gemmrl
    from gemmrl.serve import dispatch
    from gemmrl.results import collect_meta, now

    dispatch.use_library(args.library)
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.float16
    stock = Block().to(dev, dt)
    ours = Block().to(dev, dt)
    ours.load_state_dict(stock.state_dict())
    served = gemmrl.warmup(ours.gemm_shapes(args.tokens), dtype=dt, layouts=("tn",))
    report = gemmrl.patch(ours)
    print(report)
    for r in served:
        print(f"  {r['mnk']:>16} tn  eager: {r['eager']}\n  {'':>19} graph: {r['graph']}")
    x = (torch.randn(args.tokens // args.seq, args.seq, 4096, device=dev) * 0.5).to(dt)
    with torch.no_grad():
        err = (ours(x).float() - stock(x).float()).abs().max().item()
    print(f"max |patched - stock| on the block output: {err:.3g}")

    results = []
    with torch.no_grad():
        t = compare({"stock": lambda: stock(x), "gemmrl": lambda: ours(x)}, args.iters, args.rounds)
    results.append(("eager", "forward", t))
    (gs, _), (go, _) = graphed_forward(stock, x), graphed_forward(ours, x)
    results.append(("graph", "forward", compare({"stock": gs, "gemmrl": go}, args.iters, args.rounds)))
    results.append(("eager", "train_step", compare({"stock": train_step(stock, x), "gemmrl": train_step(ours, x)},
                                                   args.iters, args.rounds)))
    results.append(("graph", "train_step", compare({"stock": graphed_train_step(stock, x),
                                                    "gemmrl": graphed_train_step(ours, x)}, args.iters, args.rounds)))
    meta = {**collect_meta().row(), "timestamp": now()}
    rows = []
    for mode, what, t in results:
        rows.append({"model": "llama-3-8b block", "tokens": args.tokens, "seq": args.seq, "dtype": "fp16",
                     "mode": mode, "pass": what, "stock_ms": round(t["stock"], 5), "gemmrl_ms": round(t["gemmrl"], 5),
                     "speedup": round(t["stock"] / t["gemmrl"], 4), "max_abs_diff": f"{err:.3g}",
                     "iters": args.iters, "rounds": args.rounds,
                     "command": "python examples/transformer_block.py " + " ".join(argv or sys.argv[1:]), **meta})
        print(f"{mode:5} {what:10} stock {t['stock'] * 1e3:9.1f} us   gemmrl {t['gemmrl'] * 1e3:9.1f} us   "
              f"x{t['stock'] / t['gemmrl']:.3f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"transformer_block_m{args.tokens}.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
