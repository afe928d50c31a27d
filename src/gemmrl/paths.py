"""Where gemmrl keeps what it builds and learns: one cache root, overridable with GEMMRL_CACHE_DIR."""

from __future__ import annotations

import os
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
