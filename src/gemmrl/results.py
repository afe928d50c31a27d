"""The results schema (DESIGN.md): long format, one row per (shape, candidate, protocol), plus the
machine metadata every row carries. Writing is append-only and resumable: rows of one (shape,
protocol) go out in one write and are flushed to disk, so a killed sweep loses no finished row.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping

COLUMNS = (
    "mnk", "dtype", "acc", "layout", "candidate", "protocol", "qps", "time_ms", "tflops", "n",
    "p20_ms", "p80_ms", "verified", "reason", "algo", "gpu", "cc", "sm_clock_mhz", "driver", "cuda",
    "torch", "triton", "git_sha", "timestamp",
    # extras
    "M", "N", "K", "floor_ms", "floor_ok", "rep", "recheck", "members", "warmup_s", "benchmark_s",
    "n_algos", "info", "batch_end", "label",
)
REQUIRED = COLUMNS[:24]


class ResultsError(ValueError):
    pass


def text(v) -> str:
    """A value in the results schema's text form (what a results CSV holds and ``summary.usable`` reads)."""
    return _fmt(v)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if math.isnan(v):
            return "nan"
        return f"{v:.6g}"
    return str(v)


@dataclass(frozen=True)
class Meta:
    gpu: str
    cc: str
    driver: str
    cuda: str
    torch: str
    triton: str
    git_sha: str

    def row(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("gpu", "cc", "driver", "cuda", "torch", "triton", "git_sha")}


def git_sha() -> str:
    """GEMMRL_GIT_SHA (the GPU machine gets no .git), else ``git rev-parse``, else 'unknown'."""
    env = os.environ.get("GEMMRL_GIT_SHA")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect_meta(device: int = 0) -> Meta:
    import torch  # start-up cost: torch loads on first use, not on import

    try:
        import triton  # optional dependency (the triton extra), loaded on first use

        tv = triton.__version__
    except ImportError:
        tv = ""
    props = torch.cuda.get_device_properties(device)
    return Meta(gpu=props.name, cc=f"{props.major}.{props.minor}", driver=_driver_version(),
                cuda=str(torch.version.cuda), torch=torch.__version__, triton=tv, git_sha=git_sha())


def _nvml_handle(device: int):
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(device)


def _driver_version() -> str:
    try:
        nv, _ = _nvml_handle(0)
        v = nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001
        return _smi("driver_version")


def sm_clock_mhz(device: int = 0) -> str:
    """Current SM clock (read-only query; clocks are never changed)."""
    try:
        nv, h = _nvml_handle(device)
        return str(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001
        return _smi("clocks.sm", device)


def _smi(field: str, device: int = 0) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", f"-i={device}"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ResultsWriter:
    """Append rows to a CSV in the schema; ``done`` tells which (mnk, dtype, acc, protocol, rep) a
    previous (killed) run already finished."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done: set[tuple] = set()
        if self.path.exists() and self.path.stat().st_size:
            self._recover()
        else:
            with open(self.path, "w", newline="") as fh:
                csv.writer(fh).writerow(COLUMNS)

    def _recover(self) -> None:
        try:
            text = self.path.read_text()
        except UnicodeDecodeError:
            raise ResultsError(f"{self.path} is not a results CSV (not text); write to a new --out") from None
        parts = text.split("\n")  # records end in "\n"; a quoted field may hold "\n" (or "\r") inside
        lines = [ln + "\n" for ln in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
        header = next(csv.reader([lines[0]]))
        if tuple(header) != COLUMNS:
            raise ResultsError(f"{self.path} has other columns than this version writes; write to a new --out "
                               f"(first differing header: {[h for h in header if h not in COLUMNS][:3] or header[:3]})")
        good, rec, start = [lines[0]], "", 2
        for i, ln in enumerate(lines[1:], 2):
            rec += ln
            if rec.count('"') % 2:
                continue  # inside a quoted field: the record goes on on the next line
            if not rec.endswith("\n") or len(next(csv.reader([rec]))) != len(COLUMNS):
                if i < len(lines):  # not the last record: not a torn write but a damaged file; keep every row
                    raise ResultsError(f"{self.path}:{start}: a row that does not parse to the {len(COLUMNS)} "
                                       "columns; repair or remove it, or write to a new --out (nothing was changed)")
                break
            good.append(rec)
            rec, start = "", i + 1
        # what is left (a record without its newline, an unclosed quote, a short row at the end) is a torn write
        if sum(map(len, good)) != len(text):
            with open(self.path, "w", newline="") as fh:
                fh.write("".join(good))
        rows = list(csv.DictReader(io.StringIO("".join(good))))
        batches = {}
        for r in rows:
            batches.setdefault(self.key(r), []).append(r)
        self.done = {k for k, rs in batches.items() if any(r.get("batch_end") == "true" for r in rs)}

    @staticmethod
    def key(r: Mapping[str, str]) -> tuple:
        return (r["mnk"], r["dtype"], r["acc"], r["protocol"], str(r.get("rep", "0")))

    def write_batch(self, rows: Iterable[Mapping[str, object]]) -> None:
        rows = list(rows)
        if not rows:
            return
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for i, r in enumerate(rows):
            missing = [c for c in ("mnk", "candidate", "protocol") if c not in r]
            if missing:
                raise ResultsError(f"row lacks {missing}: {dict(r)}")
            vals = dict(r)
            vals["batch_end"] = i == len(rows) - 1
            w.writerow([_fmt(vals.get(c)) for c in COLUMNS])
        with open(self.path, "a", newline="") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        self.done.add(self.key({k: _fmt(v) for k, v in rows[0].items()}))


def open_text(path: str | os.PathLike):
    """A results file for reading as text: ``.csv`` as it is, ``.csv.gz`` through gzip (large selection runs are
    committed compressed: everything the GPU machine is sent, results included, must stay under 64 MiB)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def read_rows(paths: Iterable[str | os.PathLike]) -> list[dict[str, str]]:
    """Read result CSVs (``.csv`` or ``.csv.gz``); a file missing a required column is refused with the column
    named."""
    out: list[dict[str, str]] = []
    for p in paths:
        try:
            with open_text(p) as fh:
                rd = csv.DictReader(fh)
                miss = [c for c in REQUIRED if c not in (rd.fieldnames or [])]
                if miss:
                    raise ResultsError(f"{p}: not a gemmrl results file, missing columns {miss}")
                for i, r in enumerate(rd, 2):
                    if None in r or any(v is None for v in r.values()):
                        raise ResultsError(f"{p}:{i}: row has a different number of fields than the header")
                    out.append(r)
        except (UnicodeDecodeError, gzip.BadGzipFile, EOFError):
            raise ResultsError(f"{p}: not a gemmrl results file (not text)") from None
    return out
