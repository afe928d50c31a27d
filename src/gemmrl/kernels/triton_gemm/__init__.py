"""The Triton HGEMM family (the Triton-family bar): C[M,N] = A[M,K] @ B in fp16/bf16, acc fp32 or (fp16 data) fp16.

Variants, each a frozen config type with one validity predicate (``configs.valid``):
  tiled        classic tiled kernel: BM, BN, BK, warps, stages, GROUP_M swizzle; masked tails, any shape.
  persistent   one program per SM looping over tiles (order m/n), TMA tensor descriptors (Hopper) or a
               pointer-load fallback; flatten, warp specialization and epilogue subtiling as options.
  splitk       split-K with deterministic reductions (two-pass fp32 workspace, or fused last-arriver sum in
               fixed order) or fp32 atomics behind ``nondeterministic=True``.
  smallm       decode shapes M in 1..63: swap-AB, one M tile, wide N tiles streaming B, optional TMA, split-K.

    from gemmrl.kernels.triton_gemm import TritonGemm, SplitKConfig
    cand = TritonGemm(SplitKConfig(split=8), layout="tn")   # then cand.prepare(...), cand(a, b, bt, c)

Layout: ``jit/`` Triton source (loaded per mode by ``runtime``), ``configs`` (configs, predicates),
``plans`` (check -> allocate -> grid -> bound arguments), ``runtime`` (loading, TMA scratch, direct launch),
``candidate`` (the candidate protocol). The space and the cost model are in ``gemmrl.search``.
Importing this package imports neither torch nor triton. Tests: ``pytest tests/kernels/test_triton_gemm.py``
(interpreter tier on CPU; ``-m gpu`` on a GPU machine).
"""

from .candidate import TritonGemm
from .configs import (A100, H100, H200, INTERPRETER, Arch, Config, ConfigError, PersistentConfig, SmallMConfig,
                      SplitKConfig, TiledConfig, check, parse_config, valid)

__all__ = ["TritonGemm", "A100", "H100", "H200", "INTERPRETER", "Arch", "Config", "ConfigError", "PersistentConfig",
           "SmallMConfig", "SplitKConfig", "TiledConfig", "check", "parse_config", "valid"]
