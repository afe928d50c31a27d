"""The C hot path of ``gemmrl.mm`` (csrc/fastpath.c): built on first use, loaded as an extension module.

Built with the C compiler Python was built with (``$CC``, else ``cc``/``gcc``) against this interpreter's headers
into ``cache_dir("build", "fastpath-<key>")``, keyed by the source, the interpreter's ABI tag and the compiler;
later processes load the cached module (a few ms). ``load()`` returns None, with the reason in ``why()``, where
that cannot be done (no compiler, no Python.h, ``GEMMRL_FASTPATH=0``): dispatch.py then keeps its pure-Python
hot path, which does the same lookups and checks.
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

from .paths import cache_dir

SOURCE = Path(__file__).with_name("csrc") / "fastpath.c"
NAME = "_gemmrl_fastpath"
_lock = threading.Lock()
_state: dict = {}


def _compiler() -> str | None:
    for c in (os.environ.get("CC", ""), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def build(force: bool = False) -> Path:
    """Compile fastpath.c for this interpreter; returns the extension's path. Raises RuntimeError saying why not."""
    include = sysconfig.get_paths().get("include", "")
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h under {include!r} (install the Python development headers)")
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install gcc/clang)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    src = SOURCE.read_bytes()
    key = hashlib.sha256(src + f"{sys.version}|{suffix}|{cc}".encode()).hexdigest()[:16]
    out = cache_dir("build", f"fastpath-{key}") / f"{NAME}{suffix}"
    if out.exists() and not force:
        return out
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [cc, "-O2", "-shared", "-fPIC", "-std=c11", "-Wall", f"-I{include}", str(SOURCE), "-o", str(tmp)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{' '.join(cmd)}: {e}") from None
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(r.stderr or r.stdout)[-2000:]}")
    os.replace(tmp, out)  # atomic: a concurrent process sees the old file or the whole new one
    return out


def load() -> ModuleType | None:
    """The built extension module, or None (see ``why()``); tried once per process."""
    if "mod" in _state:
        return _state["mod"]
    with _lock:
        if "mod" in _state:
            return _state["mod"]
        mod, why = None, ""
        if os.environ.get("GEMMRL_FASTPATH", "1") == "0":
            why = "GEMMRL_FASTPATH=0"
        else:
            try:
                path = build()
                loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
                spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
                mod = importlib.util.module_from_spec(spec)
                loader.exec_module(mod)
            except Exception as e:  # noqa: BLE001 - any failure leaves the Python hot path in place
                mod, why = None, f"{type(e).__name__}: {e}"
        _state["mod"], _state["why"] = mod, why
        return mod


def why() -> str:
    """Why ``load()`` returned None ('' when it loaded, or before it was tried)."""
    return _state.get("why", "")
