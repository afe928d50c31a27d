"""The README's results: one table per GPU, gemmrl.mm against each vendor path, made from the result files the
block's opening marker names, each of which must have a row in ``benchmarks/results/<gpu>/INDEX.csv``.

    <!-- gpu-results h100: h100_a.csv.gz h100_b.csv.gz -->
    (generated: the table and, per file, its index row: GPU, git sha, date, the command that makes it)
    <!-- gpu-results end -->

    gemmrl report --readme README.md            # rewrite every such block from the files (in the repository root)
    gemmrl report --readme README.md --check    # write nothing; exit 1 where a block differs from what the files give

A cell is the geometric mean over shapes of speed(gemmrl.mm) / speed(path), per protocol and dtype, from verified
first-run rows (``data.shape_table``: the vendor aggregates filled in from their members where a file has none).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..results import ResultsError
from ..summary import Stats, speed
from . import index
from .data import PROTO_ORDER, shape_table
from .make import load

BEGIN = re.compile(r"^<!-- gpu-results (?P<gpu>[a-z0-9]+): (?P<files>[^<>]+?) -->$", re.M)
END = "<!-- gpu-results end -->"
OURS = "gemmrl"
PATHS = ("torch", "cublas", "cublaslt_heuristic", "cublaslt_autotuned", "vendor_best")


class ReadmeError(ResultsError):
    pass


@dataclass(frozen=True)
class Block:
    gpu: str
    files: tuple[str, ...]
    head: int       # the text from here (the opening marker) ...
    tail: int       # ... to here (the end of the closing marker) is the block


def blocks(text: str) -> list[Block]:
    """The results blocks of a README, in order; ReadmeError where one is not closed before the next opens."""
    out = []
    for m in BEGIN.finditer(text):
        end = text.find(END, m.end())
        nxt = BEGIN.search(text, m.end())
        if end < 0 or (nxt and nxt.start() < end):
            raise ReadmeError(f"'{m.group(0)}' has no '{END}' line before the next block; add it")
        out.append(Block(m.group("gpu"), tuple(m.group("files").split()), m.start(), end + len(END)))
    return out


def index_rows(root: Path, gpu: str) -> dict[str, dict[str, str]]:
    path = root / "benchmarks" / "results" / gpu / index.INDEX
    if not path.is_file():
        raise ReadmeError(f"{path}: no such index (run `gemmrl report --index` in the repository root)")
    with open(path, newline="", encoding="utf-8") as fh:
        return {r["file"]: r for r in csv.DictReader(fh)}


def _ratios(tab, proto: str, dtype: str, den: str) -> list[float]:
    """speed(gemmrl.mm) / speed(den) per shape measured with both in ``proto`` and ``dtype`` (finite, positive)."""
    xs = [speed(by[OURS]) / speed(by[den]) for k, by in tab.items()
          if k[0] == proto and k[1] == dtype and OURS in by and den in by]
    return [x for x in xs if math.isfinite(x) and x > 0]


def _machine(rows) -> str:
    def one(col: str) -> str:
        return ", ".join(sorted({r[col] for r in rows if r.get(col)}))

    parts = [one("gpu"), f"driver {one('driver')}" if one("driver") else "", f"torch {one('torch')}" if one("torch")
             else "", f"CUDA {one('cuda')}" if one("cuda") else ""]
    return ", ".join(p for p in parts if p)


def table(root: Path, gpu: str, files: tuple[str, ...]) -> str:
    """The block's body: the machine, the table (one row per file, protocol and dtype), the files' index rows."""
    idx = index_rows(root, gpu)
    hdr = ["run", "protocol", "dtype", "shapes", *(f"over {p}" for p in PATHS), "min over vendor_best",
           "below 1.00"]
    body, notes, machines = [], [], []
    for i, name in enumerate(files, 1):
        entry = idx.get(name)
        if entry is None:
            raise ReadmeError(f"{name}: no row in benchmarks/results/{gpu}/{index.INDEX} (commit the file under "
                              f"benchmarks/results/{gpu}/ and run `gemmrl report --index`)")
        path = root / "benchmarks" / "results" / gpu / name
        rows = load([path])[path]
        tab = shape_table(rows)
        if not any(OURS in by for by in tab.values()):
            raise ReadmeError(f"{name}: no verified {OURS} rows; the README's tables show gemmrl.mm (bench "
                              "--library) against the vendor paths")
        machines.append(_machine(rows))
        keys = sorted({(k[0], k[1]) for k, by in tab.items() if OURS in by},
                      key=lambda pd: (PROTO_ORDER.index(pd[0]) if pd[0] in PROTO_ORDER else 9, pd))
        for proto, dtype in keys:
            xs = {p: _ratios(tab, proto, dtype, p) for p in PATHS}
            cells = [f"{Stats.of(xs[p]).geomean:.3f}" if xs[p] else "–" for p in PATHS]
            best = xs["vendor_best"]
            body.append([str(i), proto, dtype, str(max(len(v) for v in xs.values())), *cells,
                         f"{min(best):.3f}" if best else "–", str(sum(x < 1.0 for x in best)) if best else "–"])
        sha = entry["git_sha"].split("+")[0][:12]
        notes.append(f"{i}. `{name}`: git {sha}, {entry['date']}, made by `{entry['command'] or 'gemmrl bench'}`")
    lines = [f"Made by `gemmrl report --readme README.md` from the rows of the files below (each a row of "
             f"`benchmarks/results/{gpu}/{index.INDEX}`) on {'; '.join(dict.fromkeys(machines))}. A cell: speed of "
             "gemmrl.mm over that path, geometric mean over the shapes (> 1: gemmrl.mm faster).", "",
             "| " + " | ".join(hdr) + " |", "|" + "|".join("---" if j < 3 else "---:" for j in range(len(hdr))) + "|",
             *("| " + " | ".join(r) + " |" for r in body), "", *notes]
    return "\n".join(lines)


def render(root: Path, text: str) -> str:
    """``text`` with every results block rebuilt from its files."""
    out, at = [], 0
    for b in blocks(text):
        opening = text[b.head:text.index("\n", b.head)]
        out += [text[at:b.head], opening, "\n", table(root, b.gpu, b.files), "\n", END]
        at = b.tail
    out.append(text[at:])
    return "".join(out)


def run(root: Path, readme: Path, check: bool = False) -> int:
    """Rewrite ``readme``'s results blocks (``check``: write nothing, exit 1 where one is out of date)."""
    if not (root / "benchmarks" / "results").is_dir():
        raise ReadmeError(f"{root}: no benchmarks/results folder; run `gemmrl report --readme` in the repository root")
    text = readme.read_text(encoding="utf-8")
    found = blocks(text)
    if not found:
        raise ReadmeError(f"{readme}: no '<!-- gpu-results GPU: FILE... -->' ... '{END}' block to write into")
    new = render(root, text)
    if check:
        if new != text:
            print(f"out of date: {readme} (run `gemmrl report --readme {readme}` in the repository root)")
            return 1
        return 0
    readme.write_text(new, encoding="utf-8")
    print(f"readme: {readme} ({len(found)} results block{'s' if len(found) > 1 else ''}: "
          f"{', '.join(b.gpu for b in found)})")
    return 0
