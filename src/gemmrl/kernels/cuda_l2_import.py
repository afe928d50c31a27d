"""Import a directory of CUDA-L2-style ``M_N_K.cu`` kernels as gemmrl candidates (``gemmrl bench --kernel-dir``).

Each file serves exactly one shape (its name) and defines an entry point with CUDA-L2's signature
``void <entry>(torch::Tensor a, torch::Tensor b, torch::Tensor b_col_major, torch::Tensor c)``
(CUDA-L2's H100 set calls it ``cuda_l2_h100_fp32``). ``b`` is B row-major [K,N] and ``b_col_major`` is
B column-major, i.e. B^T row-major [N,K]: exactly gemmrl's ``bt``.

Pipeline, per requested shape:
  discover   ``M_N_K.cu`` files in the directory (other names are ignored with a note).
  analyze    from the source (comments stripped): the entry point, the layout it reads (``tn`` if its
             body reads ``b_col_major``, ``nn`` if it reads ``b``; ``both``/``neither`` are recorded as such
             and declared ``tn``), and red flags (syncs, own streams, per-call allocations, default-stream
             launches, self-timing, static state), each marked whether it is in the entry's call path.
             Information only: correctness is decided by gemmrl's verification battery, not here.
  build      one torch extension per file (``torch.utils.cpp_extension.load``): the source copied
             verbatim plus a generated ``binding.cpp`` that declares the entry, checks shape, dtype,
             device and contiguity in C++ (nanoseconds, so host-timed protocols stay honest) and binds
             it as ``run``. Flags: CUDA-L2's (tools/utils.py), plus ``-DNDEBUG`` (``ndebug=False`` drops it;
             see NDEBUG_FLAG), ``-gencode`` for the device arch (``sm_90a`` on H100; ``GEMMRL_CUDA_ARCH``
             overrides), CUTLASS's include dirs when the source includes cutlass/cute (arch and headers from
             ``toolchain``, as for every native build); the C++ standard is left to torch, whose headers
             need it. Builds run in parallel in spawned processes and are cached under
             ``cache_dir("build", "import", <module>)``, keyed by a hash of source, flags, arch, entry,
             shape, dtype, torch, CUDA/nvcc and CUTLASS versions: a second import finds the ``.so`` and
             compiles nothing. An error in the kernel source is cached too (``force=True`` retries; missing
             headers are not cached) and comes back as an :class:`ImportFailure` with file, line,
             message and the log lines around it; the other files go on.
  load       the ``.so`` is imported in this process and wrapped in an :class:`ImportedCandidate`.

Nothing happens at import time of this module: no CUDA initialisation, no compile.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from ..paths import cache_dir
from ..problem import GemmProblem, ProblemError
from .toolchain import (
    CutlassNotFound, Ptxas, arch_for, cuda_home, cutlass_include_dirs, cutlass_version, digest, gencode, log_head,
    nvcc_version, parse_build_log,
)
from .vendor import raw_stream_getter

log = logging.getLogger(__name__)

BUILDER_VERSION = "4"  # bump when the binding template or the build recipe changes (invalidates the cache)
MNK_FILE_RE = re.compile(r"^(\d+)_(\d+)_(\d+)\.cu$")

# CUDA-L2's tools/utils.py get_build_cuda_cflags(build_pkg=False), minus -std (torch picks the standard
# its own headers need), its private -I dirs (none of its kernels include them) and -lcublas (no kernel
# calls cuBLAS; linking is torch's job).
CUDA_L2_NVCC_FLAGS = (
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-diag-suppress=177",
    "-Xptxas=-v",
    "-DNO_MMA_HGEMM_BIN",
    "-DNO_WMMA_HGEMM_BIN",
    "-DNO_CUTE_HGEMM_BIN",
    "-DNO_CUBLAS_HGEMM_BIN",
)
# Not in CUDA-L2's flags, added by default: without NDEBUG, CUTLASS's device-side assert() leaves a call
# inside the SM90 mainloop and ptxas serializes every wgmma (its warning C7510; seen here with nvcc 13.0 on
# a CUTLASS 3.x file of the H100 set, gone with -DNDEBUG). CUTLASS's own release builds define it.
# ndebug=False reproduces CUDA-L2's build exactly.
NDEBUG_FLAG = "-DNDEBUG"
CXX_FLAGS = ("-O3",)
HIDDEN = "-fvisibility=hidden"
MAX_JOBS_PER_BUILD = 2  # kernel.cu and binding.cpp compile side by side
DTYPE_SCALAR = {"fp16": "at::kHalf", "bf16": "at::kBFloat16"}


class EntryError(ValueError):
    """The source has no usable entry point (or several, and no ``entry=`` was given)."""


# ---------------------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------------------
class Discovery(dict):
    """``mnk -> Path`` of the kernel files found; ``ignored`` lists ``(file name, why)`` for the rest."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ignored: list[tuple[str, str]] = []


def discover(kernel_dir: str | os.PathLike) -> Discovery:
    """The ``M_N_K.cu`` files in ``kernel_dir`` (not recursive), keyed by canonical ``M_N_K``.

    Other files, and names whose dimensions are not a valid problem, are ignored and listed in the
    result's ``ignored`` with the reason (also logged at INFO).
    """
    d = Path(kernel_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: not a directory of M_N_K.cu kernel files")
    out = Discovery()
    for p in sorted(d.iterdir()):
        m = MNK_FILE_RE.match(p.name)
        why = None
        if not p.is_file():
            why = "not a regular file"
        elif not m:
            why = "name is not M_N_K.cu"
        else:
            try:
                mnk = GemmProblem(*(int(x) for x in m.groups())).mnk
            except ProblemError as e:
                why = f"not a valid shape: {e}"
            else:
                if mnk in out:
                    why = f"same shape as {out[mnk].name}"
                else:
                    out[mnk] = p
        if why:
            out.ignored.append((p.name, why))
            log.info("kernel dir %s: ignoring %s (%s)", d, p.name, why)
    return out


# ---------------------------------------------------------------------------------------------------------
# source analysis
# ---------------------------------------------------------------------------------------------------------
_LEX_RE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_PARAM = r"(?P<t{i}>(?:const\s+)?(?:torch|at)\s*::\s*Tensor(?:\s*const)?\s*&?)\s*(?P<n{i}>[A-Za-z_]\w*)"
_SIG_RE = re.compile(
    r"(?P<pre>(?:\b(?:static|inline|extern)\s+)*)\bvoid\s+(?P<name>[A-Za-z_]\w*)\s*\(\s*"
    + r"\s*,\s*".join(_PARAM.format(i=i) for i in range(4))
    + r"\s*\)\s*(?P<end>[{;])")
_FUNC_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\([^;{}()]*(?:\([^;{}()]*\)[^;{}()]*)*\)\s*"
                      r"(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:->\s*[\w:<>*& ]+?\s*)?\{")
_NOT_FUNCS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas", "defined"}
_META_CALLS = ("size", "sizes", "stride", "strides", "dim", "numel", "dtype", "scalar_type", "options", "device",
               "is_contiguous", "is_cuda", "get_device", "element_size", "itemsize", "layout", "defined", "type")
_DATA_RE = r"\b{p}\s*\.\s*(?:data_ptr|const_data_ptr|mutable_data_ptr|data)\b"

# name -> (pattern, what it means). Information only; the verification battery decides.
RED_FLAGS: dict[str, tuple[str, str]] = {
    "device_sync": (r"\bcudaDeviceSynchronize\s*\(", "device-wide synchronize (host latency; hides async work)"),
    "stream_sync": (r"\bcuda(?:Stream|Event)Synchronize\s*\(", "host waits on a stream or event"),
    "own_stream": (r"\bcudaStreamCreate\w*\s*\(", "creates its own stream (work may leave torch's current stream)"),
    "tensor_alloc": (r"\b(?:torch|at)\s*::\s*(?:empty|zeros|ones|empty_like|zeros_like|full)\s*\(",
                     "allocates tensors per call"),
    "device_malloc": (r"\bcudaMalloc\w*\s*\(|\bdevice_memory\s*::\s*allocation\b",
                      "allocates device memory (cudaMalloc / cutlass::device_memory::allocation)"),
    "memcpy": (r"\bcudaMemcpy(?!Async)\w*\s*\(", "synchronous cudaMemcpy"),
    "self_timing": (r"\bcudaEvent(?:Record|ElapsedTime)\s*\(", "times itself (self-tuning: first calls differ)"),
    "static_state": (r"\bstatic\s+(?!constexpr\b|const\b|inline\b|void\b|__\w+)[\w:<>]+[\s*&]+\w+\s*(?:=[^=;(]*)?;",
                     "keeps state across calls (first call differs; may cache)"),
    "default_stream": (r"<<<\s*[^<>;]*?>>>|\bcudaStream_t\s+\w+\s*=\s*(?:0|nullptr|NULL)\s*;|\.run\s*\(\s*\)",
                       "may launch on the legacy default stream rather than torch's current stream"),
    "threads": (r"\bstd\s*::\s*(?:thread|async)\b|\bcudaLaunchHostFunc\s*\(", "host threads or callbacks"),
}
_LAUNCH_ARGS_RE = re.compile(r"<<<(.*?)>>>", re.S)


@dataclass
class SourceInfo:
    """What the analysis of one kernel source found (see module docstring)."""

    entry: str
    params: tuple[str, ...]
    param_types: tuple[str, ...]
    namespace: tuple[str, ...]
    extern_c: bool
    layout: str
    layout_detected: str
    layout_evidence: dict[str, list[str]]
    red_flags: list[dict[str, Any]]
    needs_cutlass: bool
    notes: list[str] = field(default_factory=list)

    def flags_in_call_path(self) -> list[str]:
        return sorted({f["flag"] for f in self.red_flags if f["in_call_path"]})


def strip_source(text: str) -> str:
    """Blank out comments (keeping newlines, so line numbers hold) and structural characters inside
    string/char literals, so brace matching and pattern searches see only code."""
    def repl(m: re.Match) -> str:
        s = m.group(0)
        if s.startswith("/"):
            return re.sub(r"[^\n]", " ", s)
        return s[0] + re.sub(r"[{}()\[\];<>,]", " ", s[1:-1]) + s[-1]
    return _LEX_RE.sub(repl, text)


def _match_brace(text: str, i: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``i`` (or len(text) if unbalanced)."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def _scopes_at(text: str, pos: int) -> tuple[tuple[str, ...], bool]:
    """(enclosing namespaces, inside extern "C") at ``pos``, from the braces before it."""
    stack: list[tuple[str, str]] = []
    for m in re.finditer(r"[{}]", text[:pos]):
        if m.group(0) == "}":
            if stack:
                stack.pop()
            continue
        head = text[max(0, m.start() - 200):m.start()]
        ns = re.search(r"\bnamespace\s+([A-Za-z_][\w:]*)\s*$", head)
        if ns:
            stack.append(("ns", ns.group(1)))
        elif re.search(r"\bextern\s*\"C\"\s*$", head):
            stack.append(("c", ""))
        else:
            stack.append(("", ""))
    names = tuple(n for k, n in stack if k == "ns")
    if any(k == "" for k, _ in stack):
        raise EntryError("the entry point is defined inside a class or function block; it must be a free function")
    return names, any(k == "c" for k, _ in stack)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _functions(code: str) -> dict[str, list[tuple[int, int]]]:
    """Function-like definitions by name -> [(body start, body end)] (approximate, by pattern)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in _FUNC_RE.finditer(code):
        name = m.group(1)
        if name in _NOT_FUNCS:
            continue
        start = m.end() - 1
        out.setdefault(name, []).append((start, _match_brace(code, start)))
    return out


def _macros(code: str) -> dict[str, tuple[int, int]]:
    """``#define`` spans (with continuation lines) by macro name."""
    out: dict[str, tuple[int, int]] = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", code, re.M):
        end = m.end()
        while True:
            nl = code.find("\n", end)
            if nl < 0:
                end = len(code)
                break
            if code[:nl].rstrip(" \t\r").endswith("\\"):
                end = nl + 1
                continue
            end = nl
            break
        out[m.group(1)] = (m.end(), end)
    return out


def _call_path(code: str, entry_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of the entry body, and of every function and macro it reaches by name (transitively)."""
    named = _functions(code)
    for name, span in _macros(code).items():
        named.setdefault(name, []).append(span)
    spans, seen, todo = list(entry_spans), set(), list(entry_spans)
    while todo:
        s, e = todo.pop()
        for tok in set(re.findall(r"\b[A-Za-z_]\w*\b", code[s:e])):
            if tok in named and tok not in seen:
                seen.add(tok)
                for span in named[tok]:
                    spans.append(span)
                    todo.append(span)
    return spans


def _macro_text(code: str, body: str) -> str:
    """The bodies of the macros ``body`` uses, transitively (so reads hidden in a macro are seen)."""
    macros = _macros(code)
    seen: set[str] = set()
    todo, out = [body], []
    while todo:
        text = todo.pop()
        for tok in set(re.findall(r"\b[A-Za-z_]\w*\b", text)):
            if tok in macros and tok not in seen:
                seen.add(tok)
                s, e = macros[tok]
                out.append(code[s:e])
                todo.append(code[s:e])
    return "\n".join(out)


def _param_reads(body: str, p: str) -> tuple[list[str], list[str]]:
    """(data-pointer reads, other uses) of tensor parameter ``p`` in ``body`` (metadata queries, ``(void)p``
    and ALL_CAPS check macros do not count)."""
    strong = sorted(set(m.group(0).replace(" ", "") for m in re.finditer(_DATA_RE.format(p=re.escape(p)), body)))
    weak = []
    for m in re.finditer(rf"\b{re.escape(p)}\b", body):
        after = body[m.end():m.end() + 40]
        before = body[max(0, m.start() - 80):m.start()]
        if re.match(r"\s*\.\s*(?:%s)\s*\(" % "|".join(_META_CALLS), after):
            continue
        if re.match(r"\s*\.\s*(?:data_ptr|const_data_ptr|mutable_data_ptr|data)\b", after):
            continue
        if re.search(r"\(\s*void\s*\)\s*$", before):
            continue
        call = re.search(r"\b([A-Za-z_]\w*)\s*\(([^()]*)$", before)
        if call and re.fullmatch(r"[A-Z][A-Z0-9_]*", call.group(1)):
            continue
        line = body[body.rfind("\n", 0, m.start()) + 1:body.find("\n", m.end())].strip()
        weak.append(line[:120])
    return strong, weak


def analyze_source(text: str, entry: str | None = None, default_layout: str = "tn") -> SourceInfo:
    """Find the entry point, the layout it reads and red flags in a kernel source (see module docstring)."""
    code = strip_source(text)
    sigs = [m for m in _SIG_RE.finditer(code) if m.group("end") == "{"]
    names = sorted({m.group("name") for m in sigs})
    if entry is not None:
        sigs = [m for m in sigs if m.group("name") == entry]
        if not sigs:
            raise EntryError(f"no definition of entry {entry!r} with the signature void {entry}(torch::Tensor a, "
                             f"torch::Tensor b, torch::Tensor b_col_major, torch::Tensor c); found: {names or 'none'}")
    elif not sigs:
        raise EntryError("no entry point: no function void f(torch::Tensor a, torch::Tensor b, "
                         "torch::Tensor b_col_major, torch::Tensor c) is defined; pass entry= if it is spelled differently")
    elif len(names) > 1:
        conventional = [n for n in names if n.startswith("cuda_l2")]
        if len(conventional) != 1:
            raise EntryError(f"several functions have the 4-tensor signature ({', '.join(names)}); pass entry=")
        sigs = [m for m in sigs if m.group("name") == conventional[0]]
    sig = sigs[0]
    name = sig.group("name")
    types = tuple(re.sub(r"\s+", " ", sig.group(f"t{i}")).replace(" ::", "::").replace(":: ", "::").strip()
                  for i in range(4))
    notes: list[str] = []
    if len(sigs) > 1:
        if any(tuple(m.group(f"n{i}") for i in range(4)) != tuple(sig.group(f"n{i}") for i in range(4)) for m in sigs):
            raise EntryError(f"entry {name!r} is defined {len(sigs)} times with different parameters; pass a file "
                             "with one definition")
        notes.append(f"entry {name!r} is defined {len(sigs)} times (preprocessor branches?): all are analyzed")
    if any("static" in m.group("pre").split() for m in sigs):
        raise EntryError(f"entry {name!r} is static, so no other file can call it; remove `static`")
    namespace, extern_c = _scopes_at(code, sig.start())
    params = tuple(sig.group(f"n{i}") for i in range(4))
    spans = [(m.end() - 1, _match_brace(code, m.end() - 1)) for m in sigs]
    body = "\n".join(code[s:e] for s, e in spans)
    body += "\n" + _macro_text(code, body)

    # layout: which of the two B forms the body reads
    reads = {k: _param_reads(body, params[i]) for k, i in (("nn", 1), ("tn", 2))}
    strong = [k for k in ("tn", "nn") if reads[k][0]]
    weak = [k for k in ("tn", "nn") if reads[k][1]]
    basis = strong or weak
    detected = basis[0] if len(basis) == 1 else ("both" if basis else "neither")
    layout = detected if detected in ("tn", "nn") else default_layout
    if detected in ("both", "neither"):
        notes.append(f"entry reads {detected} of {params[1]} and {params[2]}: declared {layout!r} (both forms are "
                     "always supplied, so either works; the battery checks the result)")
    evidence = {params[1]: reads["nn"][0] + reads["nn"][1], params[2]: reads["tn"][0] + reads["tn"][1]}

    # red flags, marked in or out of the entry's call path
    spans = _call_path(code, spans)
    lines = text.splitlines()
    flags: list[dict[str, Any]] = []
    for flag, (pat, what) in RED_FLAGS.items():
        for m in re.finditer(pat, code):
            if flag == "default_stream" and m.group(0).startswith("<<<"):
                args = _split_top(m.group(0)[3:-3])
                if len(args) >= 4 and args[3].strip() not in LEGACY_STREAM_ARGS:  # a stream is given
                    continue
            ln = _line_of(code, m.start())
            in_path = any(s <= m.start() <= e for s, e in spans)
            if flag == "static_state" and not in_path:  # a global: in the path if the path uses it
                var = re.search(r"(\w+)\s*(?:=[^=;(]*)?;$", m.group(0)).group(1)
                in_path = any(re.search(rf"\b{var}\b", code[s:e]) for s, e in spans)
            flags.append({"flag": flag, "line": ln, "what": what, "text": lines[ln - 1].strip()[:120],
                          "in_call_path": in_path})
    if re.search(r"\bgetCurrentCUDAStream\s*\(", code):
        notes.append("uses torch's current stream (getCurrentCUDAStream)")
    if re.search(r"CUTLASS_ARCH_MMA_SM90\w*|__CUDA_ARCH_FEAT_SM90_ALL", code):
        notes.append("code is guarded by SM90 feature macros: it needs -gencode for sm_90a")
    needs_cutlass = bool(re.search(r"#\s*include\s*[<\"](?:cutlass|cute)/", text))
    return SourceInfo(entry=name, params=params, param_types=types, namespace=namespace, extern_c=extern_c,
                      layout=layout, layout_detected=detected, layout_evidence=evidence, red_flags=flags,
                      needs_cutlass=needs_cutlass, notes=notes)


LEGACY_STREAM_ARGS = ("0", "nullptr", "NULL", "cudaStreamLegacy", "(cudaStream_t)0", "cudaStream_t(0)")


def _split_top(s: str) -> list[str]:
    """Split on commas at parenthesis depth 0."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return parts + [cur]


def analyze(path: str | os.PathLike, entry: str | None = None) -> SourceInfo:
    """:func:`analyze_source` on a file."""
    return analyze_source(Path(path).read_text(errors="replace"), entry=entry)


# ---------------------------------------------------------------------------------------------------------
# toolchain, flags, cache key
# ---------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def toolchain() -> dict[str, str]:
    """torch version, torch's CUDA version and the nvcc that torch's extension builder will use."""
    import torch  # torch: seconds of start-up; importing this module must not load it

    home = cuda_home()
    nvcc = os.path.join(home, "bin", "nvcc") if home else ""
    ver = ""
    if nvcc and os.path.exists(nvcc):
        try:
            ver = nvcc_version(nvcc)
        except (OSError, subprocess.SubprocessError):
            ver = ""
    return {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda), "cuda_home": home,
            "nvcc": nvcc if ver else "", "nvcc_version": ver}


def build_flags(arch: str, ndebug: bool = True) -> list[str]:
    """The nvcc flags of a build (torch adds its own common ones and the include dirs): CUDA-L2's, plus
    ``-DNDEBUG`` unless ``ndebug=False`` (see NDEBUG_FLAG), plus ``-gencode`` for ``arch``."""
    return list(CUDA_L2_NVCC_FLAGS) + ([NDEBUG_FLAG] if ndebug else []) + [gencode(arch)]


def cache_key(source: str | bytes, *, flags: Iterable[str], arch: str, torch_version: str, cuda_version: str,
              entry: str = "", mnk: str = "", dtype: str = "fp16", cutlass: str = "") -> str:
    """Hex digest identifying one build: any change to any input gives a different key (and module name)."""
    src = source.encode() if isinstance(source, str) else source
    return digest((BUILDER_VERSION, hashlib.sha256(src).hexdigest(), "\0".join(flags), arch, torch_version,
                   cuda_version, entry, mnk, dtype, cutlass, _BINDING_TEMPLATE), 20)


# ---------------------------------------------------------------------------------------------------------
# build (runs in spawned worker processes)
# ---------------------------------------------------------------------------------------------------------
_BINDING_TEMPLATE = r"""// Generated by gemmrl.kernels.cuda_l2_import for {file} ({mnk}): binds {qual}.
#include <torch/extension.h>
#include <cuda_runtime_api.h>

{decl}

// 1 when the source launches on the legacy default stream (no stream given): the call is then ordered with
// torch's current stream by two events (when that stream is not the legacy one), and refused inside a CUDA
// graph capture, which the legacy stream cannot join.
#define GEMMRL_JOIN_LEGACY {join}

#if GEMMRL_JOIN_LEGACY
static void cuda_ok(cudaError_t e, const char* what) {{
  TORCH_CHECK(e == cudaSuccess, "{file}: ", what, ": ", cudaGetErrorString(e));
}}
#endif

static void run(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& bt, const torch::Tensor& c,
                int64_t stream) {{
  constexpr int64_t M = {M}, N = {N}, K = {K};
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && bt.dim() == 2 && c.dim() == 2 &&
              a.size(0) == M && a.size(1) == K && b.size(0) == K && b.size(1) == N &&
              bt.size(0) == N && bt.size(1) == K && c.size(0) == M && c.size(1) == N,
              "{file} serves only M_N_K = {mnk} (a [M,K], b [K,N], bt [N,K], c [M,N]); got a ", a.sizes(),
              ", b ", b.sizes(), ", bt ", bt.sizes(), ", c ", c.sizes());
  TORCH_CHECK(a.scalar_type() == {st} && b.scalar_type() == {st} && bt.scalar_type() == {st} &&
              c.scalar_type() == {st}, "{file} was imported for {dtype}; got ", a.scalar_type(), ", ",
              b.scalar_type(), ", ", bt.scalar_type(), ", ", c.scalar_type());
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && bt.is_cuda() && c.is_cuda(), "{file}: all four tensors must be on the GPU");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && bt.is_contiguous() && c.is_contiguous(),
              "{file}: all four tensors must be contiguous (row-major)");
#if GEMMRL_JOIN_LEGACY
  cudaStream_t cur = reinterpret_cast<cudaStream_t>(stream);
  if (cur != nullptr && cur != cudaStreamLegacy) {{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cuda_ok(cudaStreamIsCapturing(cur, &cs), "cudaStreamIsCapturing");
    TORCH_CHECK(cs == cudaStreamCaptureStatusNone, "{file} launches on the legacy default stream (no stream "
                "given), which cannot be part of a CUDA graph capture");
    static thread_local cudaEvent_t ev[2] = {{nullptr, nullptr}};
    for (auto& e : ev)
      if (e == nullptr) cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventRecord(ev[0], cur), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(cudaStreamLegacy, ev[0], 0), "cudaStreamWaitEvent");
    {qual}(a, b, bt, c);
    cuda_ok(cudaEventRecord(ev[1], cudaStreamLegacy), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(cur, ev[1], 0), "cudaStreamWaitEvent");
    return;
  }}
#endif
  (void)stream;
  {qual}(a, b, bt, c);
}}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
  m.def("run", &run, "{qual}(a, b, b_col_major, c) for {mnk}, with shape/dtype/device checks; stream: torch's "
        "current cudaStream_t");
  m.attr("joins_legacy_stream") = bool(GEMMRL_JOIN_LEGACY);
  m.attr("M") = {M}; m.attr("N") = {N}; m.attr("K") = {K};
  m.attr("entry") = "{qual}";
}}
"""


def binding_source(info: SourceInfo, mnk: str, file: str, dtype: str = "fp16") -> str:
    """The generated ``binding.cpp`` for one kernel file."""
    M, N, K = (int(x) for x in mnk.split("_"))
    decl = f"void {info.entry}({', '.join(f'{t} {n}' for t, n in zip(info.param_types, info.params))});"
    if info.extern_c:
        decl = f'extern "C" {decl}'
    for ns in reversed(info.namespace):
        decl = f"namespace {ns} {{ {decl} }}"
    qual = "::".join((*info.namespace, info.entry))
    return _BINDING_TEMPLATE.format(file=file, mnk=mnk, qual=qual, decl=decl, M=M, N=N, K=K,
                                    st=DTYPE_SCALAR[dtype], dtype=dtype, join=int(joins_legacy_stream(info)))


def joins_legacy_stream(info: SourceInfo) -> bool:
    """A source that launches on the legacy default stream in its call path (CUDA-L2's released kernels mostly
    use ``<<<grid, block, smem>>>`` with no stream) gets the event join of the binding: correct on any current
    stream, as in CUDA-L2's harness (where the current stream is the legacy one and the join costs nothing);
    refused inside a graph capture. Measured on the H100 without it: such kernels ran unordered with
    torch's current stream whenever that was not the legacy one (the battery's stream_order check)."""
    return "default_stream" in info.flags_in_call_path()


@contextlib.contextmanager
def _fds_to(path: Path):
    """Send this process's fd 1 and 2 (ninja, nvcc, ptxas output) to ``path`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def build_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Build one kernel module (the process-pool task). ``spec`` holds plain data (see :func:`_spec`);
    returns ``{"ok": True, ...}`` or ``{"ok": False, "stage", "file", "line", "message", "log_head", ...}``."""
    bdir = Path(spec["build_dir"])
    bdir.mkdir(parents=True, exist_ok=True)
    (bdir / "kernel.cu").write_text(spec["source_text"])
    (bdir / "binding.cpp").write_text(spec["binding"])
    logf = bdir / "build.log"
    logf.write_text("")
    os.environ["MAX_JOBS"] = str(spec.get("max_jobs", MAX_JOBS_PER_BUILD))
    t0 = time.perf_counter()
    err = None
    with _fds_to(logf):
        try:
            from torch.utils import cpp_extension  # torch: seconds of start-up, in the build worker only

            if not cpp_extension.CUDA_HOME:  # a CPU build of torch: compiles, cannot link (compile-only check)
                cpp_extension.CUDA_HOME = spec["cuda_home"]
            cpp_extension.load(name=spec["name"], sources=[str(bdir / "kernel.cu"), str(bdir / "binding.cpp")],
                 # both translation units see the same NDEBUG: torch's inline headers must agree (ODR).
                 # Every file of a set defines the same entry (and often the same kernels): hidden
                 # visibility + -Bsymbolic bind each module to its own copy, never to another module's.
                 extra_cflags=list(CXX_FLAGS) + [f for f in spec["flags"] if f == NDEBUG_FLAG] + [HIDDEN],
                 extra_cuda_cflags=list(spec["flags"]) + [f"-Xcompiler={HIDDEN}"],
                 extra_ldflags=["-Wl,-Bsymbolic"],
                 extra_include_paths=list(spec["include_dirs"]), build_directory=str(bdir), verbose=True,
                 with_cuda=True)
        except BaseException as e:  # noqa: BLE001 - any failure is reported, the pool goes on
            err = f"{type(e).__name__}: {e}"
    secs = round(time.perf_counter() - t0, 2)
    text = logf.read_text(errors="replace")
    res: dict[str, Any] = {"ok": err is None, "mnk": spec["mnk"], "build_s": secs, "log_path": str(logf),
                           "ptxas": Ptxas.parse(text).as_record(smem=False)}
    so = bdir / f"{spec['name']}{_so_suffix()}"
    if err is None and not so.is_file():
        err = f"build finished but {so.name} is missing"
    if err is not None:
        parsed = parse_build_log(text + "\n" + err, bdir, spec["source"])
        if parsed["stage"] == "build" and "ImportError" in err:
            parsed = {"stage": "load", "file": spec["source"], "line": None, "message": err[:500]}
        res.update(ok=False, **parsed, log_head=log_head(text) or err[:2000],
                   objects=sorted(p.name for p in bdir.glob("*.o")))
        if _cacheable(parsed, spec["source"]):
            (bdir / "error.json").write_text(json.dumps(res, indent=1))
    else:
        (bdir / "build.json").write_text(json.dumps(res, indent=1))
    return res


def _cacheable(parsed: dict[str, Any], source: str) -> bool:
    """A failure worth remembering: an error in the kernel source itself. Missing headers and errors in
    other files (the toolkit, torch, CUTLASS) may be this machine's fault and are retried next time."""
    missing_header = re.search(r"cannot open source file|No such file", parsed.get("message", ""))
    return parsed.get("stage") == "compile" and parsed.get("file") == source and not missing_header


def _so_suffix() -> str:
    return ".pyd" if sys.platform == "win32" else ".so"


# ---------------------------------------------------------------------------------------------------------
# results: candidates and failures
# ---------------------------------------------------------------------------------------------------------
@dataclass
class ImportFailure:
    """Why one shape has no imported candidate. ``stage``: missing | analyze | cutlass | toolchain |
    compile | link | build | load | internal. ``message`` is the compiler's (or our) words; ``line`` is in
    ``file`` where known; ``log_head`` the first lines of compiler output; ``log_path`` the whole log."""

    mnk: str
    file: str | None
    stage: str
    message: str
    line: int | None = None
    log_head: str = ""
    log_path: str | None = None
    cached: bool = False
    ok = False

    @property
    def missing(self) -> bool:
        return self.stage == "missing"

    @property
    def reason(self) -> str:
        where = f"{Path(self.file).name}:{self.line}: " if self.file and self.line else ""
        return f"{self.stage}: {where}{self.message}"[:400]

    def __str__(self) -> str:
        return self.reason


_MODULES: dict[str, Any] = {}


def _load_module(name: str, so: Path):
    """Import a built extension module by path (once per process)."""
    if name not in _MODULES:
        import torch  # noqa: F401 - loads the libraries the module links against (not at the top: start-up cost)

        spec = importlib.util.spec_from_file_location(name, so)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {so}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _MODULES[name] = mod
    return _MODULES[name]


class ImportedCandidate:
    """One imported kernel file as a gemmrl candidate (``cand(a, b, bt, c)``) for its one shape.

    ``name`` is ``import:<dirname>``; ``layout`` what its source reads; ``acc`` what the caller claims
    (the verification battery, not this label, establishes the truth). Calling it with another shape,
    dtype, non-CUDA or non-contiguous tensors raises a RuntimeError saying what it serves.
    """

    ok = True

    def __init__(self, name: str, mnk: str, layout: str, fn, *, acc: str = "fp32", dtype: str = "fp16",
                 build: dict[str, Any] | None = None, stream=None):
        self.name, self.mnk, self.layout, self.acc, self.dtype = name, mnk, layout, acc, dtype
        self.M, self.N, self.K = (int(x) for x in mnk.split("_"))
        self._fn = fn
        self._stream = stream  # device -> torch's current cudaStream_t, passed to the binding's run
        self._build = dict(build or {})

    def supports(self, problem: GemmProblem) -> bool:
        """True for the exact shape and dtype of this file."""
        return (problem.M, problem.N, problem.K, problem.dtype) == (self.M, self.N, self.K, self.dtype)

    def prepare(self, problem, bufs, protocol, timer) -> None:
        return None

    def __call__(self, a, b, bt, c) -> None:
        if self._stream is None:
            self._fn(a, b, bt, c)
        else:
            self._fn(a, b, bt, c, self._stream(a.device.index))

    def info(self) -> dict[str, Any]:
        return dict(self._build)

    def __repr__(self) -> str:
        return f"ImportedCandidate({self.name!r}, {self.mnk}, layout={self.layout!r}, acc={self.acc!r})"


# ---------------------------------------------------------------------------------------------------------
# the public entry point
# ---------------------------------------------------------------------------------------------------------
def _spec(path: Path, mnk: str, info: SourceInfo, *, arch: str, dtype: str, tc: dict[str, str],
          includes: list[Path], ndebug: bool = True) -> dict[str, Any]:
    text = path.read_text(errors="replace")
    flags = build_flags(arch, ndebug)
    key = cache_key(text, flags=flags, arch=arch, torch_version=tc["torch"],
                    cuda_version=f"{tc['torch_cuda']}/{tc['nvcc_version']}", entry=info.entry, mnk=mnk, dtype=dtype,
                    cutlass=cutlass_version(includes))
    name = f"gemmrl_imp_{mnk}_{key}"
    return {"name": name, "mnk": mnk, "key": key, "source": str(path), "source_text": text, "flags": flags,
            "arch": arch, "include_dirs": [str(p) for p in includes], "dtype": dtype,
            "binding": binding_source(info, mnk, path.name, dtype),
            "build_dir": str(cache_dir("build", "import", name)), "max_jobs": MAX_JOBS_PER_BUILD,
            "cuda_home": tc["cuda_home"]}


def _progress(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    try:
        from tqdm.auto import tqdm  # optional dependency, may be missing

        return tqdm(total=total, desc="building imported kernels", unit="file")
    except ImportError:
        return None


def build_specs(specs: list[dict[str, Any]], jobs: int | None = None, progress: bool = True) -> dict[str, dict]:
    """Build several kernel modules in parallel (spawned processes, one file each); results by mnk.
    A failing or crashing build yields a failure result; the others continue."""
    if not specs:
        return {}
    workers = max(1, min(len(specs), jobs or os.cpu_count() or 1))
    bar = _progress(len(specs), progress)
    out: dict[str, dict] = {}
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(build_one, s): s for s in specs}
        for fut in cf.as_completed(futs):
            s = futs[fut]
            try:
                res = fut.result()
            except BaseException as e:  # noqa: BLE001 - a crashed worker is one failure
                res = {"ok": False, "mnk": s["mnk"], "stage": "internal", "file": s["source"], "line": None,
                       "message": f"build worker died: {type(e).__name__}: {e}"[:500], "log_head": "",
                       "log_path": str(Path(s["build_dir"]) / "build.log")}
            out[s["mnk"]] = res
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=sum(not r["ok"] for r in out.values()))
            elif progress:
                print(f"[{len(out)}/{len(specs)}] {s['mnk']}: "
                      f"{'ok' if res['ok'] else 'FAILED ' + res.get('stage', '')} ({res.get('build_s', 0)} s)",
                      file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    return out


def load_kernel_dir(kernel_dir: str | os.PathLike, problems: Iterable[GemmProblem | str], *, acc: str = "fp32",
                    jobs: int | None = None, progress: bool = True, entry: str | None = None,
                    arch: str | None = None, dtype: str = "fp16", force: bool = False, ndebug: bool = True,
                    ) -> dict[str, ImportedCandidate | ImportFailure]:
    """Import the kernel files of ``kernel_dir`` for ``problems`` (GemmProblems or ``M_N_K`` strings).

    Returns ``{mnk: ImportedCandidate | ImportFailure}`` for every requested shape; a shape with no file
    gets ``ImportFailure(stage="missing")``. Only files for requested shapes are built; cached builds are
    loaded without compiling; the rest build in parallel (``jobs`` processes, default the CPU count).
    ``acc`` is the accumulator the set claims (recorded, verified elsewhere); ``dtype`` the element type
    the kernels are imported for (CUDA-L2's are fp16); ``arch`` defaults to ``$GEMMRL_CUDA_ARCH``, else the
    current GPU's (``toolchain.arch_for``); ``entry`` overrides entry-point detection; ``force`` rebuilds cached
    failures; ``ndebug=False`` drops ``-DNDEBUG`` to build exactly as CUDA-L2 did (see NDEBUG_FLAG).
    """
    kdir = Path(kernel_dir)
    found = discover(kdir)
    set_name = f"import:{kdir.resolve().name}"
    wanted = list(dict.fromkeys(p if isinstance(p, str) else p.mnk for p in problems))
    out: dict[str, ImportedCandidate | ImportFailure] = {}
    infos: dict[str, SourceInfo] = {}
    specs: list[dict[str, Any]] = []
    tc: dict[str, str] | None = None
    for mnk in wanted:
        path = found.get(mnk)
        if path is None:
            out[mnk] = ImportFailure(mnk, None, "missing", f"no {mnk}.cu in {kdir}")
            continue
        try:
            info = infos[mnk] = analyze(path, entry)
        except EntryError as e:
            out[mnk] = ImportFailure(mnk, str(path), "analyze", str(e))
            continue
        try:
            includes = cutlass_include_dirs() if info.needs_cutlass else []
        except CutlassNotFound as e:
            out[mnk] = ImportFailure(mnk, str(path), "cutlass", str(e))
            continue
        if tc is None:
            tc = toolchain()
            arch = arch_for(arch=arch)
        if not tc["nvcc"]:
            out[mnk] = ImportFailure(mnk, str(path), "toolchain",
                                     "nvcc not found: install the CUDA toolkit or set CUDA_HOME")
            continue
        spec = _spec(path, mnk, info, arch=arch, dtype=dtype, tc=tc, includes=includes, ndebug=ndebug)
        bdir = Path(spec["build_dir"])
        so = bdir / f"{spec['name']}{_so_suffix()}"
        if so.is_file():
            res = json.loads((bdir / "build.json").read_text()) if (bdir / "build.json").is_file() else {"ok": True}
            res.update(ok=True, cached=True)
            spec["result"] = res
        elif (bdir / "error.json").is_file() and not force:
            spec["result"] = {**json.loads((bdir / "error.json").read_text()), "cached": True}
        specs.append(spec)
    built = build_specs([s for s in specs if "result" not in s], jobs=jobs, progress=progress)
    for s in specs:
        mnk, info = s["mnk"], infos[s["mnk"]]
        res = s.get("result") or built[mnk]
        if not res["ok"]:
            out[mnk] = ImportFailure(mnk, res.get("file") or s["source"], res.get("stage", "build"),
                                     res.get("message", ""), res.get("line"), res.get("log_head", ""),
                                     res.get("log_path"), bool(res.get("cached")))
            continue
        so = Path(s["build_dir"]) / f"{s['name']}{_so_suffix()}"
        try:
            fn = _load_module(s["name"], so).run
        except Exception as e:  # noqa: BLE001 - e.g. an undefined symbol: reported, not fatal
            out[mnk] = ImportFailure(mnk, s["source"], "load", f"{type(e).__name__}: {e}"[:500],
                                     log_path=str(Path(s["build_dir"]) / "build.log"))
            continue
        build_info = {
            "source": s["source"], "mnk": mnk, "entry": info.entry, "hash": s["key"], "module": s["name"],
            "so": str(so), "layout": info.layout, "layout_detected": info.layout_detected,
            "layout_evidence": info.layout_evidence, "flags": s["flags"], "arch": s["arch"],
            "include_dirs": s["include_dirs"], "red_flags": info.flags_in_call_path(),
            "red_flag_details": info.red_flags, "notes": info.notes, "cached": bool(res.get("cached")),
            "build_s": res.get("build_s"), "ptxas": res.get("ptxas"), "claimed_acc": acc, "dtype": dtype,
            "stream_adapter": ("legacy default stream joined to torch's current stream by events; not capturable"
                               if joins_legacy_stream(info) else ""),
            **{k: v for k, v in (tc or {}).items() if k != "cuda_home"},
        }
        out[mnk] = ImportedCandidate(set_name, mnk, info.layout, fn, acc=acc, dtype=dtype, build=build_info,
                                     stream=raw_stream_getter())
    return {mnk: out[mnk] for mnk in wanted}


__all__ = ["discover", "analyze", "analyze_source", "load_kernel_dir", "ImportedCandidate", "ImportFailure",
           "SourceInfo", "Discovery", "cache_key", "build_flags", "binding_source", "joins_legacy_stream", "build_one",
           "build_specs", "EntryError"]
