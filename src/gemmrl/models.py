"""GEMM shapes of common open models' linear layers, for ``gemmrl tune --model NAME``.

A linear layer y = x W^T with W [out, in] is the GEMM (M, N, K) = (tokens, out, in) in layout ``tn`` (the weight is
already B^T row-major). Dimensions from the models' published configs (hidden size, intermediate size, attention
heads x head dim, key-value heads, vocabulary):

* llama-3-8b:  hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, vocab 128256
* llama-3-70b: hidden 8192, 64 heads / 8 KV heads of 128, MLP 28672, vocab 128256
* qwen2.5-7b:  hidden 3584, 28 heads / 4 KV heads of 128, MLP 18944, vocab 152064
* mixtral-8x7b: hidden 4096, 32 / 8 heads of 128, 8 experts each an MLP of 14336 (w1, w3: 4096 -> 14336; w2 back)
* deepseek-v3: hidden 7168, routed and shared experts of 2048 (gate/up 7168 -> 2048, down 2048 -> 7168)
* deepseek-v2-lite: hidden 2048, experts of 1408 (gate/up 2048 -> 1408, down 1408 -> 2048)

Layers per model: fused QKV projection, attention output, MLP gate+up (fused, 2 x intermediate) and down, LM head
(dense models); for MoE models the expert MLP's gate/up and down (one expert's GEMM: M = tokens routed to it).
M (tokens) in ``TOKENS`` = {1, 16, 64, 256, 1024, 4096}.
"""

from __future__ import annotations

from .problem import GemmProblem

TOKENS = (1, 16, 64, 256, 1024, 4096)

# model -> {layer: (N = out features, K = in features)}
MODELS: dict[str, dict[str, tuple[int, int]]] = {
    "llama-3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                   "lm_head": (128256, 4096)},
    "llama-3-70b": {"qkv": (10240, 8192), "o": (8192, 8192), "gate_up": (57344, 8192), "down": (8192, 28672),
                    "lm_head": (128256, 8192)},
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944),
                   "lm_head": (152064, 3584)},
    "mixtral-8x7b": {"qkv": (6144, 4096), "o": (4096, 4096), "expert_w1_w3": (28672, 4096),
                     "expert_w2": (4096, 14336)},
    "deepseek-v3": {"expert_gate_up": (4096, 7168), "expert_down": (7168, 2048)},
    "deepseek-v2-lite": {"expert_gate_up": (2816, 2048), "expert_down": (2048, 1408)},
}
ALIASES = {"llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b", "qwen2.5": "qwen2.5-7b", "mixtral": "mixtral-8x7b",
           "deepseek": "deepseek-v3"}


def model_names() -> list[str]:
    return sorted(MODELS)


def model_shapes(name: str, tokens=TOKENS, dtype: str = "fp16", acc: str = "fp32") -> list[GemmProblem]:
    """Every (tokens, layer) GEMM of model ``name`` (comma list allowed; ``all`` for every model), deduplicated,
    in layout ``tn``. ValueError naming the known models for an unknown one."""
    names = model_names() if name == "all" else [ALIASES.get(n.strip().lower(), n.strip().lower())
                                                 for n in name.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        raise ValueError(f"unknown model {', '.join(bad) or name!r}; known: {', '.join(model_names())} (or all)")
    seen, out = set(), []
    for n in names:
        for _, (N, K) in MODELS[n].items():
            for M in tokens:
                key = (M, N, K)
                if key not in seen:
                    seen.add(key)
                    out.append(GemmProblem(M, N, K, dtype=dtype, acc=acc, layout="tn"))
    return out
