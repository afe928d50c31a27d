"""What a selection run picked, per shape and protocol, re-measured as candidates: one reader for every family.

A selection run (``gemmrl select --family F``, or ``gemmrl bench --triton-top K``) writes rows named
``F:<config>``; ``gemmrl bench --F-from CSV`` re-measures, per shape, the fastest verified config of each protocol
as a candidate named ``F-sel:<protocols>`` (the protocols that picked it): the unbiased second run of "select in one
run, report from another". A summary compares, in protocol p, only the candidate selected in p.
"""

from __future__ import annotations

from typing import Iterable

from ..kernels.registry import family
from ..problem import GemmProblem
from ..results import read_rows
from ..summary import best_of

Selection = dict[str, dict[str, tuple[str, str]]]  # {mnk: {protocol: (config, layout)}}


def load_selection(paths: Iterable, name: str) -> Selection:
    """Per shape and protocol, the config (the row's ``algo``, else its name after the family's prefix) and the
    layout of the fastest verified row of family ``name`` in the CSVs of a selection run."""
    prefix = family(name).prefix
    out: Selection = {}
    for (proto, mnk), r in best_of(read_rows(list(paths)), prefix).items():
        out.setdefault(mnk, {})[proto] = (r.get("algo") or r["candidate"][len(prefix):], r.get("layout") or "tn")
    return out


def picks(selection: dict, mnk: str) -> dict[tuple[str, str], list[str]]:
    """The shape's distinct selected (config, layout) pairs, each with the protocols that picked it (layout '' for a
    bare config string)."""
    by: dict[tuple[str, str], list[str]] = {}
    for proto, sel in sorted(selection.get(mnk, {}).items()):
        by.setdefault((sel, "") if isinstance(sel, str) else tuple(sel), []).append(proto)
    return by


def selected_candidates(problem: GemmProblem, selection: dict, name: str) -> list:
    """One candidate of family ``name`` per distinct selected (config, layout) of ``problem``'s shape, named
    ``<name>-sel:<protocols>`` (e.g. ``triton-sel:cold+graph``); none where a config is compiled for another dtype
    than the problem's. A bare config string in ``selection`` reads the problem's layout."""
    fam = family(name)
    out = []
    for (text, layout), protos in picks(selection, problem.mnk).items():
        cfg = fam.parse(text)
        if fam.fixed is not None and fam.fixed(cfg)[1] != problem.dtype:
            continue
        out.append(fam.candidate(cfg, problem.with_(layout=layout or problem.layout), fam.selected + "+".join(protos)))
    return out


def selected_for(candidate: str, protocol: str, name: str = "triton") -> bool:
    """Whether ``candidate`` is family ``name``'s ``<name>-sel:<protocols>`` re-measure, selected in ``protocol``."""
    selected = family(name).selected
    return candidate.startswith(selected) and protocol in candidate[len(selected):].split("+")
