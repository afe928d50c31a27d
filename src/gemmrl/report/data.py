"""The per-shape numbers `gemmrl report` is made of: result rows as a shape table (with the vendor aggregates
filled in), the protocols it covers in report order, and per-shape speed ratios in one protocol. Shared by the
tables (``make.py``) and the plots (``plots.py``)."""

from __future__ import annotations

from typing import Mapping

from ..summary import AGGREGATES, speed, table

PROTO_ORDER = ("graph", "cold", "offline", "server")


def shape_table(rows) -> dict[tuple, dict[str, Mapping[str, str]]]:
    """summary.table, with an aggregate (cublas, ..., vendor_best) filled in from its members where
    the file has no aggregate row and every member was measured (the faster one, by speed)."""
    tab = table(rows)
    for by in tab.values():
        for agg, members in AGGREGATES.items():
            if agg not in by and all(m in by for m in members):
                by[agg] = max((by[m] for m in members), key=speed)
    return tab


def protocols(tab) -> list[str]:
    ps = {k[0] for k in tab}
    return sorted(ps, key=lambda p: (PROTO_ORDER.index(p) if p in PROTO_ORDER else 9, p))


def ratios(tab, proto: str, num: str, den: str) -> dict[str, float]:
    """{mnk: speed(num)/speed(den)} in one protocol where both were measured (dtype/acc kept in the
    key when a file mixes them)."""
    keys = {(k[1], k[2]) for k in tab if k[0] == proto}
    out = {}
    for k, by in tab.items():
        if k[0] == proto and num in by and den in by:
            name = k[3] if len(keys) == 1 else f"{k[3]} {k[1]}/{k[2]}"
            out[name] = speed(by[num]) / speed(by[den])
    return out
