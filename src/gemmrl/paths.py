"""Where gemmrl keeps what it builds and learns: one cache root, overridable with GEMMRL_CACHE_DIR."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$GEMMRL_CACHE_DIR`` or ``$XDG_CACHE_HOME/gemmrl`` (``~/.cache/gemmrl``), joined with ``parts``
    and created on demand."""
    root = os.environ.get("GEMMRL_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "gemmrl")
    p = Path(root).joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_json_atomic(path: Path, obj) -> bool:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename (a reader never sees half a file);
    False (nothing written, nothing raised) where it cannot be written."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
