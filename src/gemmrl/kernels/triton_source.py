"""Triton kernels written as source text (by an LLM proposer, or by hand): declare, load, call.

A candidate is a :class:`TritonSource`: Python source holding one or more ``@triton.jit`` kernels and an
``entry`` function that launches them, the layout of B it reads, and the shapes it declares it handles
(:class:`~gemmrl.kernels.cuda_source.ShapeRange`). Nothing serves a shape outside its declaration.

The entry is called as ``entry(a, b_or_bt, c)``: ``a`` [M,K] row-major; for layout ``nn`` the second argument
is ``b`` [K,N] row-major, for ``tn`` it is ``bt`` [N,K] row-major (B^T); ``c`` [M,N] row-major is the output,
owned by the harness and pre-filled with NaN. It must write every element of ``c`` and launch on torch's
current stream. :func:`load_candidate` wraps it in the calling convention of ``gemmrl/candidate.py``.

Loading writes the code to a file (Triton's ``@jit`` reads its kernels' source from their file) under
``cache_dir("build", "triton_source", <hash>)`` -- or a temporary dir where that is not writable, as in a
sandbox worker -- and imports it as a module: the code runs in this process, so untrusted source belongs in a
sandbox worker (``search.executor.SandboxExecutor``). A syntax error, an import-time exception or a missing
entry comes back as a structured record ``{"ok": False, "error": {"stage": "load", "file", "line",
"message", "log_head"}}`` (the shape of ``cuda_source.BuildError`` records), never raised. With no CUDA
device (or ``TRITON_INTERPRET=1``) the kernels are decorated under the Triton interpreter and run on CPU
tensors.

Tests: ``pytest tests/search/test_llm.py -k triton_source`` (Triton interpreter, CPU). Nothing runs at import time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import cache_dir
from .cuda_source import DeclaredSource, ShapeRange

CANDIDATE_FILE = "<candidate>"  # what error records call the candidate's own source, as cuda_source does


class TritonSourceError(ValueError):
    """A malformed declaration (not a load failure: those come back as records from :func:`load_candidate`)."""


@dataclass(frozen=True)
class TritonSource(DeclaredSource):
    """One Triton candidate's source and declaration. ``name`` defaults to ``triton_source:<hash>``."""

    code: str
    entry: str = "gemm"
    layout: str = "nn"
    shapes: ShapeRange = ShapeRange()
    dtype: str = "fp16"
    acc: str = "fp32"
    name: str = ""

    def __post_init__(self) -> None:
        if self.layout not in ("tn", "nn"):
            raise TritonSourceError(f"layout {self.layout!r}: use nn (entry reads b [K,N]) or tn (reads bt [N,K])")
        if not re.fullmatch(r"[A-Za-z_]\w*", self.entry):
            raise TritonSourceError(f"entry {self.entry!r} is not a Python identifier")
        if not self.code.strip():
            raise TritonSourceError("empty source")
        if not self.name:
            object.__setattr__(self, "name", f"triton_source:{self.source_hash}")


@dataclass
class TritonSourceCandidate:
    """A loaded :class:`TritonSource`, called as ``cand(a, b, bt, c)`` (``candidate.py``'s convention)."""

    src: TritonSource
    fn: Any
    path: str
    name: str = ""
    layout: str = field(init=False)
    acc: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.src.name
        self.layout, self.acc = self.src.layout, self.src.acc

    def prepare(self, problem, bufs, protocol, timer) -> None:
        return None

    def __call__(self, a, b, bt, c) -> Any:
        return self.fn(a, b if self.layout == "nn" else bt, c)  # the battery checks what comes back (aliases)

    def info(self) -> dict[str, Any]:
        return {"source_hash": self.src.source_hash, "entry": self.src.entry, "shapes": str(self.src.shapes),
                "file": self.path}


_LOADED: dict[tuple[str, str], Any] = {}  # (hash, interpret) -> module; successes only
_LOCK = threading.Lock()


def _source_dir(h: str) -> Path:
    """Where the code is written: the build cache, else a temp dir (a sandbox worker may write only there)."""
    try:
        d = cache_dir("build", "triton_source", h)
        probe = d / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        return d
    except OSError:
        d = Path(tempfile.gettempdir()) / "gemmrl-triton-source" / h
        d.mkdir(parents=True, exist_ok=True)
        return d


def _write(d: Path, src: TritonSource) -> Path:
    path = d / f"candidate_{src.source_hash}.py"
    if not path.is_file() or path.read_text() != src.code:
        tmp = d / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_text(src.code)
        os.replace(tmp, path)
    return path


def _interpret() -> bool:
    """Decorate under the Triton interpreter: asked for (TRITON_INTERPRET) or no CUDA device to compile for."""
    try:
        import triton  # optional dependency (the triton extra), loaded on first use

        if triton.knobs.runtime.interpret:
            return True
    except (ImportError, AttributeError):
        return False
    try:
        import torch  # start-up cost: torch loads on first use, not on import

        return not torch.cuda.is_available()
    except ImportError:
        return True


def _error(message: str, path: Path, line: int | None = None, log: str = "", file: str | None = None) -> dict:
    log = log.replace(str(path), CANDIDATE_FILE)  # the scratch path means nothing to whoever reads the record
    return {"ok": False, "error": {"stage": "load", "file": file or CANDIDATE_FILE, "line": line,
                                   "message": message.replace(str(path), CANDIDATE_FILE)[:400],
                                   "log_head": log[-2000:]},
            "file": str(path)}


def _where(exc: BaseException, path: Path) -> tuple[str | None, int | None]:
    """(file, line) of the innermost traceback frame in the candidate's file, else the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if Path(f.filename) == path]
    if mine:
        return CANDIDATE_FILE, mine[-1].lineno
    return (frames[-1].filename, frames[-1].lineno) if frames else (None, None)


def _import(src: TritonSource, path: Path, interpret: bool) -> Any:
    modname = f"gemmrl_triton_source_{src.source_hash}_{'i' if interpret else 'c'}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[modname] = mod  # dataclasses and Triton look modules up by name
    try:
        if interpret:
            import triton  # optional dependency (the triton extra), loaded on first use

            with triton.knobs.runtime.scope():
                triton.knobs.runtime.interpret = True
                spec.loader.exec_module(mod)  # type: ignore[union-attr]
        else:
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return mod


def load_candidate(src: TritonSource) -> tuple[Any, dict[str, Any]]:
    """``(candidate, build record)``; candidate is None when the code did not load, and the record then says
    why (``error``: stage ``load``, file -- ``<candidate>`` for its own source --, line, message)."""
    t0 = time.perf_counter()
    path = _write(_source_dir(src.source_hash), src)
    interpret = _interpret()
    key = (src.source_hash, str(interpret))
    with _LOCK:
        mod = _LOADED.get(key)
        cached = mod is not None
        if mod is None:
            try:
                compile(src.code, str(path), "exec")
            except SyntaxError as e:
                return None, _error(f"SyntaxError: {e.msg}", path, e.lineno,
                                    "".join(traceback.format_exception_only(type(e), e)))
            try:
                mod = _import(src, path, interpret)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - anything the code raised at import is the verdict
                file, line = _where(e, path)
                return None, _error(f"{type(e).__name__} while importing: {e}", path, line,
                                    traceback.format_exc(), file)
            _LOADED[key] = mod
    fn = getattr(mod, src.entry, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == mod.__name__)
        return None, _error(f"no function {src.entry!r} in the source (defined: {', '.join(defined) or 'none'}); "
                            f"define def {src.entry}(a, {'b' if src.layout == 'nn' else 'bt'}, c) that launches "
                            "the kernel", path)
    record = {"ok": True, "source_hash": src.source_hash, "file": str(path), "interpret": interpret, "cached": cached,
              "seconds": time.perf_counter() - t0}
    return TritonSourceCandidate(src, fn, str(path)), record


__all__ = ["TritonSource", "TritonSourceCandidate", "TritonSourceError", "load_candidate", "ShapeRange"]
