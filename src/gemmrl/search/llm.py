"""The LLM proposer: kernels from any OpenAI-compatible chat endpoint.

This module holds the endpoint's configuration (:class:`LLMConfig`), the prompt (:func:`build_prompt`), the
reading of a completion into a candidate (:func:`extract`) and the proposer (:class:`LLMProposer`). Scoring a
completion as a training reward is ``reward.py``; serving that reward over HTTP is ``reward_server.py``.

Proposing (:class:`LLMProposer`, the ``Proposer`` protocol of ``proposer.py``): for one problem the prompt
(:func:`build_prompt`) carries the problem, the GPU (SMs, shared memory, L2, clocks), the best and the worst
measured kernels of the nearest shapes with their speedups (contrastive, as CUDA-L1/L2 do), and this shape's
last compile errors, verification failures and profiler metrics. Each completion is read by :func:`extract`
into a ``CandidateSpec`` -- a Triton config (```json), a Triton kernel (```python) or a CUDA C++ kernel in
gemmrl's ABI (```cuda), each kernel with its declared shape range -- and the loop builds, verifies and times it
through the same sandboxed path as every other candidate. The endpoint is ``openai.OpenAI(base_url=...)``:
vLLM, SGLang, llama.cpp, OpenAI and friends (:class:`LLMConfig`: ``GEMMRL_LLM_BASE_URL``, ``GEMMRL_LLM_MODEL``,
``GEMMRL_LLM_API_KEY``).

Trajectories: every (prompt, completion, reward, verdict) is appended to a JSONL file in the conversational
prompt/completion format of TRL's GRPOTrainer: ``{"prompt": [messages], "completion": [{"role": "assistant",
"content": ...}], "reward", "verdict", "reason", "mnk", ...}``; ``reward`` is ``reward_rule.training_reward``.

Tests: ``pytest tests/search/test_llm.py`` (a local scripted OpenAI-compatible server; Triton interpreter on CPU).
Nothing runs at import time: ``openai`` (an optional dependency) is imported inside the proposer's methods.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..kernels.cuda_source import CudaSource, CudaSourceError, ShapeRange
from ..kernels.triton_gemm.configs import H100, parse_config, valid
from ..kernels.triton_source import TritonSource, TritonSourceError
from ..measure.evaluate import CandidateSpec
from ..paths import cache_dir
from ..problem import GemmProblem
from .proposer import Context, Outcome, Proposal
from .reward_rule import FAIL_REWARD, training_reward

MAX_CODE_CHARS = 3000  # per kernel shown in a prompt
ANSWER_LANGS = {"json": "json", "python": "python", "py": "python", "cuda": "cuda", "cu": "cuda", "cpp": "cuda",
                "c++": "cuda", "c": "cuda"}


class LLMConfigError(ValueError):
    """No endpoint configured, or one the endpoint refused (bad URL, model or key); the message says what to set."""


class ExtractError(ValueError):
    """A completion that is not a usable answer; the message says what was wrong and which format to use."""


# ---------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LLMConfig:
    """One OpenAI-compatible endpoint and how to sample from it. ``n``: completions asked per request (one
    request per proposal when 1); ``seed``: send a seed drawn from the loop's rng (switch off for endpoints
    that reject it). ``api_key`` may be anything for local servers (vLLM accepts ``EMPTY``)."""

    base_url: str
    model: str
    api_key: str = field(default="EMPTY", repr=False)
    temperature: float = 0.8
    max_tokens: int = 4096
    timeout_s: float = 300.0
    n: int = 1
    max_retries: int = 2
    seed: bool = True

    def __post_init__(self) -> None:
        if not self.base_url or not self.model:
            raise LLMConfigError("no LLM endpoint: set GEMMRL_LLM_BASE_URL (e.g. http://localhost:8000/v1 for a "
                                 "local vLLM) and GEMMRL_LLM_MODEL, or pass the base URL and model explicitly")
        if self.n < 1 or self.max_tokens < 1 or self.timeout_s <= 0:
            raise LLMConfigError(f"n={self.n}, max_tokens={self.max_tokens}, timeout_s={self.timeout_s}: all must "
                                 "be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "LLMConfig":
        """From ``GEMMRL_LLM_BASE_URL`` / ``_MODEL`` / ``_API_KEY`` (falling back to ``OPENAI_BASE_URL`` and
        ``OPENAI_API_KEY``), ``GEMMRL_LLM_TEMPERATURE`` / ``_MAX_TOKENS`` / ``_TIMEOUT_S`` / ``_N``; ``overrides``
        (CLI options) win where not None."""
        env = os.environ if env is None else env
        kw: dict[str, Any] = {
            "base_url": env.get("GEMMRL_LLM_BASE_URL") or env.get("OPENAI_BASE_URL") or "",
            "model": env.get("GEMMRL_LLM_MODEL") or "",
            "api_key": env.get("GEMMRL_LLM_API_KEY") or env.get("OPENAI_API_KEY") or "EMPTY",
        }
        for name, conv in (("temperature", float), ("max_tokens", int), ("timeout_s", float), ("n", int)):
            text = env.get(f"GEMMRL_LLM_{name.upper()}")
            if text:
                try:
                    kw[name] = conv(text)
                except ValueError:
                    raise LLMConfigError(f"GEMMRL_LLM_{name.upper()}={text!r} is not a {conv.__name__}") from None
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


# ---------------------------------------------------------------------------------------------------------
# the prompt
# ---------------------------------------------------------------------------------------------------------
SYSTEM = """You write fast, correct half-precision GEMM kernels for NVIDIA GPUs: C = A @ B with A [M,K] \
row-major and C [M,N] row-major. B is given both as b [K,N] row-major (layout nn) and as bt [N,K] row-major \
(layout tn, B^T); your kernel declares which one it reads. Every kernel is compiled, checked against an fp64 \
reference (random inputs, exact small integers, C pre-filled with NaN: every element must be written, nothing \
else; all work on the current stream), then timed against cuBLAS/cuBLASLt. The reward is \
log(t_vendor_best / t_yours); a wrong, cheating or unbuildable kernel earns nothing.

Answer with exactly one fenced block, in one of these formats:

1. A Triton config of gemmrl's Triton GEMM family:
```json
{"family": "triton", "config": "tiled(BM=128,BN=128,BK=64,warps=8,stages=4,group_m=8)", "layout": "tn"}
```
(variants: tiled, persistent, splitk, smallm; their fields are those shown in the examples; smallm with \
mma=False is a GEMV on the CUDA cores for M <= 8)

2. A Triton kernel, with a `def gemm(a, b, c)` entry that launches it (b is bt [N,K] for layout tn) and the \
shapes it handles on its first line (ranges M=lo..hi, divisibility N%8; `shapes=any` for all):
```python
# gemmrl: layout=nn shapes=M=1..4096,N%8,K%8
import triton
import triton.language as tl
...
def gemm(a, b, c):
    ...
```

3. A CUDA C++ kernel in gemmrl's ABI (ldb = N for nn, K for tn; return 0 on success, else the cudaError_t):
```cuda
// gemmrl: entry=my_gemm layout=tn shapes=M%64,N%128,K%64
extern "C" int my_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream) { ... }
```
The declared shapes must include the problem's shape."""


def _clip(text: str, limit: int = MAX_CODE_CHARS) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def kernel_text(spec: CandidateSpec) -> str:
    """How a candidate is shown to the model: a Triton config in its JSON answer form, source in a fenced block
    with its declaration line."""
    p = spec.payload
    lang = LANGUAGES.get(spec.family)
    if lang == "json":
        return "```json\n" + json.dumps({"family": spec.family, "config": str(p), "layout": spec.layout}) + "\n```"
    code = getattr(p, "code", None)
    if code is None:
        return f"{spec.family}: {_clip(p, 400)}"
    head = (f"// gemmrl: entry={p.entry} layout={p.layout} shapes={p.shapes}" if lang == "cuda"
            else f"# gemmrl: layout={p.layout} shapes={p.shapes}")
    if not any(_DECL.match(line) for line in code.splitlines()):  # keep line numbers when it has its own
        code = f"{head}\n{code}"
    return f"```{lang}\n{_clip(code.rstrip())}\n```"


def _speedups(o: Outcome) -> str:
    per = ", ".join(f"{k} x{v:.3f}" for k, v in sorted(o.speedup.items()))
    head = f"x{math.exp(o.reward):.3f} over vendor_best" if math.isfinite(o.reward) else "speedup not measured"
    return f"{head}" + (f" ({per})" if per else "")


def _failure_text(o: Outcome, code: bool) -> str:
    err = (o.build or {}).get("error") or {}
    spec = o.proposal.spec
    short = LANGUAGES.get(spec.family) == "json"  # a config is shown whole: it is one line
    lines = [f"- {o.verdict}: " + (kernel_text(spec) if code or short else spec.label())]
    if err:
        where = f"{err.get('file') or '?'}:{err['line']}: " if err.get("line") else ""
        lines.append(f"  {err.get('stage', 'build')} error at {where}{err.get('message', '')}")
        if err.get("log_head"):
            lines.append("  log: " + _clip(err["log_head"].rstrip(), 600).replace("\n", "\n       "))
    elif o.reason:
        lines.append(f"  reason: {_clip(o.reason, 400)}")
    return "\n".join(lines)


def _profile_text(profile: Mapping[str, Any], limit: int = 16) -> str:
    items = list(profile.items())[:limit]
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in items)


def build_prompt(ctx: Context, notes: Sequence[str] = (), examples: int = 2, history: int = 6) -> list[dict]:
    """Chat messages (system + user) asking for one kernel for ``ctx.problem``. ``notes``: extra lines for the
    model (the proposer passes why its last answers could not be read); ``examples``: best and worst verified
    kernels of the nearest shapes shown each; ``history``: how many of this shape's last outcomes are shown."""
    p, hw = ctx.problem, ctx.hardware
    parts = [f"Problem: M={p.M} N={p.N} K={p.K} (mnk {p.mnk}), dtype {p.dtype}, accumulate in {p.acc}, "
             f"the caller holds B as layout {p.layout} (both b and bt are supplied; pick either).",
             f"GPU: {hw.name}, compute capability {hw.cc}, {hw.sms} SMs, {hw.smem_per_block_kib} KiB shared memory "
             f"per block, {hw.l2_mib} MiB L2, SM clock {hw.sm_clock_mhz} MHz, memory clock {hw.mem_clock_mhz} MHz, "
             f"HBM {hw.hbm_gbs:.0f} GB/s."]
    done = sorted((o for o in ctx.neighbours if o.ok), key=lambda o: -o.reward)
    if done:
        best = done[:examples]
        worst = [o for o in done[::-1][:examples] if o not in best]
        parts.append("Fastest verified kernels at the nearest shapes (learn from what makes them fast):")
        parts += [f"* {o.problem.mnk} {o.problem.dtype}: {_speedups(o)}\n{kernel_text(o.proposal.spec)}" for o in best]
        if worst:
            parts.append("Slowest verified kernels at the nearest shapes (avoid what makes them slow):")
            parts += [f"* {o.problem.mnk} {o.problem.dtype}: {_speedups(o)}\n{kernel_text(o.proposal.spec)}"
                      for o in worst]
    own = list(ctx.own)[-history:]
    bad = [o for o in own if o.verdict != "ok"]
    if bad:
        parts.append("Your last failed attempts at this shape (fix these problems):")
        last_src = max((i for i, o in enumerate(bad) if hasattr(o.proposal.spec.payload, "code")), default=-1)
        parts += [_failure_text(o, code=i == last_src) for i, o in enumerate(bad)]  # source: the last one's only
    good = [o for o in own if o.verdict == "ok"]
    if good:
        parts.append("Verified at this shape already (do not repeat them; beat the best):")
        for o in good:
            prof = _profile_text(o.profile) if o.profile else ""
            parts.append(f"- {_speedups(o)}" + (f", profile: {prof}" if prof else "") + f"\n{kernel_text(o.proposal.spec)}")
    if notes:
        parts.append("Notes on your previous answers:\n" + "\n".join(f"- {n}" for n in notes))
    parts.append(f"Write one kernel for {p.mnk} that beats the vendor libraries. Answer with exactly one fenced "
                 "block in one of the three formats.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.S)
_DECL = re.compile(r"^\s*(?:#|//)\s*gemmrl:\s*(.*)$")
FORMATS = ('a ```json block {"family": "triton", "config": "tiled(...)", "layout": "tn"}, a ```python block '
           'starting "# gemmrl: layout=nn shapes=..." with def gemm(a, b, c), or a ```cuda block starting '
           '"// gemmrl: entry=<name> layout=tn shapes=..."')


def _blocks(text: str) -> list[tuple[str, str]]:
    out = []
    for lang, body in _FENCE.findall(text):
        kind = ANSWER_LANGS.get(lang.lower())
        if kind is None and not lang:
            kind = ("json" if body.lstrip().startswith("{") else "python" if "@triton.jit" in body else
                    "cuda" if 'extern "C"' in body or "__global__" in body else None)
        if kind:
            out.append((kind, body))
    return out


def _declaration(code: str, comment: str) -> dict[str, str]:
    for line in code.splitlines():
        m = _DECL.match(line)
        if m and line.lstrip().startswith(comment):
            out = {}
            for tok in m.group(1).split():
                k, eq, v = tok.partition("=")
                if not eq:
                    raise ExtractError(f"declaration token {tok!r} is not key=value; write e.g. "
                                       f"{comment} gemmrl: layout=nn shapes=M=1..4096,N%8")
                out[k.strip().lower()] = v.strip()
            return out
    raise ExtractError(f"no declaration line: start the block with {comment} gemmrl: layout=<nn|tn> shapes=<range> "
                       "(e.g. shapes=M=1..4096,N%8,K%8 or shapes=any)")


def _shapes(decl: Mapping[str, str], problem: GemmProblem):
    if "shapes" not in decl:
        raise ExtractError("the declaration has no shapes=...: declare the shapes the kernel handles, e.g. "
                           "shapes=M=1..4096,N%8,K%8 or shapes=any")
    try:
        sr = ShapeRange.parse(decl["shapes"])
    except CudaSourceError as e:
        raise ExtractError(f"declared shapes: {e}") from None
    if not sr.admits(problem.M, problem.N, problem.K):
        raise ExtractError(f"the declared shapes {sr} do not include the problem {problem.mnk}; declare a range "
                           "that does (and make the kernel handle it)")
    return sr


def _layout(v: str, problem: GemmProblem) -> str:
    v = (v or problem.layout).strip().lower()
    if v not in ("nn", "tn"):
        raise ExtractError(f"layout {v!r}: use nn (reads b [K,N]) or tn (reads bt [N,K])")
    return v


def _triton_config(body: str, problem: GemmProblem) -> CandidateSpec:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ExtractError(f"the json block does not parse ({e}); write {FORMATS}") from None
    if not isinstance(obj, dict):
        raise ExtractError(f"the json block is a {type(obj).__name__}, not an object; write {FORMATS}")
    fam = obj.get("family", "triton")
    if fam != "triton":
        raise ExtractError(f"unknown family {fam!r} in the json answer: a json answer is a Triton config "
                           '{"family": "triton", ...}; for your own kernel use a ```python (Triton) or ```cuda block')
    text = obj.get("config")
    if not isinstance(text, str) or not text.strip():
        raise ExtractError('the json answer has no "config" string, e.g. '
                           '"tiled(BM=128,BN=128,BK=64,warps=8,stages=4,group_m=8)"')
    layout = _layout(str(obj.get("layout", "")), problem)
    try:
        cfg = parse_config(text)
        ok, why = valid(cfg, problem.with_(layout=layout), H100)
    except (ValueError, TypeError) as e:
        raise ExtractError(f"Triton config {text!r}: {e}") from None
    if not ok:
        raise ExtractError(f"Triton config {cfg} is invalid for {problem.mnk} {layout} on the H100: {why}")
    return CandidateSpec("triton", str(cfg), layout=layout)


def _triton_source(body: str, problem: GemmProblem) -> CandidateSpec:
    decl = _declaration(body, "#")
    try:
        src = TritonSource(body, entry=decl.get("entry", "gemm"), layout=_layout(decl.get("layout", ""), problem),
                           shapes=_shapes(decl, problem), dtype=problem.dtype, acc=problem.acc)
    except TritonSourceError as e:
        raise ExtractError(f"python block: {e}") from None
    return CandidateSpec("triton_source", src, layout=src.layout)


def _cuda_source(body: str, problem: GemmProblem) -> CandidateSpec:
    decl = _declaration(body, "//")
    if "entry" not in decl:
        raise ExtractError('the declaration has no entry=<name>: name the extern "C" function, e.g. '
                           "// gemmrl: entry=my_gemm layout=tn shapes=any")
    try:
        src = CudaSource(body, entry=decl["entry"], layout=_layout(decl.get("layout", ""), problem),
                         shapes=_shapes(decl, problem), dtype=problem.dtype, acc=problem.acc,
                         name=f"cuda:llm-{hashlib.sha256(body.encode()).hexdigest()[:16]}")
    except CudaSourceError as e:
        raise ExtractError(f"cuda block: {e}") from None
    return CandidateSpec("cuda", src, layout=src.layout)


def extract(completion: str, problem: GemmProblem) -> CandidateSpec:
    """The candidate a completion answers with (its last fenced block in a known format), validated against
    ``problem``; raises :class:`ExtractError` saying what was wrong and what to write instead."""
    text = completion or ""
    if not text.strip():
        raise ExtractError(f"empty answer; write {FORMATS}")
    blocks = _blocks(text)
    if not blocks:
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            blocks = [("json", stripped)]
        elif text.count("```") % 2:
            raise ExtractError("a fenced block is not closed (answer cut off? keep it shorter or raise max_tokens); "
                               f"write {FORMATS}")
        else:
            raise ExtractError(f"no fenced ```json, ```python or ```cuda block found; write {FORMATS}")
    kind, body = blocks[-1]
    return READERS[kind](body, problem)


# the answer forms: a fenced block's language -> the reader of its body, and each family's language when shown
READERS = {"json": _triton_config, "python": _triton_source, "cuda": _cuda_source}
LANGUAGES = {"triton": "json", "triton_source": "python", "cuda": "cuda"}


# ---------------------------------------------------------------------------------------------------------
# the proposer
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rejected:
    """A completion the loop never sees: unreadable (``extract``) or a repeat of a tried candidate (``duplicate``)."""

    problem: GemmProblem
    prompt: tuple
    completion: str
    reason: str
    verdict: str = "extract"


def default_log_path() -> Path:
    return cache_dir("llm") / "trajectories.jsonl"


def _json_num(x: Any) -> Any:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class LLMProposer:
    """Proposals from an OpenAI-compatible chat endpoint; every completion goes to ``log_path`` (JSONL, TRL's
    conversational prompt/completion format). ``client``: an ``openai.OpenAI``-like object (default: made from
    ``config``). Completions that cannot be read are logged at once (verdict ``extract``, ``FAIL_REWARD``) and
    kept in ``rejected`` for the loop to record; the reason goes into this shape's next prompt."""

    name = "llm"

    def __init__(self, config: LLMConfig, log_path: str | os.PathLike | None = None, client: Any = None,
                 notes_kept: int = 3):
        self.config = config
        self.log_path = Path(log_path) if log_path is not None else default_log_path()
        self._client = client
        self.rejected: list[Rejected] = []
        self._asked: dict[str, tuple[list[dict], str]] = {}  # Proposal.info -> (prompt, completion)
        self._notes: dict[GemmProblem, list[str]] = {}
        self._notes_kept = notes_kept
        self._ids = itertools.count()
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import openai  # optional dependency (gemmrl[llm])
            except ImportError:
                raise LLMConfigError("the LLM proposer needs the openai client: pip install 'gemmrl[llm]'") from None
            self._client = openai.OpenAI(base_url=self.config.base_url, api_key=self.config.api_key,
                                         timeout=self.config.timeout_s, max_retries=self.config.max_retries)
        return self._client

    def complete(self, messages: list[dict], n: int = 1, seed: int | None = None) -> list[str]:
        """``n`` completions of ``messages`` (one request). An endpoint that refuses the request (bad URL, model
        or key) raises :class:`LLMConfigError`; other API errors propagate."""
        import openai  # optional dependency (gemmrl[llm])

        kw: dict[str, Any] = {"model": self.config.model, "messages": messages, "temperature": self.config.temperature,
                              "max_tokens": self.config.max_tokens}
        if n > 1:
            kw["n"] = n
        if seed is not None and self.config.seed:
            kw["seed"] = seed
        try:
            resp = self.client.chat.completions.create(**kw)
        except openai.APIStatusError as e:
            if e.status_code in (400, 401, 403, 404):
                raise LLMConfigError(f"{self.config.base_url} refused the request ({e.status_code}: {e.message}); "
                                     "check GEMMRL_LLM_BASE_URL (it usually ends in /v1), GEMMRL_LLM_MODEL and "
                                     "GEMMRL_LLM_API_KEY") from None
            raise
        return [(c.message.content or "") for c in resp.choices][:n]

    def propose(self, ctx: Context, k: int, rng: Any) -> list[Proposal]:
        """Up to ``k`` proposals, one completion each (``config.n`` per request); transient endpoint errors
        (timeouts, 5xx, rate limits after the client's retries) end the round early with a warning."""
        import openai  # optional dependency (gemmrl[llm])

        messages = build_prompt(ctx, self._notes.get(ctx.problem, ()))
        tried = ctx.tried()
        out: list[Proposal] = []
        asked = 0
        while asked < k:
            n = min(self.config.n, k - asked)
            seed = rng.randrange(2 ** 31) if hasattr(rng, "randrange") else None
            try:
                texts = self.complete(messages, n, seed)
            except (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                    openai.InternalServerError) as e:
                warnings.warn(f"LLM endpoint {self.config.base_url}: {type(e).__name__}: {e}; proposing "
                              f"{len(out)} of {k} for {ctx.problem.mnk}", RuntimeWarning, stacklevel=2)
                break
            asked += n
            for text in texts:
                try:
                    spec = extract(text, ctx.problem)
                except ExtractError as e:
                    self._reject(ctx.problem, messages, text, str(e), "extract")
                    continue
                prop = Proposal(spec, self.name, f"llm-{os.getpid()}-{next(self._ids)}")
                if prop.key in tried:
                    self._reject(ctx.problem, messages, text, f"duplicate: {spec.label()} was already tried at "
                                                              f"{ctx.problem.mnk}", "duplicate")
                    continue
                tried.add(prop.key)
                with self._lock:
                    self._asked[prop.info] = (messages, text)
                out.append(prop)
        return out

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        """Log each outcome of this proposer's proposals as one JSONL line (others are ignored)."""
        for o in outcomes:
            with self._lock:
                got = self._asked.pop(o.proposal.info, None)
            if got is None:
                continue
            messages, text = got
            self.log(o.problem, messages, text, training_reward(o.verdict, o.reward), o.verdict, o.reason,
                     speedup=o.speedup, measured_reward=o.reward, candidate=o.proposal.spec.label())

    def _reject(self, problem: GemmProblem, messages: list[dict], text: str, reason: str, verdict: str) -> None:
        with self._lock:
            self.rejected.append(Rejected(problem, tuple(messages), text, reason, verdict))
            notes = self._notes.setdefault(problem, [])
            notes.append(f"an answer was not used ({verdict}): {reason}")
            del notes[:-self._notes_kept]
        self.log(problem, messages, text, FAIL_REWARD, verdict, reason)

    def log(self, problem: GemmProblem, messages: list[dict], completion: str, reward: float, verdict: str,
            reason: str, **extra: Any) -> None:
        """Append one line: TRL's conversational prompt/completion format plus the verdict and the problem."""
        rec = {"prompt": list(messages), "completion": [{"role": "assistant", "content": completion}],
               "reward": float(reward) if math.isfinite(reward) else FAIL_REWARD, "verdict": verdict,
               "reason": reason[:2000], "mnk": problem.mnk, "dtype": problem.dtype, "acc": problem.acc,
               "layout": problem.layout, "model": self.config.model,
               "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if "speedup" in extra:
            extra["speedup"] = {k: _json_num(v) for k, v in extra["speedup"].items()}
        if "measured_reward" in extra:
            extra["measured_reward"] = _json_num(extra["measured_reward"])
        line = json.dumps({**rec, **extra}, allow_nan=False)
        with self._lock:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")


__all__ = ["LLMConfig", "LLMConfigError", "LLMProposer", "ExtractError", "Rejected", "build_prompt", "extract",
           "kernel_text"]
