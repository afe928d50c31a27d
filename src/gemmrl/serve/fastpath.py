"""The compiled hot paths of ``gemmrl.mm``: built on first use, loaded as extension modules.

Two builds of the same lookup, checks and launch (the spec runner they share is csrc/fastpath_spec.h):
- ``torch`` (csrc/fastpath_torch.cpp): built with the C++ compiler against the installed torch's headers and
  libraries; reads the operands' metadata from their at::Tensor (a few ns each). Keyed by torch's version and git
  revision, since the TensorImpl layout it reads is that torch's. About 20 s to build, once per torch install.
- ``c`` (csrc/fastpath.c): CPython API only, reads the metadata through ~18 Python attribute calls (~2 us). Used
  where the torch build cannot be made (no C++ compiler, no torch headers).

Each is built with the compiler Python was built with (``$CC``/``$CXX``, else cc/gcc, c++/g++) into
``cache_dir("build", "fastpath-<key>")``, keyed by the sources, the interpreter's ABI tag and the compiler;
later processes load the cached module (a few ms). ``GEMMRL_FASTPATH`` picks: ``auto`` (default: torch, else c),
``torch``, ``c``, or ``0`` (neither: dispatch.py keeps its pure-Python hot path, which does the same lookups and
checks). ``load()`` returns None, with the reason in ``why()``, where nothing could be loaded.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

import torch

from ..paths import cache_dir

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "fastpath.c"
TORCH_SOURCE = CSRC / "fastpath_torch.cpp"
SPEC_HEADER = CSRC / "fastpath_spec.h"
NAMES = {"c": "_gemmrl_fastpath", "torch": "_gemmrl_fastpath_torch"}
NAME = NAMES["c"]
CHOICES = ("auto", "torch", "c", "0")
_lock = threading.Lock()
_state: dict = {}


def _which(*names: str) -> str | None:
    for c in names:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def _compiler() -> str | None:
    return _which(os.environ.get("CC", ""), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang")


def _cxx_compiler() -> str | None:
    return _which(os.environ.get("CXX", ""), (sysconfig.get_config_var("CXX") or "").split(" ")[0], "c++", "g++",
                  "clang++")


def _python_include() -> str:
    include = sysconfig.get_paths().get("include", "")
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h under {include!r} (install the Python development headers)")
    return include


def _compile(kind: str, cmd_for, key_parts: list[bytes | str], force: bool) -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    h = hashlib.sha256()
    for part in key_parts + [f"{sys.version}|{suffix}"]:
        h.update(part if isinstance(part, bytes) else part.encode())
    out = cache_dir("build", f"fastpath-{kind}-{h.hexdigest()[:16]}") / f"{NAMES[kind]}{suffix}"
    if out.exists() and not force:
        return out
    # said once, where it happens: the first call of a new install waits for this (gemmrl warmup does it ahead)
    print(f"gemmrl: building gemmrl.mm's compiled hot path ({kind}) for this {'torch' if kind == 'torch' else 'Python'},"
          f" once per install ({'~20 s' if kind == 'torch' else 'a few s'}) into {out.parent}", file=sys.stderr, flush=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = cmd_for(str(tmp))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{' '.join(cmd)}: {e}") from None
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(r.stderr or r.stdout)[-2000:]}")
    os.replace(tmp, out)  # atomic: a concurrent process sees the old file or the whole new one
    return out


def build(force: bool = False) -> Path:
    """Compile fastpath.c for this interpreter; returns the extension's path. Raises RuntimeError saying why not."""
    include = _python_include()
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install gcc/clang)")
    srcs = [SOURCE.read_bytes(), SPEC_HEADER.read_bytes(), cc]
    return _compile("c", lambda o: [cc, "-O2", "-shared", "-fPIC", "-fstack-protector-strong", "-std=c11", "-Wall",
                                    f"-I{include}", str(SOURCE), "-o", o], srcs, force)


def build_torch(force: bool = False) -> Path:
    """Compile fastpath_torch.cpp against the installed torch; returns the extension's path. Raises RuntimeError
    saying why not."""
    include = _python_include()
    cxx = _cxx_compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set CXX, or install g++/clang++)")
    root = Path(torch.__file__).parent
    tinc, tlib = root / "include", root / "lib"
    if not (tinc / "ATen" / "core" / "Tensor.h").exists():
        raise RuntimeError(f"no torch headers under {tinc} (this torch install has no include/)")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    parts = [TORCH_SOURCE.read_bytes(), SPEC_HEADER.read_bytes(), cxx, torch.__version__,
             str(getattr(torch.version, "git_version", "")), str(abi)]

    def cmd(o: str) -> list[str]:
        return [cxx, "-O2", "-shared", "-fPIC", "-fstack-protector-strong", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
                f"-I{include}", f"-I{tinc}", f"-I{tinc / 'torch' / 'csrc' / 'api' / 'include'}", str(TORCH_SOURCE),
                "-o", o, f"-L{tlib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl", f"-Wl,-rpath,{tlib}"]

    return _compile("torch", cmd, parts, force)


def _load_module(kind: str, path: Path) -> ModuleType:
    name = NAMES[kind]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def choice() -> str:
    """``GEMMRL_FASTPATH``, checked: auto | torch | c | 0."""
    v = os.environ.get("GEMMRL_FASTPATH", "auto").strip().lower() or "auto"
    v = "auto" if v == "1" else v
    if v not in CHOICES:
        raise ValueError(f"GEMMRL_FASTPATH={v!r}: use one of {', '.join(CHOICES)} (auto: torch, else c)")
    return v


def load_kind(kind: str) -> ModuleType | None:
    """The ``kind`` ('torch' or 'c') hot path module, or None (see ``why(kind)``); tried once per process."""
    if kind not in NAMES:
        raise ValueError(f"unknown hot path {kind!r}: 'torch' or 'c'")
    if kind in _state:
        return _state[kind][0]
    with _lock:
        if kind not in _state:
            try:
                mod, why = _load_module(kind, build_torch() if kind == "torch" else build()), ""
            except Exception as e:  # noqa: BLE001 - any failure leaves the next hot path in place
                mod, why = None, f"{type(e).__name__}: {e}"
            _state[kind] = (mod, why)
    return _state[kind][0]


def load() -> ModuleType | None:
    """The hot path ``GEMMRL_FASTPATH`` asks for (auto: torch, else c), or None (see ``why()``)."""
    if "mod" in _state:
        return _state["mod"]
    try:
        want = choice()
    except ValueError as e:
        _state["mod"], _state["why"] = None, str(e)
        return None
    if want == "0":
        _state["mod"], _state["why"] = None, "GEMMRL_FASTPATH=0"
        return None
    mod, whys = None, []
    for kind in (("torch", "c") if want == "auto" else (want,)):
        mod = load_kind(kind)
        if mod is not None:
            break
        whys.append(f"{kind}: {why(kind)}")
    _state["mod"], _state["why"] = mod, "; ".join(whys) if mod is None else ""
    return mod


def kind_of(mod: ModuleType | None) -> str:
    """'torch', 'c' or '' for a module ``load()`` returned."""
    return next((k for k, n in NAMES.items() if mod is not None and mod.__name__ == n), "")


def why(kind: str | None = None) -> str:
    """Why ``load()`` (or ``load_kind(kind)``) returned None ('' when it loaded, or before it was tried)."""
    if kind is not None:
        return _state.get(kind, (None, ""))[1]
    return _state.get("why", "")
