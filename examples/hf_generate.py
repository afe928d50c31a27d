"""Hugging Face transformers generation, stock against gemmrl.patch, eager and compiled, with a static KV cache.

The model is built from a transformers config with random weights (nothing is downloaded), directly on the device
in the chosen dtype (one copy of the weights, never a float32 one first):
  llama-3-8b   Llama-3-8B's config: hidden 4096, MLP 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256
  qwen2.5-7b   Qwen2.5-7B's config: hidden 3584, MLP 18944, 28 layers, 28 heads, 4 KV heads, vocab 152064 (q/k/v bias)
  mixtral-8x7b Mixtral-8x7B's config: hidden 4096, 8 experts of MLP 14336 (2 per token), 32 layers, 32 heads, 8 KV
               heads, vocab 32000 (the experts are stacked 3-D weights, not nn.Linear: they stay on their own path)
  tiny         a Llama of 2 layers, hidden 64 (the CPU tier; seconds on a CPU)
Each (batch, prompt length) runs ``model.generate`` greedy with ``cache_implementation="static"`` and a fixed count
of new tokens (EOS cannot stop it), in four modes on the same model object:
  stock-eager        the model as transformers builds it (generate's own auto-compile turned off)
  patched-eager      after gemmrl.patch(model): every nn.Linear through gemmrl.linear
  stock-compiled     generate's own compile with a static cache (a CompileConfig: inductor, mode="reduce-overhead",
                     i.e. CUDA graphs, a graph per batch size): the decode steps run compiled, prefill eager, as
                     transformers designs it (compiling model.forward by hand and running generate over it failed on
                     an H200 with torch 2.11: CUDA-graph outputs overwritten, cudagraphs skipped for the mutated cache)
  patched-compiled   the same after gemmrl.patch(model)
On a CPU the compiled modes use torch.compile(backend="aot_eager") (reduce-overhead is CUDA graphs): they check
that generate traces the patched model, their times say nothing about speed; ``--modes`` can leave them out.
Timing: per cell, WARMUP untimed generates (default 2: the first compiles and builds whatever serves each GEMM,
CUDA graph trees record a shape at its second call), then REPEATS timed ones (medians). The eager modes switch by
patch / unpatch alone, so their timed generates interleave (stock, patched, patched, stock, ...: the host's drift
falls on both); so do the compiled modes' (``--compiled-order interleaved``, the default: one compiled call, dynamo
keeping a graph per mode and cell; ``sequential``: each compiled mode compiled afresh, its cells after the other's,
a reading each, with whatever drift lies between them). The prefill time runs from
the call to the first new token reaching the host (a streamer's put, after torch.cuda.synchronize); the decode time
from there to generate's return (then synchronize again): the new tokens after the first.
  prefill tokens/s = batch x prompt length / time to first token
  decode tokens/s  = batch x (new tokens - 1) / their time
  each repeat      the timed generates' TTFT and decode ms per token one by one, in the order they ran
  vs stock         a patched row's tokens/s over stock's (interleaved modes: medians of the cell's timed generates);
                   where prefill or decode is under --bar (1.0), the noise rule: --recheck (3) further interleaved
                   pairs, and their medians' ratio is the one that counts (``*_counted``; the table prints it)
  peak memory      torch.cuda.max_memory_allocated over the timed generates (CUDA only)
  first generate   seconds of a cell's first (untimed) generate: compiling, recording graphs and building what
                   serves each new GEMM shape (gemmrl's first-sight race) fall there
  tokens equal     a patched mode's greedy tokens against the stock mode's of the same kind (eager / compiled)
  cpu per wall     the process's CPU seconds over the wall seconds of a timed generate (median): above 1, other
                   threads of the process (compile workers, spinning pools) ran beside the generate's own
What serves each GEMM: gemmrl.served_by on a sample input of each distinct patched layer shape [N, K] (the layer's
own weight, as gemmrl.linear calls it) at the decode M (batch) and the prefill M (batch x prompt length).

Writes under --out: hf_generate_<model>_<dtype>.csv (one row per mode x batch x prompt length, with the git sha,
the GPU, torch and transformers versions) and hf_generate_<model>_<dtype>_served.csv (the per-GEMM breakdown);
with --profile also hf_generate_<model>_<dtype>_kernels.csv (per cell and mode, one more generate under
torch.profiler: device time per kernel name over the generate, prefill included, per new token, and the device
idle time just before its launches) and hf_generate_<model>_<dtype>_timeline.csv (per cell and mode: the profiled
generate's span, busy and idle device time, idle split into gaps under 20 us, between kernels of one burst, and
longer ones, waiting on the host) and hf_generate_<model>_<dtype>_host.csv (per cell and mode: the host's events of
most self time, with CUDA runtime calls such as cudaGraphLaunch counted); prints the breakdown, then a short table of patched / stock last.

    python examples/hf_generate.py --model llama-3-8b --dtype bf16 --batches 1,8,32 --prompt-lens 512,2048 --out DIR
    python examples/hf_generate.py --model llama-3-8b --dtype bf16 --batches 1,8,32 --prompt-lens 512 --out DIR
        --modes stock-compiled,patched-compiled --tag compiled-p512      (a part of the grid, in files of its own)
    python examples/hf_generate.py --model tiny --dtype bf16 --device cpu --batches 1,2 --prompt-lens 8 --out DIR
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import sys
import time
from collections import defaultdict

MODES = ("stock-eager", "patched-eager", "stock-compiled", "patched-compiled")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
# (config class, model class, config values)
PRESETS = {
    "llama-3-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=128000, eos_token_id=128001,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False)),
    "qwen2.5-7b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, use_sliding_window=False,
        bos_token_id=151643, eos_token_id=151643, tie_word_embeddings=False)),
    "mixtral-8x7b": ("MixtralConfig", "MixtralForCausalLM", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)),
    "tiny": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)),
}


class ArgError(Exception):
    """A bad argument: main prints it as one line and returns 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise ArgError(message)


def ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgError(f"{what} takes comma-separated positive integers, got {text!r}") from None
    if not out or any(x < 1 for x in out):
        raise ArgError(f"{what} takes comma-separated positive integers, got {text!r}")
    return list(dict.fromkeys(out))


def parse(argv):
    ap = Parser(prog="hf_generate.py", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help=f"preset: {', '.join(PRESETS)}")
    ap.add_argument("--dtype", default="bf16", help="fp16 or bf16")
    ap.add_argument("--layers", type=int, help="override the preset's layer count (a shorter run, same GEMM shapes)")
    ap.add_argument("--batches", default="1", help="comma-separated batch sizes (decode M)")
    ap.add_argument("--prompt-lens", default="16", help="comma-separated prompt lengths (prefill M = batch x length)")
    ap.add_argument("--new-tokens", type=int, default=32, help="new tokens per generate (at least 2)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    ap.add_argument("--warmup", type=int, default=2, help="untimed generates per cell before timing")
    ap.add_argument("--repeats", type=int, default=3, help="timed generates per cell (medians)")
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when there is one)")
    ap.add_argument("--compile-backend", help="torch.compile backend (default: inductor on CUDA, aot_eager on CPU)")
    ap.add_argument("--compile-mode", help="torch.compile mode (default: reduce-overhead on CUDA, none on CPU)")
    ap.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True): a graph break fails")
    ap.add_argument("--compiled-order", default="interleaved", choices=("interleaved", "sequential"),
                    help="the compiled modes' timed generates: interleaved (ABBA on one compiled call, a graph per "
                         "mode kept) or sequential (each mode compiled afresh, its cells after the other's)")
    ap.add_argument("--dynamic", default="false", choices=("auto", "true", "false"),
                    help="torch.compile(dynamic=...) of the decode step: false (a graph per batch size, static shapes "
                         "as CUDA graphs want), auto (None: dynamic from a second batch size), true")
    ap.add_argument("--recheck", type=int, default=3,
                    help="the noise rule: where a patched mode's prefill or decode runs under --bar x stock's, this "
                         "many further interleaved pairs of timed generates, whose medians give the ratio that counts "
                         "(0: none)")
    ap.add_argument("--bar", type=float, default=1.0, help="patched / stock under which a cell is rechecked (1.0)")
    ap.add_argument("--library", help="library JSON that gemmrl serves from (default: the package's + the user's)")
    ap.add_argument("--out", default=".", help="folder for the CSVs")
    ap.add_argument("--tag", default="", help="added to the CSVs' names (runs split over several calls)")
    ap.add_argument("--profile", action="store_true",
                    help="after a cell's timed generates, one more under torch.profiler: device time per kernel "
                         "name (<stem>_kernels.csv), so a patched / stock gap can be traced to the kernels that differ")
    a = ap.parse_args(argv)
    if a.model not in PRESETS:
        raise ArgError(f"--model {a.model!r}: use one of {', '.join(PRESETS)}")
    if a.dtype not in DTYPES:
        raise ArgError(f"--dtype {a.dtype!r}: use fp16 or bf16 (gemmrl serves half precision only)")
    if a.layers is not None and a.layers < 1:
        raise ArgError(f"--layers {a.layers}: give at least 1")
    a.batches = ints(a.batches, "--batches")
    a.prompt_lens = ints(a.prompt_lens, "--prompt-lens")
    if a.new_tokens < 2:
        raise ArgError(f"--new-tokens {a.new_tokens}: give at least 2 (the first is prefill's, decode is the rest)")
    if a.warmup < 1 or a.repeats < 1:
        raise ArgError(f"--warmup {a.warmup} --repeats {a.repeats}: give at least 1 of each")
    if a.recheck < 0 or not a.bar > 0:
        raise ArgError(f"--recheck {a.recheck} --bar {a.bar}: give a count >= 0 and a bar > 0")
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes:
        raise ArgError(f"--modes {','.join(bad) or '(none)'}: use some of {', '.join(MODES)}")
    a.modes = [m for m in MODES if m in a.modes]  # stock before patched: patched rows compare against stock's tokens
    if a.device not in ("auto", "cuda", "cpu"):
        raise ArgError(f"--device {a.device!r}: use cuda, cpu or auto")
    longest = max(a.prompt_lens) + a.new_tokens
    limit = PRESETS[a.model][2]["max_position_embeddings"]
    if longest > limit:
        raise ArgError(f"prompt length {max(a.prompt_lens)} + {a.new_tokens} new tokens = {longest} is past "
                       f"{a.model}'s {limit} positions")
    if a.library is not None and not os.path.isfile(a.library):
        raise ArgError(f"--library {a.library!r}: no such file")
    if not all(c.isalnum() or c in "-_." for c in a.tag):
        raise ArgError(f"--tag {a.tag!r}: letters, digits, '-', '_' and '.' only (it goes into file names)")
    return a


# -- the model ---------------------------------------------------------------------------------------------
def build(preset: str, dtype, device, layers: int | None = None):
    """The preset's model with random weights, allocated on ``device`` in ``dtype`` directly."""
    import torch
    import transformers

    cfg_name, model_name, values = PRESETS[preset]
    values = dict(values, **({"num_hidden_layers": layers} if layers else {}))
    cfg = getattr(transformers, cfg_name)(**values)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # parameters are created (and randomly initialised) on the device, in dtype
        model = getattr(transformers, model_name)._from_config(cfg, dtype=dtype)
    model.generation_config.pad_token_id = cfg.eos_token_id
    return model.eval()


def linear_shapes(model) -> dict[tuple[int, int], list[str]]:
    """Each distinct nn.Linear weight shape (N, K) -> the names of the layers that have it."""
    import torch

    out = defaultdict(list)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            out[(m.out_features, m.in_features)].append(name)
    return dict(out)


def layer_kinds(names: list[str]) -> str:
    """'q_proj, o_proj (64 layers)' for the names of one shape."""
    kinds = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in names))
    return f"{', '.join(kinds)} ({len(names)} layer{'s' * (len(names) != 1)})"


def served_breakdown(model, batches, prompt_lens) -> list[dict]:
    """gemmrl.served_by for each distinct linear shape at each decode M and prefill M (builds what serves it)."""
    import torch

    import gemmrl

    layers = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            layers.setdefault((m.out_features, m.in_features), (name, m))
    shapes = linear_shapes(model)
    ms = defaultdict(list)  # (phase, M) -> the cells it comes from
    for b in batches:
        ms[("decode", b)].append(f"batch {b}")
        for p in prompt_lens:
            ms[("prefill", b * p)].append(f"{b}x{p}")
    rows = []
    for (n, k), (name, m) in layers.items():
        w = m.weight
        for (phase, M), cells in ms.items():
            a = torch.empty((M, k), dtype=w.dtype, device=w.device)
            s = gemmrl.served_by(a, w.t())  # w.t(): the operand gemmrl.linear passes (layout tn), no copy
            rows.append({"shape_nk": f"{n}_{k}", "layers": layer_kinds(shapes[(n, k)]), "phase": phase, "M": M,
                         "cells": " ".join(cells), "mnk": f"{M}_{n}_{k}", "eager": s["eager"], "graph": s["graph"]})
            del a
    return sorted(rows, key=lambda r: (list(layers).index(tuple(map(int, r["shape_nk"].split("_")))),
                                       r["phase"] != "decode", r["M"]))


# -- timing ------------------------------------------------------------------------------------------------
class FirstToken:
    """A generate streamer: notes when the first new token reaches the host (its copy there synchronizes)."""

    def __init__(self, sync):
        self.sync, self.puts, self.first = sync, 0, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:  # the first put is the prompt
            self.sync()
            self.first = time.perf_counter()

    def end(self):
        pass


def generate_once(model, ids, new_tokens: int, sync):
    """(tokens [B, new], seconds to the first new token, seconds for the rest)."""
    streamer = FirstToken(sync)
    sync()
    t0 = time.perf_counter()
    compiled = model.generation_config.compile_config is not None  # set by set_mode for the compiled modes
    out = model.generate(ids, attention_mask=ids.new_ones(ids.shape), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                         disable_compile=not compiled, streamer=streamer)
    sync()
    t1 = time.perf_counter()
    return out[:, ids.shape[1]:].cpu(), streamer.first - t0, t1 - streamer.first


def set_mode(model, mode: str, backend: str, cmode: str | None, fullgraph: bool, dynamic: bool | None = False):
    """Patch or unpatch, compile or not: the model object is the same in every mode (one copy of the weights). A
    compiled mode hands generate a CompileConfig: transformers compiles the decode steps' forward itself (prefill
    stays eager, as transformers designs it) and marks the static cache's tensors static for CUDA graphs."""
    from transformers import CompileConfig
    import torch

    import gemmrl

    gemmrl.unpatch(model)
    model.__dict__.pop("forward", None)
    for attr in ("_compiled_call", "_last_compile_config"):  # generate's compiled forward of the previous mode
        model.__dict__.pop(attr, None)
    model.generation_config.compile_config = None
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # graphs and graph breaks are counted per mode
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    report = gemmrl.patch(model) if mode.startswith("patched") else None
    if mode.endswith("compiled"):
        cc = CompileConfig(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=cmode)
        if model.device.type != "cuda":
            cc._compile_all_devices = True  # transformers compiles on CUDA only unless told
        model.generation_config.compile_config = cc
    return report


def switch(model, mode: str) -> None:
    """An eager mode on the same model object: patched or not (nothing else changes)."""
    import gemmrl

    gemmrl.unpatch(model)
    if mode.startswith("patched"):
        gemmrl.patch(model)


SHORT_GAP_US = 20.0  # an idle gap shorter than this sits between kernels of one launch burst (a graph replay);
                    # a longer one waits on the host (generate's loop between decode steps, an eager launch)


def idle_before(spans: list[tuple[str, float, float]]) -> tuple[dict[str, float], dict]:
    """The device timeline of (name, start us, end us) spans: {name: idle us just before its spans, summed} (the
    gap from the latest end so far to a span's start; overlapping or nested spans add none), and the totals
    {span_us, busy_us, idle_short_us, idle_long_us, long_gaps} with gaps split at SHORT_GAP_US."""
    before: dict[str, float] = defaultdict(float)
    tot = {"span_us": 0.0, "busy_us": 0.0, "idle_short_us": 0.0, "idle_long_us": 0.0, "long_gaps": 0}
    spans = sorted(spans, key=lambda t: t[1])
    if not spans:
        return dict(before), tot
    end = spans[0][1]
    for name, a, b in spans:
        gap = a - end
        if gap > 0:
            before[name] += gap
            if gap < SHORT_GAP_US:
                tot["idle_short_us"] += gap
            else:
                tot["idle_long_us"] += gap
                tot["long_gaps"] += 1
        tot["busy_us"] += max(0.0, b - max(a, end))
        end = max(end, b)
    tot["span_us"] = end - spans[0][1]
    return dict(before), {k: (round(v, 2) if isinstance(v, float) else v) for k, v in tot.items()}


HOST_TOP = 40  # the host events kept per cell (--profile): the most host time first


def kernel_times(model, ids, new_tokens: int, sync, cuda: bool) \
        -> tuple[list[tuple[str, int, float, float]], dict, list[tuple[str, int, float]]]:
    """One generate under torch.profiler: (kernel name, launches, total device us, device idle us just before its
    launches) of every device kernel it ran, longest total first; the timeline's totals (``idle_before``); and the
    host's events (name, count, self us: ops, CUDA runtime calls such as cudaGraphLaunch or cudaLaunchKernel), the
    HOST_TOP of most host time (on a CPU the CPU ops are the kernels: their self time and spans; the CPU tier's
    check of the path)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        generate_once(model, ids, new_tokens, sync)
    got: dict[str, list[float]] = defaultdict(list)
    host: dict[str, list[float]] = defaultdict(list)
    spans = []
    for ev in prof.events():
        on_device = ev.device_type == torch.autograd.DeviceType.CUDA
        if not on_device:
            host[ev.name].append(float(getattr(ev, "self_cpu_time_total", 0.0) or 0.0))
        if on_device == cuda:
            us = getattr(ev, "device_time", None) if on_device else getattr(ev, "self_cpu_time_total", None)
            if us is None:
                us = ev.cuda_time if on_device else 0.0
            got[ev.name].append(float(us))
            spans.append((ev.name, float(ev.time_range.start), float(ev.time_range.end)))
    before, tot = idle_before(spans)
    rows = [(k, len(v), sum(v), before.get(k, 0.0)) for k, v in got.items()]
    hosts = sorted(((k, len(v), sum(v)) for k, v in host.items()), key=lambda t: -t[2])[:HOST_TOP]
    return sorted(rows, key=lambda t: -t[2]), tot, hosts


def os_threads() -> int | str:
    """The process's OS threads (Linux: /proc/self/status), '' where that cannot be read."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return ""


def first_diff(a, b) -> int | str:
    """The first new-token step where any sequence differs, '' where none does."""
    diff = (a != b).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else ""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            raise ArgError("--device cuda: torch sees no CUDA GPU here")
    except ArgError as e:
        print(f"hf_generate.py: error: {e}", file=sys.stderr)
        return 2
    import transformers
    from torch._dynamo.utils import counters

    from gemmrl.library import Library
    from gemmrl.results import git_sha, now
    from gemmrl.serve import dispatch

    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if args.device == "auto" else args.device))
    cuda = dev.type == "cuda"
    dtype = getattr(torch, DTYPES[args.dtype])
    backend = args.compile_backend or ("inductor" if cuda else "aot_eager")
    cmode = args.compile_mode or ("reduce-overhead" if cuda and backend == "inductor" else None)
    for knob in ("recompile_limit", "cache_size_limit"):  # a graph per prefill/decode shape of each cell
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 64))
    dispatch.use_library(Library.load(args.library) if args.library else None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gpu = torch.cuda.get_device_name(dev) if cuda else "cpu"
    dynamic = {"auto": None, "true": True, "false": False}[args.dynamic]  # of the decode step's compile
    compile_note = f"generate's decode steps compiled: CompileConfig(backend={backend!r}" + \
        (f", mode={cmode!r}" if cmode else "") + (", fullgraph=True" if args.fullgraph else "") + \
        f", dynamic={dynamic}); prefill eager"
    if not cuda and any(m.endswith("compiled") for m in args.modes):
        compile_note += " on CPU: traces generate through the patched model; no CUDA graphs, times not a speed claim"

    model = build(args.model, dtype, dev, args.layers)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model} ({n_params / 1e9:.2f} B parameters, {args.dtype}) on {gpu}; "
          f"weights {torch.cuda.memory_allocated(dev) / 2**30:.1f} GiB" if cuda else
          f"{args.model} ({n_params / 1e6:.2f} M parameters, {args.dtype}) on cpu")
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = {(b, p): torch.randint(3, vocab, (b, p), generator=gen).to(dev)
               for b in args.batches for p in args.prompt_lens}

    meta = {"device": dev.type, "gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "git_sha": git_sha(), "timestamp": now(),
            "command": "python examples/hf_generate.py " + " ".join(argv)}
    rows, tokens, served, report = [], {}, [], None
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"hf_generate_{args.model}_{args.dtype}" + (f"_{args.tag}" if args.tag else ""))
    def warm(ids) -> float:
        """The cell's untimed generates; seconds of the first (compiles, records graphs, builds what serves)."""
        t0 = time.perf_counter()
        generate_once(model, ids, args.new_tokens, sync)
        first_s = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            generate_once(model, ids, args.new_tokens, sync)
        return first_s

    def timed(ids):
        """One timed generate: (tokens, ttft, decode seconds, peak bytes or None, the process's CPU seconds over
        its wall seconds: above 1, other threads of the process ran beside the generate's)."""
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        c0, w0 = time.process_time(), time.perf_counter()  # process_time: ns, all threads (os.times ticks 10 ms)
        g = generate_once(model, ids, args.new_tokens, sync)
        c1, w1 = time.process_time(), time.perf_counter()
        return (*g, torch.cuda.max_memory_allocated(dev) if cuda else None, (c1 - c0) / max(w1 - w0, 1e-9))

    def emit(mode, b, p, got, first_s, rep, order, vs=None, again=()):
        """One row: the cell's timed generates of ``mode``; ``vs``, a patched mode's ratios to stock (interleaved
        runs only); ``again``, its noise-rule rechecks' generates."""
        toks = got[-1][0]
        tokens[(mode, b, p)] = toks
        ttft = statistics.median(g[1] for g in got)
        dec = statistics.median(g[2] for g in got)
        ref = mode.replace("patched", "stock")
        same = diff = ""
        if mode.startswith("patched") and (ref, b, p) in tokens:
            same = bool(torch.equal(toks, tokens[(ref, b, p)]))
            diff = first_diff(toks, tokens[(ref, b, p)])
        row = {"model": args.model, "layers": model.config.num_hidden_layers, "dtype": args.dtype, "mode": mode,
               "batch": b, "prompt_len": p, "new_tokens": args.new_tokens,
               "prefill_tokens_per_s": round(b * p / ttft, 2),
               "decode_tokens_per_s": round(b * (args.new_tokens - 1) / dec, 2),
               "ttft_ms": round(ttft * 1e3, 4), "decode_ms_per_token": round(dec * 1e3 / (args.new_tokens - 1), 4),
               "ttft_ms_each": " ".join(f"{g[1] * 1e3:.2f}" for g in got),
               "decode_ms_per_token_each": " ".join(f"{g[2] * 1e3 / (args.new_tokens - 1):.3f}" for g in got),
               "peak_mem_gib": round(max(g[3] for g in got) / 2**30, 3) if cuda else "",
               "cpu_per_wall": round(statistics.median(g[4] for g in got), 3), "os_threads": os_threads(),
               "tokens_vs": ref if same != "" else "", "tokens_equal_stock": same, "first_diff_step": diff,
               "patched_layers": len(rep.patched) if rep else 0,
               "compiled_graphs": counters["stats"]["unique_graphs"] if mode.endswith("compiled") else "",
               "graph_breaks": sum(counters["graph_break"].values()) if mode.endswith("compiled") else "",
               "compile": compile_note if mode.endswith("compiled") else "eager", "order": order,
               "first_generate_s": round(first_s, 3), "warmup": args.warmup, "repeats": args.repeats,
               **(vs or dict.fromkeys(RATIO_COLUMNS, "")),
               "recheck_ttft_ms_each": " ".join(f"{g[1] * 1e3:.2f}" for g in again),
               "recheck_decode_ms_per_token_each": " ".join(f"{g[2] * 1e3 / (args.new_tokens - 1):.3f}"
                                                            for g in again), **meta}
        rows.append(row)
        write_csv(stem + ".csv", rows)  # after every cell: a run cut off by its time limit keeps what it timed
        print(f"{mode:16} batch {b:>3} prompt {p:>5}: prefill {row['prefill_tokens_per_s']:>11.1f} tok/s  "
              f"decode {row['decode_tokens_per_s']:>9.1f} tok/s  peak {row['peak_mem_gib'] or '-'} GiB  "
              f"tokens equal stock: {'-' if same == '' else same}", flush=True)

    kernels: list[dict] = []
    timeline: list[dict] = []
    host_rows: list[dict] = []

    def profiled(mode, b, p, ids):
        """--profile: one more generate of the cell under torch.profiler, kernels by name (device us per token)."""
        if not args.profile:
            return
        got, tot, hosts = kernel_times(model, ids, args.new_tokens, sync, cuda)
        cell = {"model": args.model, "dtype": args.dtype, "mode": mode, "batch": b, "prompt_len": p}
        run = {"gpu": gpu, "git_sha": meta["git_sha"]}
        host_rows.extend({**cell, "event": name[:200], "count": n, "self_us": round(us, 2), **run}
                         for name, n, us in hosts)
        kernels.extend({**cell, "kernel": name[:200], "launches": n, "total_us": round(us, 2),
                        "us_per_new_token": round(us / args.new_tokens, 3), "idle_before_us": round(idle, 2), **run}
                       for name, n, us, idle in got)
        timeline.append({**cell, **tot, "short_gap_us": SHORT_GAP_US, **run})
        write_csv(stem + "_kernels.csv", kernels)
        write_csv(stem + "_timeline.csv", timeline)
        write_csv(stem + "_host.csv", host_rows)

    def breakdown_once(rep):
        nonlocal report, served
        if rep is not None and report is None:
            report = rep
            print(rep)
            served = served_breakdown(model, args.batches, args.prompt_lens)

    def interleaved(modes: list[str]) -> None:
        """Stock and patched on one model, switched by patch / unpatch alone, their timed generates interleaved
        (ABBA: the host's drift falls on both). Compiled modes share generate's compiled call: dynamo keeps a
        graph per mode (the patched layers' forward is guarded), so a switch reuses the mode's graphs."""
        reps = {}
        for mode in modes:  # the last set_mode leaves the model in its kind (compile config or none), nothing built
            reps[mode] = set_mode(model, mode, backend, cmode, args.fullgraph, dynamic)
            breakdown_once(reps[mode])
        order = "interleaved" if len(modes) > 1 else "sequential"
        for (b, p), ids in prompts.items():
            first, got = {}, {m: [] for m in modes}
            for mode in modes:
                switch(model, mode)
                first[mode] = warm(ids)
            for r in range(args.repeats):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    switch(model, mode)
                    got[mode].append(timed(ids))
            pair = [m for m in modes if m.startswith("stock")] + [m for m in modes if m.startswith("patched")]
            again = {m: [] for m in modes}
            vs = ratios(got, pair) if len(pair) == 2 else None
            if vs and min(vs["prefill_vs_stock"], vs["decode_vs_stock"]) < args.bar:
                for r in range(args.recheck):  # the noise rule: further interleaved pairs, the ABBA order kept
                    for mode in (pair if (args.repeats + r) % 2 == 0 else pair[::-1]):
                        switch(model, mode)
                        again[mode].append(timed(ids))
                vs = ratios(got, pair, again)
            for mode in modes:
                emit(mode, b, p, got[mode], first[mode], reps[mode], order,
                     vs if mode.startswith("patched") else None, again[mode])
            for mode in modes:
                switch(model, mode)
                profiled(mode, b, p, ids)

    eager = [m for m in args.modes if m.endswith("eager")]
    if eager:
        interleaved(eager)
    compiled = [m for m in args.modes if m.endswith("compiled")]
    if compiled and args.compiled_order == "interleaved":
        interleaved(compiled)
    else:  # a compile each: one mode after the other
        for mode in compiled:
            rep = set_mode(model, mode, backend, cmode, args.fullgraph, dynamic)
            breakdown_once(rep)
            for (b, p), ids in prompts.items():
                first_s = warm(ids)
                emit(mode, b, p, [timed(ids) for _ in range(args.repeats)], first_s, rep, "sequential")
                profiled(mode, b, p, ids)
    set_mode(model, "stock-eager", backend, cmode, args.fullgraph, dynamic)  # leave the model as it was built

    write_csv(stem + ".csv", rows)
    if served:
        write_csv(stem + "_served.csv", [{**r, "model": args.model, "dtype": args.dtype, "gpu": gpu,
                                          "git_sha": meta["git_sha"]} for r in served])
        print("\nwhat serves each GEMM (gemmrl.served_by; M = decode batch, prefill batch x prompt length):")
        for r in served:
            print(f"  {r['mnk']:>22}  {r['phase']:7} {r['layers']:38} eager: {r['eager']}"
                  + (f"   graph: {r['graph']}" if r["graph"] != r["eager"] else ""))
    if kernels:
        print("\nlongest kernels per cell (--profile; the generate's " + ("device" if cuda else "CPU ops' self")
              + " us over its new tokens, prefill included):")
        for cell in dict.fromkeys((k["mode"], k["batch"], k["prompt_len"]) for k in kernels):
            top = [k for k in kernels if (k["mode"], k["batch"], k["prompt_len"]) == cell][:5]
            print(f"  {cell[0]} batch {cell[1]} prompt {cell[2]}: "
                  + "; ".join(f"{k['kernel'][:48]} {k['us_per_new_token']:.1f}" for k in top))
        print(f"the timeline per cell (us over the generate: busy, idle in gaps under {SHORT_GAP_US:g} us and over it; "
              "the kernels after the most idle):")
        for t in timeline:
            cell = (t["mode"], t["batch"], t["prompt_len"])
            worst = sorted((k for k in kernels if (k["mode"], k["batch"], k["prompt_len"]) == cell),
                           key=lambda k: -k["idle_before_us"])[:3]
            print(f"  {t['mode']} batch {t['batch']} prompt {t['prompt_len']}: span {t['span_us']:.0f}, busy "
                  f"{t['busy_us']:.0f}, idle {t['idle_short_us']:.0f} short + {t['idle_long_us']:.0f} long "
                  f"({t['long_gaps']} gaps); " + "; ".join(f"{k['kernel'][:40]} {k['idle_before_us']:.0f}" for k in worst))
            calls = {h["event"]: (h["count"], h["self_us"]) for h in host_rows
                     if (h["mode"], h["batch"], h["prompt_len"]) == cell}
            print("    host (calls, us each): " + ", ".join(
                f"{n} {calls[n][0]} x {calls[n][1] / max(calls[n][0], 1):.1f}"
                for n in ("cudaGraphLaunch", "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                          "cudaMemcpyAsync") if n in calls))
    if not cuda and any(m.endswith("compiled") for m in args.modes):
        print(f"\nnote: compiled modes are {compile_note}")
    print("\n" + table(rows))
    print(stem + ".csv")
    return 0


RATIO_COLUMNS = ("prefill_vs_stock", "decode_vs_stock", "rechecks", "prefill_vs_stock_recheck",
                 "decode_vs_stock_recheck", "prefill_vs_stock_counted", "decode_vs_stock_counted")


def ratios(got: dict, pair: list[str], again: dict | None = None) -> dict:
    """Patched / stock tokens/s (stock's median time over patched's) from the timed generates of an interleaved
    cell, prefill and decode; with ``again`` (the noise rule's further interleaved pairs) also their ratios, which
    are the ones that count (DESIGN: a cell is below a bar only if it stays below in the rechecks' median)."""
    stock, patched = pair

    def r(runs, i):
        return round(statistics.median(g[i] for g in runs[stock]) / statistics.median(g[i] for g in runs[patched]), 4)

    out = {"prefill_vs_stock": r(got, 1), "decode_vs_stock": r(got, 2), "rechecks": 0,
           "prefill_vs_stock_recheck": "", "decode_vs_stock_recheck": ""}
    if again and again[patched]:
        out.update(rechecks=len(again[patched]), prefill_vs_stock_recheck=r(again, 1),
                   decode_vs_stock_recheck=r(again, 2))
    out["prefill_vs_stock_counted"] = out["prefill_vs_stock_recheck"] or out["prefill_vs_stock"]
    out["decode_vs_stock_counted"] = out["decode_vs_stock_recheck"] or out["decode_vs_stock"]
    return out


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def table(rows: list[dict]) -> str:
    """Per (kind, batch, prompt): stock and patched tokens/s, prefill and decode, patched / stock, tokens equal."""
    by = {(r["mode"], r["batch"], r["prompt_len"]): r for r in rows}
    lines = [f"{'kind':9} {'batch':>5} {'prompt':>6} | {'prefill tok/s stock':>19} {'patched':>10} {'ratio':>6} | "
             f"{'decode tok/s stock':>18} {'patched':>9} {'ratio':>6} | {'peak GiB s/p':>13} | rechecks | tokens equal"]
    for kind in ("eager", "compiled"):
        for (mode, b, p), r in by.items():
            if mode != f"stock-{kind}":
                continue
            q = by.get((f"patched-{kind}", b, p))
            if q is None:
                lines.append(f"{kind:9} {b:>5} {p:>6} | {r['prefill_tokens_per_s']:>19.1f} {'-':>10} {'-':>6} | "
                             f"{r['decode_tokens_per_s']:>18.1f} {'-':>9} {'-':>6} |")
                continue
            pr = q["prefill_tokens_per_s"] / r["prefill_tokens_per_s"]
            dr = q["decode_tokens_per_s"] / r["decode_tokens_per_s"]
            if q.get("decode_vs_stock_counted", "") != "":  # interleaved: the noise rule's ratio (rechecks' median)
                pr, dr = q["prefill_vs_stock_counted"], q["decode_vs_stock_counted"]
            mem = f"{r['peak_mem_gib']}/{q['peak_mem_gib']}" if r["peak_mem_gib"] != "" else "-"
            eq = "yes" if q["tokens_equal_stock"] is True else f"no (from step {q['first_diff_step']})"
            lines.append(f"{kind:9} {b:>5} {p:>6} | {r['prefill_tokens_per_s']:>19.1f} "
                         f"{q['prefill_tokens_per_s']:>10.1f} {pr:>6.3f} | {r['decode_tokens_per_s']:>18.1f} "
                         f"{q['decode_tokens_per_s']:>9.1f} {dr:>6.3f} | {mem:>13} | {q.get('rechecks') or 0:>8} | {eq}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
