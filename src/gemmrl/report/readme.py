"""The README's results: one table per GPU, gemmrl.mm against each vendor path, made from the result files the
block's opening marker names, each of which must have a row in ``benchmarks/results/<gpu>/INDEX.csv``.

    <!-- gpu-results h100: h100_a.csv.gz h100_b.csv.gz -->
    (generated: the table and, per file, its index row: GPU, git sha, date, the command that makes it)
    <!-- gpu-results end -->

    gemmrl report --readme README.md            # rewrite every such block from the files (in the repository root)
    gemmrl report --readme README.md --check    # write nothing; exit 1 where a block differs from what the files give

A cell is the geometric mean over shapes of speed(gemmrl.mm) / speed(path), per protocol and dtype, from verified
first-run rows (``data.shape_table``: the vendor aggregates filled in from their members where a file has none).

The quick start's transformers table is a second kind of block, rebuilt by the same command, from CSVs that
``examples/hf_generate.py`` writes (indexed the same way):

    <!-- hf-generate h200: h200_hf-generate_a.csv h200_hf-generate_b.csv -->
    (generated: the model and machine, one row per kind (eager / compiled), batch and prompt length where the file
    has both the stock and the patched mode of that kind, then per file its index row)
    <!-- hf-generate end -->
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..measure.bench import second_run
from ..results import ResultsError, open_text
from ..summary import Stats, speed
from . import index
from .data import PROTO_ORDER, shape_table
from .make import load

BEGIN = re.compile(r"^<!-- gpu-results (?P<gpu>[a-z0-9]+): (?P<files>[^<>]+?) -->$", re.M)
END = "<!-- gpu-results end -->"
HF_BEGIN = re.compile(r"^<!-- hf-generate (?P<gpu>[a-z0-9]+): (?P<files>[^<>]+?) -->$", re.M)
HF_END = "<!-- hf-generate end -->"
HF_KINDS = ("eager", "compiled")    # a mode is <side>-<kind>, side stock or patched (examples/hf_generate.py)
HF_NEEDS = ("mode", "batch", "prompt_len", "prefill_tokens_per_s", "decode_tokens_per_s", "peak_mem_gib")
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
    end: str = END  # the closing marker: END (a gpu-results block) or HF_END (an hf-generate block)


@dataclass(frozen=True)
class Pair:
    """One (kind, batch, prompt length) of an hf_generate CSV: the stock mode's row and the patched mode's."""
    file: str
    kind: str
    batch: int
    prompt: int
    stock: dict[str, str]
    patched: dict[str, str]


def _find(text: str, begin: re.Pattern, end_marker: str) -> list[Block]:
    out = []
    for m in begin.finditer(text):
        end = text.find(end_marker, m.end())
        nxt = begin.search(text, m.end())
        if end < 0 or (nxt and nxt.start() < end):
            raise ReadmeError(f"'{m.group(0)}' has no '{end_marker}' line before the next block; add it")
        out.append(Block(m.group("gpu"), tuple(m.group("files").split()), m.start(), end + len(end_marker),
                         end_marker))
    return out


def blocks(text: str) -> list[Block]:
    """The results blocks of a README, in order; ReadmeError where one is not closed before the next opens."""
    return _find(text, BEGIN, END)


def hf_blocks(text: str) -> list[Block]:
    """The hf-generate blocks of a README, in order; ReadmeError where one is not closed before the next opens."""
    return _find(text, HF_BEGIN, HF_END)


def all_blocks(text: str) -> list[Block]:
    """Both kinds, in order; ReadmeError where one kind's block opens inside the other's."""
    out = sorted(blocks(text) + hf_blocks(text), key=lambda b: b.head)
    for a, b in zip(out, out[1:]):
        if b.head < a.tail:
            raise ReadmeError(f"line {text.count(chr(10), 0, b.head) + 1}: a block opens inside the one closed by "
                              f"'{a.end}'; close that one first")
    return out


def index_rows(root: Path, gpu: str) -> dict[str, dict[str, str]]:
    path = root / "benchmarks" / "results" / gpu / index.INDEX
    if not path.is_file():
        raise ReadmeError(f"{path}: no such index (run `gemmrl report --index` in the repository root)")
    with open(path, newline="", encoding="utf-8") as fh:
        return {r["file"]: r for r in csv.DictReader(fh)}


def _entry(idx: dict[str, dict[str, str]], gpu: str, name: str) -> dict[str, str]:
    entry = idx.get(name)
    if entry is None:
        raise ReadmeError(f"{name}: no row in benchmarks/results/{gpu}/{index.INDEX} (commit the file under "
                          f"benchmarks/results/{gpu}/ and run `gemmrl report --index`)")
    return entry


def _note(i: int, name: str, entry: dict[str, str], default: str, extra: str = "") -> str:
    sha = entry["git_sha"].split("+")[0][:12]
    return f"{i}. `{name}`: git {sha}, {entry['date']}, made by `{entry['command'] or default}`{extra}"


def _ratios(tab, proto: str, dtype: str, den: str) -> list[float]:
    """speed(gemmrl.mm) / speed(den) per shape measured with both in ``proto`` and ``dtype`` (finite, positive)."""
    xs = [speed(by[OURS]) / speed(by[den]) for k, by in tab.items()
          if k[0] == proto and k[1] == dtype and OURS in by and den in by]
    return [x for x in xs if math.isfinite(x) and x > 0]


def _machine(rows) -> str:
    parts = (_values(rows, "gpu"), _labelled(rows, "driver", "driver {}"), _labelled(rows, "torch", "torch {}"),
             _labelled(rows, "cuda", "CUDA {}"))
    return ", ".join(p for p in parts if p)


def table(root: Path, gpu: str, files: tuple[str, ...]) -> str:
    """The block's body: the machine, the table (one row per file, protocol and dtype), the files' index rows."""
    idx = index_rows(root, gpu)
    hdr = ["run", "protocol", "dtype", "shapes", *(f"over {p}" for p in PATHS), "min over vendor_best",
           "below 1.00", "over vendor_best, second run"]
    body, notes, machines = [], [], []
    for i, name in enumerate(files, 1):
        entry = _entry(idx, gpu, name)
        path = root / "benchmarks" / "results" / gpu / name
        rows = load([path])[path]
        tab = shape_table(rows)
        if not any(OURS in by for by in tab.values()):
            raise ReadmeError(f"{name}: no verified {OURS} rows; the README's tables show gemmrl.mm (bench "
                              "--library) against the vendor paths")
        machines.append(_machine(rows))
        keys = sorted({(k[0], k[1]) for k, by in tab.items() if OURS in by},
                      key=lambda pd: (PROTO_ORDER.index(pd[0]) if pd[0] in PROTO_ORDER else 9, pd))
        again = second_run(rows, OURS, "vendor_best")
        for proto, dtype in keys:
            xs = {p: _ratios(tab, proto, dtype, p) for p in PATHS}
            cells = [f"{Stats.of(xs[p]).geomean:.3f}" if xs[p] else "–" for p in PATHS]
            best = xs["vendor_best"]
            # the pair re-measured head to head at every shape (gemmrl bench since rechecks of every shape): its
            # ratio from those runs, not from the one that chose vendor_best's member; "–" where a shape has none
            two = [x for k, x in again.items() if k[3] == proto and k[1] == dtype]
            body.append([str(i), proto, dtype, str(max(len(v) for v in xs.values())), *cells,
                         f"{min(best):.3f}" if best else "–", str(sum(x < 1.0 for x in best)) if best else "–",
                         f"{Stats.of(two).geomean:.3f}" if best and len(two) >= len(best) else "–"])
        notes.append(_note(i, name, entry, "gemmrl bench"))
    lines = [f"Made by `gemmrl report --readme README.md` from the rows of the files below (each a row of "
             f"`benchmarks/results/{gpu}/{index.INDEX}`) on {'; '.join(dict.fromkeys(machines))}. A cell: speed of "
             "gemmrl.mm over that path, geometric mean over the shapes (> 1: gemmrl.mm faster).", "",
             "| " + " | ".join(hdr) + " |", "|" + "|".join("---" if j < 3 else "---:" for j in range(len(hdr))) + "|",
             *("| " + " | ".join(r) + " |" for r in body), "", *notes]
    return "\n".join(lines)


def _hf_rows(path: Path, name: str) -> list[dict[str, str]]:
    """An examples/hf_generate.py CSV's rows; ReadmeError where it lacks a column the table needs."""
    if not path.is_file():
        raise ReadmeError(f"{path}: no such file (the index names it: commit it, or run `gemmrl report --index`)")
    with open_text(path) as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in HF_NEEDS if c not in (reader.fieldnames or ())]
        rows = list(reader)
    if missing:
        raise ReadmeError(f"{name}: no column {', '.join(missing)}; an hf-generate block names CSVs written by "
                          "examples/hf_generate.py")
    return rows


def _num(row: dict[str, str], col: str, name: str) -> float:
    try:
        return float(row[col])
    except ValueError:
        raise ReadmeError(f"{name}: {row['mode']} batch {row['batch']} prompt {row['prompt_len']} has no number in "
                          f"{col}; rerun that cell of examples/hf_generate.py") from None


def _pairs(rows: list[dict[str, str]], name: str) -> list[Pair]:
    """Every (kind, batch, prompt length) with both a stock and a patched row, eager first, then by batch, prompt."""
    cells: dict[tuple[str, int, int], dict[str, dict[str, str]]] = {}
    for r in rows:
        side, _, kind = r["mode"].partition("-")
        if side not in ("stock", "patched") or kind not in HF_KINDS:
            continue
        by = cells.setdefault((kind, int(_num(r, "batch", name)), int(_num(r, "prompt_len", name))), {})
        if side in by:
            raise ReadmeError(f"{name}: two {r['mode']} rows at batch {r['batch']} prompt {r['prompt_len']}; name "
                              "the files of separate runs separately")
        by[side] = r
    keys = sorted((k for k, by in cells.items() if len(by) == 2), key=lambda k: (HF_KINDS.index(k[0]), k[1], k[2]))
    if not keys:
        raise ReadmeError(f"{name}: no stock/patched pair (stock-eager with patched-eager, or stock-compiled with "
                          "patched-compiled, at one batch and prompt length); run examples/hf_generate.py with both "
                          "modes of a kind in --modes")
    return [Pair(name, *k, cells[k]["stock"], cells[k]["patched"]) for k in keys]


def _equal(patched: dict[str, str]) -> str:
    """The patched mode's greedy tokens against stock's: yes, from step N (the first that differs), or – (unknown)."""
    same, step = patched.get("tokens_equal_stock", ""), patched.get("first_diff_step", "")
    if same == "True":
        return "yes"
    if same == "False":
        return f"from step {step}" if step else "no"
    return "–"


def _rechecks(patched: dict[str, str]) -> int:
    n = patched.get("rechecks", "")
    return int(n) if n.isdigit() else 0


def _hf_row(i: int, p: Pair) -> list[str]:
    def three(col: str, fmt: str, counted: str) -> list[str]:
        """stock, patched, ratio: the row's counted ratio where it has one (interleaved runs; after the noise
        rule's rechecks, theirs, marked (rN)), else patched over stock of the first readings."""
        s, q = _num(p.stock, col, p.file), _num(p.patched, col, p.file)
        ratio = f"{q / s:.3f}" if s > 0 else "–"
        if p.patched.get(counted):
            ratio = f"{_num(p.patched, counted, p.file):.3f}"
            if _rechecks(p.patched):
                ratio += f" (r{_rechecks(p.patched)})"
        return [format(s, fmt), format(q, fmt), ratio]

    mem = "/".join(f"{_num(r, 'peak_mem_gib', p.file):.2f}" if r.get("peak_mem_gib") else "–"
                   for r in (p.stock, p.patched))
    return [str(i), p.kind, str(p.batch), str(p.prompt), *three("prefill_tokens_per_s", ".0f", "prefill_vs_stock_counted"),
            *three("decode_tokens_per_s", ".1f", "decode_vs_stock_counted"), mem, _equal(p.patched)]


def _values(rows, col: str) -> str:
    return ", ".join(sorted({r[col] for r in rows if r.get(col)}))


def _labelled(rows, col: str, fmt: str) -> str:
    v = _values(rows, col)
    return fmt.format(v) if v else ""


def _ms_per_token(pairs: list[Pair]) -> str:
    """Decode ms per token, stock and patched, per kind: the range over the table's rows."""
    out = []
    for kind in HF_KINDS:
        xs = [_num(r, "decode_ms_per_token", p.file) for p in pairs if p.kind == kind for r in (p.stock, p.patched)
              if r.get("decode_ms_per_token")]
        if xs:
            out.append(f"{kind} {min(xs):.1f}-{max(xs):.1f}")
    return f" Decode ms per token (stock and patched): {', '.join(out)}." if out else ""


def hf_table(root: Path, gpu: str, files: tuple[str, ...]) -> str:
    """An hf-generate block's body: what made it and where, the stock / patched table, the files' index rows."""
    idx = index_rows(root, gpu)
    hdr = ["run", "kind", "batch", "prompt", "prefill tok/s stock", "patched", "patched/stock", "decode tok/s stock",
           "patched", "patched/stock", "peak GiB stock/patched", "greedy tokens equal"]
    body, notes, every, pairs = [], [], [], []
    for i, name in enumerate(files, 1):
        entry = _entry(idx, gpu, name)
        rows = _hf_rows(root / "benchmarks" / "results" / gpu / name, name)
        ps = _pairs(rows, name)
        body += [_hf_row(i, p) for p in ps]
        every += rows
        pairs += ps
        order = _values(rows, "order")
        notes.append(_note(i, name, entry, "python examples/hf_generate.py",
                           f", timed generates {order}" if order else ""))
    what = ", ".join(x for x in (_values(every, "model"), _values(every, "dtype"),
                                 _labelled(every, "new_tokens", "{} new tokens")) if x)
    machine = ", ".join(x for x in (_values(every, "gpu"), _labelled(every, "torch", "torch {}"),
                                    _labelled(every, "transformers", "transformers {}")) if x)
    align = ["---", "---", "---:", "---:", *["---:"] * 6, "---", "---"]
    lines = [f"Made by `gemmrl report --readme README.md` from the rows of the files below (each a row of "
             f"`benchmarks/results/{gpu}/{index.INDEX}`), written by `examples/hf_generate.py`: {what}, on {machine}."
             f"{_ms_per_token(pairs)} A ratio: patched over stock (> 1: patched faster)"
             + ("; (rN): the cell ran under 1.00 at first and N further interleaved pairs of generates re-measured "
                "it (the noise rule), the ratio of their medians shown." if any(_rechecks(q.patched) for q in pairs)
                else "."), "",
             "| " + " | ".join(hdr) + " |", "|" + "|".join(align) + "|", *("| " + " | ".join(r) + " |" for r in body),
             "", *notes]
    return "\n".join(lines)


BODY = {END: table, HF_END: hf_table}


def render(root: Path, text: str) -> str:
    """``text`` with every results and hf-generate block rebuilt from its files."""
    out, at = [], 0
    for b in all_blocks(text):
        opening = text[b.head:text.index("\n", b.head)]
        out += [text[at:b.head], opening, "\n", BODY[b.end](root, b.gpu, b.files), "\n", b.end]
        at = b.tail
    out.append(text[at:])
    return "".join(out)


def run(root: Path, readme: Path, check: bool = False) -> int:
    """Rewrite ``readme``'s results blocks (``check``: write nothing, exit 1 where one is out of date)."""
    if not (root / "benchmarks" / "results").is_dir():
        raise ReadmeError(f"{root}: no benchmarks/results folder; run `gemmrl report --readme` in the repository root")
    text = readme.read_text(encoding="utf-8")
    found = all_blocks(text)
    if not found:
        raise ReadmeError(f"{readme}: no '<!-- gpu-results GPU: FILE... -->' ... '{END}' block nor "
                          f"'<!-- hf-generate GPU: FILE... -->' ... '{HF_END}' block to write into")
    new = render(root, text)
    if check:
        if new != text:
            print(f"out of date: {readme} (run `gemmrl report --readme {readme}` in the repository root)")
            return 1
        return 0
    readme.write_text(new, encoding="utf-8")
    print(f"readme: {readme} ({len(found)} results block{'s' if len(found) > 1 else ''}: "
          f"{', '.join(b.gpu if b.end == END else f'hf-generate {b.gpu}' for b in found)})")
    return 0
