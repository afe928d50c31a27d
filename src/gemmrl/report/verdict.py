"""What `gemmrl report` opens with: per protocol, one verdict line on ours against ``vendor_best`` (geometric mean of
the per-shape speed ratios, the worst shape, how many shapes are below 1.00, and how many of those the noise rule
still finds below after its rechecks, and, where the bench re-measured the pair at every shape, the geometric mean
of those re-measurements: vendor_best's path chosen on the first run, timed on others), and the per-shape table
behind it.

The noise rule is bench's own (``measure.bench.noise_rule_below`` over the rows, with the bar
``measure.core.RECHECK_MARGIN`` sets for the pair: 2% for ``gemmrl`` over ``vendor_best``). A shape whose rows the
rule cannot judge (no first-run ``vendor_best`` row: the report filled it in from its members) counts as still below
where its ratio is under the bar. Where the rows hold no rechecks of ours in a protocol, the line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..library import served_desc
from ..measure.bench import noise_rule_below, second_run
from ..measure.core import RECHECK_MARGIN
from ..summary import AGGREGATES, Stats, speed
from .data import PROTO_ORDER, protocols

# candidates by the name a user calls them by (serve/bench_candidate.py: the ``gemmrl`` rows time gemmrl.mm)
SHOWN = {"gemmrl": "gemmrl.mm"}
SERVED_CHARS = 48


def shown(name: str) -> str:
    return SHOWN.get(name, name)


@dataclass(frozen=True)
class Verdict:
    protocol: str
    num: str
    den: str
    stats: Stats
    below: int              # shapes with speed(num) / speed(den) < 1.00
    after: int | None       # of those, below the bar after the rechecks; None: no rechecks in the rows
    margin: float           # the noise rule's bar for (num, den)
    second: Stats | None = None  # the ratio from the head-to-head rechecks where every shape has them (bench.second_run)

    def line(self) -> str:
        s = self.stats
        head = (f"{self.protocol}: {shown(self.num)} / {self.den} geomean {s.geomean:.3f} over {s.n} "
                f"shape{'' if s.n == 1 else 's'}, min {s.min:.3f}, {self.below} below 1.00")
        if self.after is None:
            return head + " (no rechecks in these rows)"
        bar = f" by more than {100 * self.margin:g}%" if self.margin else ""
        tail = "" if self.second is None else (f"; from the rechecks (a second run of both): geomean "
                                               f"{self.second.geomean:.3f}, min {self.second.min:.3f}")
        return head + f" ({self.after} below{bar} after the noise rule's rechecks{tail})"


def _number(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _ratios(tab, proto: str, num: str, den: str) -> dict[tuple, float]:
    """{(protocol, dtype, acc, mnk): speed(num) / speed(den)} in ``proto``, finite and positive only (as Stats)."""
    out = {}
    for k, by in tab.items():
        if k[0] == proto and num in by and den in by:
            x = speed(by[num]) / speed(by[den])
            if math.isfinite(x) and x > 0:
                out[k] = x
    return out


def _first_run(r: Mapping[str, str]) -> bool:
    return r.get("verified") == "true" and str(r.get("rep", "0") or "0") == "0" and not r.get("recheck")


def verdicts(rows: Sequence[Mapping[str, str]], tab, num: str, den: str = "vendor_best") -> list[Verdict]:
    """One Verdict per protocol of ``tab`` (``data.shape_table(rows)``) in which ``num`` and ``den`` share a shape."""
    margin = RECHECK_MARGIN.get((num, den), 0.0)
    timed = [r for r in rows if _number(r.get("tflops"))]  # the rule reads every verified row's tflops
    still = set(noise_rule_below(timed, num, den, margin))
    again = second_run(timed, num, den)
    ours = set(AGGREGATES.get(num, (num,)))
    out = []
    for p in protocols(tab):
        rs = _ratios(tab, p, num, den)
        if not rs:
            continue
        below = [k for k, x in rs.items() if x < 1.0]
        after = None
        if any(r.get("recheck") and r.get("protocol") == p and r.get("candidate") in ours for r in timed):
            judged = {r["mnk"] for r in timed if r.get("protocol") == p and r.get("candidate") == den
                      and _first_run(r) and (den not in AGGREGATES or r.get("members"))}
            after = sum(1 for k in below if rs[k] < 1 - margin and ((k[3], p) in still or k[3] not in judged))
        two = [x for k, x in again.items() if k[3] == p]
        out.append(Verdict(p, num, den, Stats.of(rs.values()), len(below), after, margin,
                           Stats.of(two) if two and len(two) >= len(rs) else None))
    return out


def served_by(r: Mapping[str, str]) -> str:
    """What served a ``gemmrl`` row, as its ``algo`` says (``library.served_desc``), cut to SERVED_CHARS; "" for
    other rows."""
    if r.get("candidate") != "gemmrl":
        return ""
    d = served_desc(r).split(" (", 1)[0].split(" [", 1)[0].replace("|", "/").strip()
    if len(d) <= SERVED_CHARS:
        return d
    return d[:SERVED_CHARS].rsplit(" ", 1)[0] + " …"


def _us(r: Mapping[str, str]) -> str:
    return f"{float(r['time_ms']) * 1e3:.2f}"


def shape_rows(tab, num: str, den: str = "vendor_best") -> tuple[list[str], list[list[str]]]:
    """The per-shape table: shape, protocol, both times (µs), which vendor path was ``den`` (an aggregate's
    winning member), the speed ratio, and what served ours where the rows say; worst ratio first per protocol."""
    mixed = len({(k[1], k[2]) for k in tab}) > 1
    recs = []
    for p in protocols(tab):
        for k, x in _ratios(tab, p, num, den).items():
            by = tab[k]
            name = k[3] if not mixed else f"{k[3]} {k[1]}/{k[2]}"
            path = (by[den].get("members") or by[den].get("candidate", "")) if den in AGGREGATES else ""
            recs.append(((PROTO_ORDER.index(p) if p in PROTO_ORDER else 9, p, x, name),
                         [name, p, _us(by[num]), _us(by[den]), path, f"{x:.3f}", served_by(by[num])]))
    recs.sort(key=lambda t: t[0])
    hdr = ["shape", "protocol", f"{shown(num)} time (µs)", f"{den} time (µs)", f"{den} path",
           f"{shown(num)} / {den} (speed)", "served by"]
    keep = [i for i in range(len(hdr)) if not (i == 4 and den not in AGGREGATES)
            and not (i == 6 and not any(c[6] for _, c in recs))]
    return [hdr[i] for i in keep], [[c[i] for i in keep] for _, c in recs]
