"""The results index: one ``INDEX.csv`` per GPU folder of ``benchmarks/results/`` saying, for every file there, which
GPU and git sha made it, when, what it measures, the command that makes such a file, and which document cites it.

    gemmrl report --index                  # rewrite benchmarks/results/<gpu>/INDEX.csv from the files and the docs
    gemmrl report --index --check          # exit 1 where a committed INDEX.csv is not what the files give
    python -m gemmrl.report.index [--check] [--root DIR]

Everything comes from the files themselves: a results CSV's ``gpu``, ``git_sha``, ``timestamp``, ``mnk`` and
``protocol`` columns; otherwise the name (``<gpu>_<what>_<sha>_<date>.<ext>``), a summary's ``Command:`` line, and the
lines of ``README.md`` and ``docs/*.md`` (findings, measurements) that name the file. Logs, libraries and trial stores
sit in ``logs/``, ``libraries/`` and ``trials/`` beside the measurements and are indexed with their folder.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
from dataclasses import astuple, dataclass
from pathlib import Path

FIELDS = ("file", "gpu", "git_sha", "date", "measures", "command", "cited_by")
INDEX = "INDEX.csv"
_DATE = re.compile(r"(20\d\d-\d\d-\d\d)")
_SHA = re.compile(r"(?<![0-9a-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}(?![0-9a-z])")
_GPU_NAME = {"h100": "NVIDIA H100", "h200": "NVIDIA H200", "cpu": "CPU"}
# the command that writes a file of this kind, by a word of its name (first match wins)
_KIND = (("hf-generate", "benchmarks/acceptance/gpu_hf_generate.sh (examples/hf_generate.py)"),
         ("tiny-probe", "benchmarks/acceptance/gpu_tiny_probe.sh (gemmrl bench --library --triton-top)"),
         ("kernel-names", "benchmarks/acceptance/gpu_tiny_probe.sh NAMES=... (benchmarks/acceptance/kernel_names.py)"),
         ("hf-patch", "benchmarks/acceptance/gpu_hf_generate.sh PATCH_CHECK=... (benchmarks/acceptance/hf_patch_check.py)"),
         ("journey-tune", "benchmarks/acceptance/gpu_journey.sh STAGE=tune (gemmrl tune --model --budget-gpu-minutes)"),
         ("journey-library", "benchmarks/acceptance/gpu_journey.sh STAGE=tune (gemmrl tune --library-out)"),
         ("journey", "benchmarks/acceptance/gpu_journey.sh STAGE=bench (gemmrl bench --library default)"),
         ("lt-splits-probe", "benchmarks/acceptance/gpu_anyshape.sh PROBE=... (benchmarks/acceptance/lt_splits_probe.py)"),
         ("dispatch-host-cost", "benchmarks/acceptance/gpu_anyshape.sh HOSTCOST=1 (benchmarks/acceptance/dispatch_host_cost.py)"),
         ("tunableop-on", "benchmarks/acceptance/gpu_anyshape.sh TUNABLEOP=same (gemmrl bench --library with "
                          "PYTORCH_TUNABLEOP_ENABLED=1 in the bench's own process; "
                          "benchmarks/acceptance/tunableop_beside.py)"),
         ("tunableop", "benchmarks/acceptance/gpu_anyshape.sh TUNABLEOP=1 (gemmrl bench --baselines torch with "
                       "PYTORCH_TUNABLEOP_ENABLED=1; benchmarks/acceptance/tunableop_beside.py)"),
         ("host-probe-crowd", "PROBE_CROWD=2 [PROBE_PROTOCOL=server] python benchmarks/acceptance/offline_host_probe.py"),
         ("-select", "gemmrl select"), ("_select", "gemmrl select"),
         ("remeasure", "gemmrl bench --triton-from/--cutlass-from"),
         ("tune", "gemmrl tune"), ("headroom", "gemmrl headroom"), ("library", "gemmrl bench --library"),
         ("measure", "gemmrl bench --library"), ("adversarial", "benchmarks/acceptance/gpu_run.sh ADVERSARIAL=1"),
         ("ncu", "python -m gemmrl.measure.ncu"), ("gpu-test", "benchmarks/acceptance/gpu_test_tier.sh"))


@dataclass(frozen=True)
class Entry:
    file: str
    gpu: str
    git_sha: str
    date: str
    measures: str
    command: str
    cited_by: str


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _what(name: str, gpu_dir: str) -> str:
    """The name's middle: what the file holds, without the GPU prefix, the shas, the date and the extension."""
    stem = re.sub(r"\.(csv|md|log|txt|json|sqlite|tgz)(\.gz)?$", "", name)
    stem = re.sub(rf"^{gpu_dir}(x\d)?_", "", stem)
    stem = _DATE.sub("", stem)
    stem = _SHA.sub("", stem)
    return re.sub(r"[_-]{2,}", "_", stem).strip("_-")


def _csv_facts(path: Path) -> dict[str, set[str]] | None:
    """The distinct gpu / git_sha / date / mnk / protocol values of a results CSV; None if it has no ``gpu`` column."""
    try:
        with _open_text(path) as fh:
            reader = csv.reader(fh)
            head = next(reader, [])
            if "gpu" not in head:
                return None
            cols = {c: head.index(c) for c in ("gpu", "git_sha", "timestamp", "mnk", "protocol") if c in head}
            seen: dict[str, set[str]] = {c: set() for c in cols}
            for row in reader:
                for c, i in cols.items():
                    if i < len(row) and row[i]:
                        seen[c].add(row[i][:10] if c == "timestamp" else row[i])
            return seen
    except (OSError, EOFError, csv.Error, gzip.BadGzipFile):
        return None


def _summary_command(path: Path) -> str:
    """A markdown summary's ``Command:`` line, or its first backticked ``gemmrl`` or ``python <acceptance run>``
    command."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    m = (re.search(r"^Command:\s*`([^`]+)`", text, re.M)
         or re.search(r"`((?:gemmrl|python3? (?:benchmarks/acceptance|scripts)/)[^`]+)`", text))
    return m.group(1).strip() if m else ""


def _citations(docs: list[Path], root: Path) -> dict[str, list[str]]:
    """For each file name a document names: ``doc#heading`` of every section that names it, in document order."""
    out: dict[str, list[str]] = {}
    token = re.compile(r"[A-Za-z0-9_.+-]+\.(?:csv|md|log|txt|json|sqlite|tgz)(?:\.gz)?")
    for doc in docs:
        heading, fenced = "", False
        rel = doc.relative_to(root).as_posix()
        for line in doc.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced  # inside a code block a '#' line is a comment, not a heading
            elif line.startswith("#") and not fenced:
                heading = line.lstrip("#").strip()
                continue
            for name in token.findall(line):
                where = f"{rel}#{heading}" if heading else rel
                cites = out.setdefault(name.rsplit("/", 1)[-1], [])
                if where not in cites:
                    cites.append(where)
    return out


def _docs(root: Path) -> list[Path]:
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [d for d in docs if d.is_file()]


def entries(gpu_dir: Path, cites: dict[str, list[str]]) -> list[Entry]:
    """One entry per file under ``gpu_dir`` (INDEX.csv itself excepted), sorted by path."""
    out = []
    for path in sorted(p for p in gpu_dir.rglob("*") if p.is_file() and p.name != INDEX):
        rel, name = path.relative_to(gpu_dir).as_posix(), path.name
        what = _what(name, gpu_dir.name)
        facts = _csv_facts(path) if ".csv" in name else None
        if facts:
            gpu = ";".join(sorted(facts["gpu"]))
            sha = "+".join(sorted(facts.get("git_sha", ()))) or "+".join(_SHA.findall(name))
            days = sorted(facts.get("timestamp", ())) or _DATE.findall(name)
            date = days[0] if len(days) <= 1 or days[0] == days[-1] else f"{days[0]}..{days[-1]}"
            proto = ",".join(sorted(facts.get("protocol", ())))
            shapes = f"{len(facts['mnk'])} shapes" if facts.get("mnk") else ""
            measures = ", ".join(x for x in (what, shapes, f"protocols {proto}" if proto else "") if x)
        else:
            gpu = _GPU_NAME.get(gpu_dir.name, gpu_dir.name)
            sha = "+".join(_SHA.findall(name))
            date = (_DATE.findall(name) or [""])[0]
            measures = what
        command = _summary_command(path) if name.endswith(".md") else ""
        if not command:
            command = next((cmd for word, cmd in _KIND if word in name), "gemmrl bench" if facts else "")
        out.append(Entry(rel, gpu, sha, date, measures, command, " | ".join(cites.get(name, []))))
    return out


def render(rows: list[Entry]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FIELDS)
    w.writerows(astuple(r) for r in rows)
    return buf.getvalue()


def build(root: Path) -> dict[Path, str]:
    """``{INDEX.csv path: its text}`` for every GPU folder under ``root/benchmarks/results``."""
    results = root / "benchmarks" / "results"
    cites = _citations(_docs(root), root)
    return {d / INDEX: render(entries(d, cites)) for d in sorted(results.iterdir()) if d.is_dir()}


def stale(root: Path) -> list[Path]:
    """The INDEX.csv files that are missing or differ from what ``build`` gives."""
    return [p for p, text in build(root).items() if not p.is_file() or p.read_text(encoding="utf-8") != text]


def write(root: Path) -> list[Path]:
    written = []
    for p, text in build(root).items():
        p.write_text(text, encoding="utf-8")
        written.append(p)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gemmrl.report.index", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="the repository root (default: the current directory)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 where an INDEX.csv is out of date")
    args = ap.parse_args(argv)
    return run(Path(args.root), check=args.check)


def run(root: Path, check: bool = False) -> int:
    if not (root / "benchmarks" / "results").is_dir():
        print(f"{root}: no benchmarks/results folder (give --root, the repository root)")
        return 2
    if check:
        old = stale(root)
        for p in old:
            print(f"out of date: {p} (run `gemmrl report --index`)")
        return 1 if old else 0
    for p in write(root):
        print(f"index: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
