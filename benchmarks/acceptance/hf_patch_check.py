"""gemmrl.patch on Hugging Face transformers models at full size: outputs, unpatch, state_dict and memory.

Each model of examples/hf_generate.py's presets (Llama-3-8B, Qwen2.5-7B, Mixtral-8x7B by default; random weights
built on the device in the dtype, nothing downloaded), in each dtype, on one set of token batches (prefill-like
B x T and a decode-like 1 x 1):
  stock      two untimed forwards (use_cache=False), then one with the peak-memory counter reset: its logits and
             peak (torch.cuda.max_memory_allocated)
  patch      gemmrl.patch(model): memory allocated before and after (no weight is copied: 0 bytes), the report
             (patched layers; layers left on their own path and why)
  patched    one forward that builds what serves each new shape (the fallback race: its peak is reported apart),
             one more untimed, then one with the counter reset: logits and steady peak; patched / stock peak <= 1.02;
             the memory gemmrl holds after serving them (allocated now less allocated before patch)
  per GEMM   one layer of each distinct weight shape: its input captured in a patched forward, then gemmrl.mm on
             that input and the layer's own weight checked against the fp64 product with the correctness battery's
             accuracy bounds (gemmrl.verify.check_output); torch.matmul's product on the same operands beside it
  logits     patched against stock: largest difference, relative Frobenius error, top-1 agreement; beside them the
             vendor's own spread: stock's logits of the first sequence run alone (another M, so other cuBLAS
             algorithms) against the same sequence in the batch (random-weight models, MoE routing above all, turn
             rounding differences into different logits; each GEMM's own accuracy is the per-GEMM check)
  unpatch    gemmrl.unpatch: every module the same object as before, no attribute left, logits bit-identical to
             stock's; parameters the same tensors (pointers, shapes, strides) before patch, while patched and after;
             one patched layer's state_dict saved and loaded into a fresh stock nn.Linear gives the same output

    python benchmarks/acceptance/hf_patch_check.py --out DIR [--models llama-3-8b,qwen2.5-7b,mixtral-8x7b]
        [--dtypes fp16,bf16] [--inputs 4x64,1x1] [--layers N] [--library FILE] [--tag TAG]
Writes hf_patch_<tag>.csv (one row per model x dtype x input) and hf_patch_layers_<tag>.csv (one per GEMM checked)
under --out and prints a short table last; exit 1 if any check failed. On a CPU (``--device cpu``, the tiny
preset) it runs the same checks without the memory figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import math
import os
import sys
from pathlib import Path

import torch

import gemmrl
from gemmrl.library import Library
from gemmrl.problem import GemmProblem
from gemmrl.results import git_sha, now
from gemmrl.serve import dispatch
from gemmrl.verify import check_output

ROOT = Path(__file__).resolve().parents[2]
MEM_LIMIT = 1.02  # patched / stock peak memory, steady state
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def hf_generate():
    """examples/hf_generate.py as a module (its presets and model builder)."""
    spec = importlib.util.spec_from_file_location("hf_generate", ROOT / "examples" / "hf_generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ArgError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgError(message)


def parse(argv, presets):
    ap = Parser(prog="hf_patch_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3-8b,qwen2.5-7b,mixtral-8x7b")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--inputs", default="4x64,1x1", help="token batches BxT, comma-separated")
    ap.add_argument("--layers", type=int, help="override each preset's layer count")
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--library", help="library JSON gemmrl serves from (default: the package's + the user's)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="check")
    a = ap.parse_args(argv)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in a.models if m not in presets]
    if bad or not a.models:
        raise ArgError(f"--models {','.join(bad) or '(none)'}: use some of {', '.join(presets)}")
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    if not a.dtypes or any(d not in DTYPES for d in a.dtypes):
        raise ArgError(f"--dtypes {','.join(a.dtypes)}: use fp16 and/or bf16")
    try:
        a.inputs = [tuple(int(x) for x in s.lower().split("x")) for s in a.inputs.split(",") if s.strip()]
    except ValueError:
        raise ArgError(f"--inputs {a.inputs!r}: give BxT pairs such as 4x64,1x1") from None
    if not a.inputs or any(len(s) != 2 or min(s) < 1 for s in a.inputs):
        raise ArgError(f"--inputs: give BxT pairs of positive integers such as 4x64,1x1")
    if a.device not in ("cuda", "cpu"):
        raise ArgError(f"--device {a.device!r}: use cuda or cpu")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ArgError("--device cuda: torch sees no CUDA GPU here (use --device cpu --models tiny)")
    if a.library is not None and not os.path.isfile(a.library):
        raise ArgError(f"--library {a.library!r}: no such file")
    if a.layers is not None and a.layers < 1:
        raise ArgError(f"--layers {a.layers}: give at least 1")
    if not all(c.isalnum() or c in "-_." for c in a.tag):
        raise ArgError(f"--tag {a.tag!r}: letters, digits, '-', '_' and '.' only")
    return a


def forward(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def peak_of(model, ids, dev):
    """(logits, peak bytes) of one forward with the peak counter reset (CUDA) or (logits, None)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    out = forward(model, ids)
    if dev.type != "cuda":
        return out, None
    torch.cuda.synchronize(dev)
    return out, torch.cuda.max_memory_allocated(dev)


def params_of(model) -> dict[str, tuple]:
    return {k: (p.data_ptr(), tuple(p.shape), p.stride(), p.dtype) for k, p in model.named_parameters()}


def one_per_shape(model) -> dict[str, torch.nn.Linear]:
    """The first nn.Linear of each distinct (out, in, bias) by name."""
    seen, out = set(), {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            key = (m.out_features, m.in_features, m.bias is not None)
            if key not in seen:
                seen.add(key)
                out[name] = m
    return out


def captured_inputs(model, layers: dict[str, torch.nn.Linear], ids) -> dict[str, torch.Tensor]:
    """Each layer's input in one forward of ``model`` (forward pre-hooks; removed after)."""
    got: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: got.setdefault(n, args[0].detach().clone()))
             for n, m in layers.items()]
    try:
        forward(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return got


def layer_checks(model, ids, dtype: str, base: dict) -> list[dict]:
    """gemmrl.mm and torch.matmul on each sampled layer's own input and weight, against the fp64 product."""
    layers = one_per_shape(model)
    inputs = captured_inputs(model, layers, ids)
    rows = []
    for name, m in layers.items():
        x = inputs[name]
        a = x.reshape(-1, m.in_features)
        b = m.weight.t()  # the operand gemmrl.linear passes (layout tn, no copy)
        M, K = a.shape
        problem = GemmProblem(M, m.out_features, K, dtype=dtype, acc="fp32", layout="tn")
        with torch.no_grad():
            ours = gemmrl.mm(a, b)
            theirs = torch.matmul(a, b)
        r = check_output(ours, a, b, problem)
        t = check_output(theirs, a, b, problem)
        a_ = torch.empty((M, K), dtype=a.dtype, device=a.device)
        served = gemmrl.served_by(a_, b)
        rows.append({**base, "layer": name, "mnk": problem.mnk, "served_eager": served["eager"],
                     "served_graph": served["graph"], "gemmrl_passed": r.passed,
                     "gemmrl_r": round(r.stats.get("r", math.nan), 4), "r_limit": round(r.stats.get("r_limit", math.nan), 4),
                     "gemmrl_elem_ratio": round(r.stats.get("elem_ratio", math.nan), 4),
                     "torch_matmul_passed": t.passed, "torch_matmul_r": round(t.stats.get("r", math.nan), 4),
                     "torch_matmul_elem_ratio": round(t.stats.get("elem_ratio", math.nan), 4),
                     "reason": r.reason})
        del x, a, a_, ours, theirs
    return rows


def state_roundtrip(model) -> bool:
    """One patched layer's state_dict through torch.save / torch.load into a fresh stock nn.Linear: same output."""
    name, m = next((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=m.weight.device,
                            dtype=m.weight.dtype)
    fresh.load_state_dict(torch.load(buf, map_location=m.weight.device))
    x = torch.randn(3, m.in_features, device=m.weight.device, dtype=m.weight.dtype)
    with torch.no_grad():
        return bool(torch.equal(fresh(x), torch.nn.functional.linear(x, m.weight, m.bias)))


def check_model(gen, preset: str, dtype: str, args, dev, meta) -> tuple[list[dict], list[dict]]:
    model = gen.build(preset, DTYPES[dtype], dev, args.layers)
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    inputs = {(b, t): torch.randint(3, cfg.vocab_size, (b, t), generator=g).to(dev) for b, t in args.inputs}
    cuda = dev.type == "cuda"
    stock, alone = {}, {}
    for key, ids in inputs.items():
        forward(model, ids)
        forward(model, ids)
        logits, peak = peak_of(model, ids, dev)
        stock[key] = (logits, peak)
        if ids.shape[0] > 1:  # the vendor's own spread: the first sequence alone (another M, other algorithms)
            alone[key] = forward(model, ids[:1])
    before_modules = dict(model.named_modules())
    before_params = params_of(model)
    alloc0 = torch.cuda.memory_allocated(dev) if cuda else 0
    rep = gemmrl.patch(model)
    patch_bytes = (torch.cuda.memory_allocated(dev) - alloc0) if cuda else 0
    print(f"{preset} {dtype}: {rep}", flush=True)
    same_params_patched = params_of(model) == before_params
    base = {"model": preset, "dtype": dtype, "layers": cfg.num_hidden_layers}
    rows = []
    first = {}
    for key, ids in inputs.items():
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        forward(model, ids)  # builds what serves each new shape (races once per bucket)
        first[key] = torch.cuda.max_memory_allocated(dev) if cuda else None
        forward(model, ids)
    patched = {key: peak_of(model, ids, dev) for key, ids in inputs.items()}
    held = (torch.cuda.memory_allocated(dev) - alloc0) if cuda else 0  # what serving the shapes keeps allocated
    layer_rows = []
    for (b, t), ids in inputs.items():
        layer_rows += layer_checks(model, ids, dtype, {**base, "input": f"{b}x{t}"})
    roundtrip = state_roundtrip(model)
    n = gemmrl.unpatch(model)
    after_modules = dict(model.named_modules())
    same_modules = after_modules.keys() == before_modules.keys() and all(
        after_modules[k] is v for k, v in before_modules.items())
    left = [k for k, m in after_modules.items()
            if "forward" in m.__dict__ or any(a.startswith("_gemmrl") for a in m.__dict__)]
    same_params_after = params_of(model) == before_params
    for (b, t), ids in inputs.items():
        s_logits, s_peak = stock[(b, t)]
        p_logits, p_peak = patched[(b, t)]
        u_logits = forward(model, ids)
        d = (p_logits.float() - s_logits.float())
        rel = float(d.norm() / s_logits.float().norm())
        top1 = float((p_logits.argmax(-1) == s_logits.argmax(-1)).float().mean())
        mem_ratio = p_peak / s_peak if cuda else math.nan
        spread = {}
        if (b, t) in alone:
            s0, a0 = s_logits[:1].float(), alone[(b, t)].float()
            spread = {"stock_alone_rel_fro": f"{float((a0 - s0).norm() / s0.norm()):.3e}",
                      "stock_alone_top1": round(float((a0.argmax(-1) == s0.argmax(-1)).float().mean()), 5),
                      "patched_seq0_rel_fro": f"{float((p_logits[:1].float() - s0).norm() / s0.norm()):.3e}",
                      "patched_seq0_top1": round(float((p_logits[:1].argmax(-1) == s0.argmax(-1)).float().mean()), 5)}
        else:
            spread = {"stock_alone_rel_fro": "", "stock_alone_top1": "", "patched_seq0_rel_fro": "",
                      "patched_seq0_top1": ""}
        mine = [r for r in layer_rows if r["input"] == f"{b}x{t}"]
        ok = {
            "gemms_within_battery": all(r["gemmrl_passed"] for r in mine),
            "unpatch_restores_modules": same_modules and not left and n == len(rep.patched),
            "unpatch_logits_bit_identical": bool(torch.equal(u_logits, s_logits)),
            "params_unchanged": same_params_patched and same_params_after,
            "state_dict_roundtrip": roundtrip,
            "patch_allocates_nothing": patch_bytes == 0,
            "memory_within_2pct": (mem_ratio <= MEM_LIMIT) if cuda else True,
        }
        rows.append({**base, "input": f"{b}x{t}", "M": b * t, "patched_layers": len(rep.patched),
                     "skipped": "; ".join(f"{k}: {w}" for k, w in _kinds(rep.skipped)),
                     "logits_max_abs_diff": round(float(d.abs().max()), 6),
                     "logits_max_abs": round(float(s_logits.float().abs().max()), 4),
                     "logits_rel_fro": f"{rel:.3e}", "top1_agreement": round(top1, 5), **spread,
                     "peak_stock_gib": round(s_peak / 2**30, 4) if cuda else "",
                     "peak_patched_gib": round(p_peak / 2**30, 4) if cuda else "",
                     "peak_patched_first_call_gib": round(first[(b, t)] / 2**30, 4) if cuda else "",
                     "peak_ratio": round(mem_ratio, 5) if cuda else "",
                     "patch_allocated_bytes": patch_bytes, "held_after_serving_mib": round(held / 2**20, 1),
                     **ok, "all_passed": all(ok.values()), **meta})
    del model, stock, patched, inputs
    gc.collect()
    dispatch.reset()  # what served this model's shapes (workspaces, plans) goes with it
    if cuda:
        torch.cuda.empty_cache()
    return rows, layer_rows


def _kinds(skipped) -> list[tuple[str, str]]:
    """Skipped layers grouped by their module name's last part: ('mlp.experts (32 layers)', why)."""
    groups: dict[tuple[str, str], int] = {}
    for name, why in skipped:
        key = (".".join(name.split(".")[-2:]), why)
        groups[key] = groups.get(key, 0) + 1
    return [(f"{k} ({n} module{'s' * (n != 1)})", why) for (k, why), n in groups.items()]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    gen = hf_generate()
    try:
        args = parse(argv, gen.PRESETS)
    except ArgError as e:
        print(f"hf_patch_check.py: error: {e}", file=sys.stderr)
        return 2
    import transformers

    dev = torch.device(args.device)
    dispatch.use_library(Library.load(args.library) if args.library else None)
    meta = {"device": dev.type, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "git_sha": git_sha(),
            "timestamp": now(), "command": "python benchmarks/acceptance/hf_patch_check.py " + " ".join(argv)}
    rows, layer_rows = [], []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for preset in args.models:
        for dtype in args.dtypes:
            r, lr = check_model(gen, preset, dtype, args, dev, meta)
            rows += r
            layer_rows += lr
            gen.write_csv(out / f"hf_patch_{args.tag}.csv", rows)  # after each model: a run cut off keeps what it did
            gen.write_csv(out / f"hf_patch_layers_{args.tag}.csv", layer_rows)
    bad = [r for r in layer_rows if not r["gemmrl_passed"]]
    for r in bad:
        print(f"  GEMM outside the battery's bounds: {r['model']} {r['dtype']} {r['layer']} {r['mnk']}: {r['reason']}")
    print(f"\n{'model':14} {'dtype':5} {'input':6} {'patched':>7} {'top1':>7} {'rel err':>9} {'peak s/p GiB':>15} "
          f"{'ratio':>6} {'GEMMs ok':>8} {'unpatch':>7} {'all':>4}")
    for r in rows:
        peak = f"{r['peak_stock_gib']}/{r['peak_patched_gib']}" if r["peak_stock_gib"] != "" else "-"
        print(f"{r['model']:14} {r['dtype']:5} {r['input']:6} {r['patched_layers']:>7} {r['top1_agreement']:>7.4f} "
              f"{r['logits_rel_fro']:>9} {peak:>15} {str(r['peak_ratio'] or '-'):>6} "
              f"{'yes' if r['gemms_within_battery'] else 'NO':>8} "
              f"{'yes' if r['unpatch_restores_modules'] and r['unpatch_logits_bit_identical'] else 'NO':>7} "
              f"{'yes' if r['all_passed'] else 'NO':>4}")
    print(out / f"hf_patch_{args.tag}.csv")
    return 0 if all(r["all_passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
