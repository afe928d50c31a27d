"""What a ``gemmrl select`` run picked, per shape and protocol, for the families re-measured by name
(``gemmrl bench --cutlass-from / --wgmma-from / --tiny-from``): one reader, so the families agree on it."""

from __future__ import annotations


def load_selection(paths, prefix: str) -> dict[str, dict[str, str]]:
    """Per shape and protocol, the config (the row's ``algo``, else its name after ``prefix``) of the fastest
    verified ``<prefix>*`` row of a selection run: ``{mnk: {protocol: algo}}``."""
    from ..results import read_rows
    from ..summary import best_of

    out: dict[str, dict[str, str]] = {}
    for (proto, mnk), r in best_of(read_rows(list(paths)), prefix).items():
        out.setdefault(mnk, {})[proto] = r.get("algo") or r["candidate"][len(prefix):]
    return out


def protocols_by_algo(selection: dict, mnk: str) -> dict[str, list[str]]:
    """The shape's distinct selected configs, each with the protocols that picked it (one candidate per config)."""
    by: dict[str, list[str]] = {}
    for proto, algo in sorted(selection.get(mnk, {}).items()):
        by.setdefault(algo, []).append(proto)
    return by
