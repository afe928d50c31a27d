"""The trials store and the library of winners (DESIGN.md, "Library and lookup").

Two stores:
- **trials**: every measured row (the results schema), in SQLite (WAL) at ``cache_dir()/trials.sqlite``.
  ``TrialsStore.ingest`` is idempotent per (source file, row); the library is built from it.
- **library**: winners only. An ``Entry`` says, for one GPU, dtype, acc, layout and protocol, which kernel
  serves a shape (a Triton config, a CUTLASS SM90 config with its scheduler knobs, or the vendor path that was
  measured fastest: the dispatcher never serves anything slower than what the vendor offered in that layout, but
  for an eager entry's cheaper host path within 2% of it, see ``HOST_ORDER``),
  its time and vendor_best's, and where it came from. Triton winners that won at neighbouring measured M of one
  (N, K) with the same config form a bucket (``m_lo..m_hi``, ``members`` = the measured shapes); a bucket serves
  an M inside its range that was not measured. CUTLASS winners stay exact entries (see ``bucketize``). The
  library is a JSON document (small, read once per process, diffable in review): the package ships one
  read-only per tuned GPU (``gemmrl/libraries/*.json``) and the user library in ``cache_dir()/library.json``
  overrides it entry by entry.

Nothing is used blindly: a file that is not a gemmrl library, has another schema, or whose checksum does not
match its entries is refused with LibraryError (what to do is in the message); entries of another GPU model
are never served there, and ``gemmrl lib import`` refuses entries of a GPU model gemmrl does not know
(``known_gpu``); entries measured under other software versions are re-verified by the dispatcher
before first use (``Entry.same_software``).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import re
import sqlite3
import statistics
import warnings
import zlib
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Iterable, Mapping

from .kernels.registry import SERVED, family
from .kernels.triton_gemm.configs import CONFIG_TYPES
from .paths import cache_dir
from .problem import GPU_PEAKS, ProblemError, peaks_for
from .results import text
from .summary import BASELINES, usable

FORMAT = "gemmrl-library"
SCHEMA = 1
FAMILIES = SERVED  # what an entry may name (kernels/registry.py)
# the generated families, and the name prefixes of their rows: one config as tuned or selected
# (``triton:<config>``, ``cutlass:<config>:<knobs>``, ``tiny:<config>``), and a selection re-measured
# (``triton-sel:graph``, ...)
KERNELS = {f: (family(f).prefix, family(f).selected) for f in SERVED if f != "vendor"}
PROTOCOL_ORDER = {"graph": ("graph", "cold", "offline", "server"), "eager": ("offline", "server", "cold", "graph")}
SOFTWARE = ("torch", "triton", "cuda")


class LibraryError(ValueError):
    pass


AS_GPU_SOURCE = "as-gpu from "  # how an entry relabelled for another GPU model (lib export --as-gpu) says so


@dataclass(frozen=True)
class Entry:
    gpu: str
    cc: str
    dtype: str
    acc: str
    layout: str
    protocol: str
    M: int
    N: int
    K: int
    family: str                 # 'triton' | 'cutlass' | 'tiny' | 'vendor'
    impl: str                   # triton: the config string; cutlass: '<config>:<knobs>' (kernels/cutlass_sm90.py);
    #                             tiny: the config (kernels/tiny_gemm.py); vendor: the baseline name
    algo: str                   # vendor: the cuBLAS(Lt) algorithm as measured; generated families: the impl string
    time_ms: float
    vendor_best_ms: float
    vendor_best: str            # which vendor path that was
    m_lo: int
    m_hi: int
    members: tuple[str, ...]    # measured shapes it won at (a bucket has several)
    verified: bool
    torch: str = ""
    triton: str = ""
    cuda: str = ""
    driver: str = ""
    git_sha: str = ""
    timestamp: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        bad = []
        if self.family not in FAMILIES:
            bad.append(f"family {self.family!r} (use {FAMILIES})")
        for what, text in (("gpu", self.gpu), ("impl", self.impl)):  # names end up in file names and messages
            if not text or len(text) > 200 or ".." in text or any(c in text for c in "/\\\0\n\r"):
                bad.append(f"{what} {text[:80]!r} (a name: no path separators, '..' or control characters)")
        if self.layout not in ("nn", "tn"):
            bad.append(f"layout {self.layout!r}")
        if self.dtype not in ("fp16", "bf16") or self.acc not in ("fp32", "fp16"):
            bad.append(f"dtype/acc {self.dtype}/{self.acc}")
        if min(self.M, self.N, self.K) < 1 or not self.m_lo <= self.M <= self.m_hi:
            bad.append(f"shape {self.M}_{self.N}_{self.K} with M range {self.m_lo}..{self.m_hi}")
        if self.family == "vendor" and self.impl not in BASELINES:
            bad.append(f"vendor impl {self.impl!r} (use one of {BASELINES})")
        if self.family in KERNELS:
            bad += _impl_problems(self.family, self.impl, self.layout, self.dtype)
        if not self.time_ms > 0:
            bad.append(f"time_ms {self.time_ms}")
        if any(len(p := str(m).split("_")) != 3 or not all(x.isdigit() for x in p) for m in self.members):
            bad.append(f"members {self.members!r} (each M_N_K)")
        if bad:
            raise LibraryError(f"bad library entry {self.M}_{self.N}_{self.K}: {'; '.join(bad)}")

    @property
    def mnk(self) -> str:
        return f"{self.M}_{self.N}_{self.K}"

    @property
    def speedup(self) -> float:
        return self.vendor_best_ms / self.time_ms

    def key(self) -> tuple:
        return (self.gpu, self.dtype, self.acc, self.layout, self.protocol, self.N, self.K, self.m_lo, self.m_hi)

    @property
    def relabelled(self) -> bool:
        """Measured on another GPU model and relabelled for this one (``gemmrl lib export --as-gpu``)."""
        return self.source.startswith(AS_GPU_SOURCE)

    def same_software(self, versions: Mapping[str, str]) -> bool:
        return all(not getattr(self, k) or not versions.get(k) or getattr(self, k) == versions[k] for k in SOFTWARE)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["members"] = list(self.members)
        return d

    @staticmethod
    def from_dict(d: Mapping) -> "Entry":
        if not isinstance(d, Mapping):
            raise LibraryError(f"library entry is not an object: {d!r}"[:300])
        names = {f.name for f in fields(Entry)}
        missing = [f.name for f in fields(Entry) if f.default is MISSING and f.name not in d]
        if missing:
            raise LibraryError(f"library entry without {missing}: {dict(d)}"[:300])
        kw = {k: v for k, v in d.items() if k in names}
        try:
            for k in ("M", "N", "K", "m_lo", "m_hi"):
                kw[k] = int(kw[k])
            for k in ("time_ms", "vendor_best_ms"):
                kw[k] = float(kw[k])
            kw["members"] = tuple(kw.get("members") or ())
            if not isinstance(kw["verified"], bool):
                raise ValueError(f"verified must be true or false, not {kw['verified']!r}")
        except (TypeError, ValueError) as e:
            raise LibraryError(f"library entry with a malformed field ({e}): {dict(d)}"[:300]) from None
        return Entry(**kw)


@functools.lru_cache(maxsize=4096)
def _impl_problems(name: str, impl: str, layout: str, dtype: str) -> tuple[str, ...]:
    """Why ``impl`` cannot be a ``name`` entry's kernel in this layout and dtype (a CUTLASS or tiny config is
    compiled for one of each, so a mismatched one would be refused at every call): () when it can. Cached: a
    library build asks once per row, with a few dozen distinct configs among thousands of rows."""
    fam = family(name)
    if fam.fixed is None:
        return ()
    try:
        cfg = fam.parse(impl)
    except ValueError as e:
        return (f"{name} impl: {e}",)
    why = fam.mismatch(cfg, layout, dtype)
    return (f"{name} impl {impl!r} is {why.replace(' problem', ' entry')}",) if why else ()


def _digest(entries: list[dict]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


class Library:
    """Entries indexed for lookup: exact shape first, then a bucket whose M range holds the shape."""

    def __init__(self, entries: Iterable[Entry] = (), sources: tuple[str, ...] = ()):
        self.entries: list[Entry] = []
        self.sources = sources
        self._exact: dict[tuple, Entry] = {}
        self._buckets: dict[tuple, list[Entry]] = {}
        self._by_nk: dict[tuple, list[Entry]] = {}  # (GPU, dtype, acc, layout, N, K) -> entries, any protocol
        for e in entries:
            self.add(e)

    def add(self, e: Entry) -> None:
        """Add ``e``; an entry with the same key (GPU, dtype, acc, layout, protocol, N, K, M range) is replaced."""
        old = self._find_same(e)
        if old is not None:
            self.entries.remove(old)
            self._index_remove(old)
        self.entries.append(e)
        self._by_nk.setdefault((e.gpu, e.dtype, e.acc, e.layout, e.N, e.K), []).append(e)
        if e.m_lo == e.m_hi:
            self._exact[(e.gpu, e.dtype, e.acc, e.layout, e.protocol, e.M, e.N, e.K)] = e
        else:  # a bucket: its members are served by it where no exact entry exists
            for mnk in e.members:
                m, n, k = (int(x) for x in mnk.split("_"))
                if (n, k) == (e.N, e.K):
                    self._exact.setdefault((e.gpu, e.dtype, e.acc, e.layout, e.protocol, m, n, k), e)
            self._buckets.setdefault((e.gpu, e.dtype, e.acc, e.layout, e.protocol, e.N, e.K), []).append(e)

    def _find_same(self, e: Entry) -> Entry | None:
        return next((x for x in self.entries if x.key() == e.key()), None)

    def _index_remove(self, e: Entry) -> None:
        self._exact = {k: v for k, v in self._exact.items() if v is not e}
        for k, v in list(self._buckets.items()):
            self._buckets[k] = [x for x in v if x is not e]
        for k, v in list(self._by_nk.items()):
            self._by_nk[k] = [x for x in v if x is not e]

    def merge(self, other: "Library") -> "Library":
        """A new library: ``self``'s entries, overridden by ``other``'s where their keys are equal."""
        out = Library(self.entries, self.sources + other.sources)
        for e in other.entries:
            out.add(e)
        return out

    def lookup(self, gpu: str, dtype: str, acc: str, layout: str, protocol: str, M: int, N: int, K: int) -> Entry | None:
        """The entry that serves this call: measured at this exact shape, else a bucket that holds M. None: vendor."""
        e = self._exact.get((gpu, dtype, acc, layout, protocol, M, N, K))
        if e is not None:
            return e
        best = None
        for b in self._buckets.get((gpu, dtype, acc, layout, protocol, N, K), ()):
            if b.m_lo <= M <= b.m_hi and (best is None or b.m_hi - b.m_lo < best.m_hi - best.m_lo):
                best = b
        return best

    def lookup_any(self, gpu: str, dtype: str, acc: str, layout: str, order: tuple[str, ...], M: int, N: int,
                   K: int) -> Entry | None:
        """The first protocol in ``order`` that has an entry (eager calls prefer offline, captures prefer graph)."""
        for p in order:
            e = self.lookup(gpu, dtype, acc, layout, p, M, N, K)
            if e is not None:
                return e
        return None

    def neighbours(self, gpu: str, dtype: str, acc: str, layout: str, M: int, N: int, K: int) -> list[Entry]:
        """The generated entries (any protocol) measured at this (N, K) at the nearest measured M at or below ``M``
        and at or above it: what an M between tuned shapes races against the vendor plans (serve/dispatch.py). A
        bucket entry counts at each of its members' M. Vendor entries are left out (the race times every vendor plan
        itself). Ordered by distance in log M, then by speedup."""
        at: dict[int, list[Entry]] = {}
        for e in self._by_nk.get((gpu, dtype, acc, layout, N, K), ()):
            if e.family == "vendor":
                continue
            for mnk in e.members or (e.mnk,):
                m, n, k = (int(x) for x in mnk.split("_"))
                if (n, k) == (N, K):
                    at.setdefault(m, []).append(e)
        below = max((m for m in at if m <= M), default=None)
        above = min((m for m in at if m >= M), default=None)
        out: list[Entry] = []
        for m in sorted({x for x in (below, above) if x is not None}, key=lambda m: (abs(math.log(m / M)), m)):
            for e in sorted(at[m], key=lambda e: -e.speedup):
                if all((e.family, e.impl) != (x.family, x.impl) for x in out):
                    out.append(e)
        return out

    def for_gpu(self, gpu: str) -> list[Entry]:
        return [e for e in self.entries if e.gpu == gpu]

    # -- files ---------------------------------------------------------------------------------------
    def to_json(self) -> str:
        ents = [e.to_dict() for e in sorted(self.entries, key=lambda e: (e.gpu, e.dtype, e.acc, e.N, e.K, e.M,
                                                                           e.layout, e.protocol))]
        return json.dumps({"format": FORMAT, "schema": SCHEMA, "sha256": _digest(ents), "entries": ents}, indent=1)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        text = self.to_json().encode()
        # a name ending .gz is written gzipped (mtime 0: the same library gives the same bytes)
        tmp.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)
        os.replace(tmp, path)  # a killed write leaves the old file, never half a file
        return path

    @staticmethod
    def load(path: str | os.PathLike) -> "Library":
        """A library JSON file, or one gzipped (any name: read by its magic bytes)."""
        path = Path(path)
        what = f"{path} is not a usable gemmrl library"
        try:
            raw = path.read_bytes()
            doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except FileNotFoundError:
            raise LibraryError(f"{path}: no such library file") from None
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LibraryError(f"{what} ({e}); delete it, or re-create it with `gemmrl lib build` / "
                               "`gemmrl lib import`") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise LibraryError(f"{what}: no \"format\": \"{FORMAT}\" header (export one with `gemmrl lib export`)")
        if doc.get("schema") != SCHEMA:
            raise LibraryError(f"{what}: schema {doc.get('schema')!r}, this gemmrl reads schema {SCHEMA}; rebuild it "
                               "from its results CSVs with `gemmrl lib build`")
        ents = doc.get("entries")
        if not isinstance(ents, list):
            raise LibraryError(f"{what}: \"entries\" is not a list")
        if doc.get("sha256") != _digest(ents):
            raise LibraryError(f"{what}: its checksum does not match its entries (edited or truncated); rebuild it "
                               "with `gemmrl lib build`, or restore it")
        try:
            return Library((Entry.from_dict(d) for d in ents), (str(path),))
        except LibraryError as e:
            raise LibraryError(f"{what}: {e}; rebuild it with `gemmrl lib build`, or restore it") from None



# -- which GPUs entries may be for -------------------------------------------------------------------------
def known_gpu(gpu: str) -> bool:
    """Whether ``gpu`` (a name as torch.cuda.get_device_name gives it) is a GPU model gemmrl knows: one it has
    datasheet peaks for (problem.GPU_PEAKS), which measuring there needs (the roofline floor), so no entry this
    project measured is for another. The match is peaks_for's: the name contains a known model ('NVIDIA H100 80GB
    HBM3' is an H100)."""
    try:
        peaks_for(gpu)
        return True
    except ProblemError:
        return False


def require_known_gpus(lib: Library, where: str) -> None:
    """Raise LibraryError (one line, naming ``where``) when an entry of ``lib`` is for no GPU model gemmrl knows:
    a name typed by hand or made up ('NVIDIA Z9000') would sit in the user library, never served anywhere.
    ``Library.load`` does not check this (a user library holding such entries keeps loading); importing does."""
    bad = sorted({e.gpu for e in lib.entries if not known_gpu(e.gpu)})
    if bad:
        n = sum(e.gpu in bad for e in lib.entries)
        names = ", ".join(repr(g[:80]) for g in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise LibraryError(
            f"{where}: {n} entr{'y is' if n == 1 else 'ies are'} for GPU {names}, no GPU model gemmrl knows (known: "
            f"names containing {' or '.join(GPU_PEAKS)}, as torch.cuda.get_device_name gives them, e.g. 'NVIDIA "
            f"H100 80GB HBM3'); nothing was imported. Export the entries on the machine they were tuned on, or "
            f"relabel them for a known model of the same compute capability: gemmrl lib export OUT --library FILE "
            f"--gpu {bad[0][:80]!r} --as-gpu 'NVIDIA H200'")


# -- where libraries live --------------------------------------------------------------------------------
PACKAGED_DIR = Path(__file__).with_name("libraries")


def user_library_path() -> Path:
    return cache_dir() / "library.json"


def add_to_user_library(entries: Iterable[Entry], gpu: str) -> tuple[Path, Library]:
    """Replace the user library's entries of ``gpu`` with ``entries`` (other GPUs' entries stay); what
    ``gemmrl.mm`` serves from the next process on (``load_default``). An unreadable user library is set aside
    (renamed ``.unreadable``), not lost. Returns (path, the entries of ``gpu`` now in it)."""
    path = user_library_path()
    old = Library()
    if path.is_file():
        try:
            old = Library.load(path)
        except LibraryError:
            path.replace(path.with_name(path.name + ".unreadable"))
    mine = Library(entries)
    Library([e for e in old.entries if e.gpu != gpu] + mine.entries, old.sources).save(path)
    return path, mine


def packaged(where: Path | None = None) -> Library:
    """The libraries shipped in the package, one per tuned GPU: ``*.json`` or gzipped ``*.json.gz`` (a per-GPU
    library with the grid and model shapes stays under 1 MB compressed)."""
    lib = Library()
    d = where or PACKAGED_DIR
    for p in sorted([*d.glob("*.json"), *d.glob("*.json.gz")]):
        lib = lib.merge(Library.load(p))
    return lib


def load_default(user: bool = True, skip_unusable: bool = False) -> Library:
    """The package's libraries, overridden by the user's (``GEMMRL_LIBRARY=FILE`` replaces both). A user library that
    cannot be read raises LibraryError, or with ``skip_unusable`` (what serving asks for: an implicit file must not
    stop every call) is skipped with one warning; a file named in ``GEMMRL_LIBRARY`` always raises."""
    env = os.environ.get("GEMMRL_LIBRARY")
    if env:
        return Library.load(env)
    lib = packaged()
    up = user_library_path()
    if user and up.is_file():
        try:
            lib = lib.merge(Library.load(up))
        except LibraryError as e:
            if not skip_unusable:
                raise
            warnings.warn(f"gemmrl: the user library {up} is not usable, serving without it ({str(e)[:200]}); "
                          "rebuild it with `gemmrl lib build` / `gemmrl lib import`, or delete it",
                          RuntimeWarning, stacklevel=2)
    return lib


# -- trials ----------------------------------------------------------------------------------------------
def _as_text(row: Mapping) -> dict[str, str]:
    """A stored row in the results schema's text form, as rows read from a results CSV are. The tuning loop's rows
    held Python values (``verified`` True, ``floor_ok`` True, ``time_ms`` a float, None), which ``usable`` and the
    library builder do not read as ``"true"``: a tuned run stored verified winners and built an empty library."""
    return {str(k): v if isinstance(v, str) else text(v) for k, v in row.items()}


class TrialsStore:
    """Every measured row, SQLite in WAL mode (several writers, e.g. tuning workers, one file)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else cache_dir() / "trials.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS trials (digest TEXT PRIMARY KEY, source TEXT, gpu TEXT, "
                        "mnk TEXT, candidate TEXT, protocol TEXT, row TEXT)")
        # one row per evaluated proposal (the tuning loop's record; a candidate counts once per shape and GPU model)
        self.db.execute("CREATE TABLE IF NOT EXISTS outcomes (gpu TEXT, mnk TEXT, dtype TEXT, acc TEXT, key TEXT, "
                        "run TEXT, proposer TEXT, family TEXT, layout TEXT, payload TEXT, name TEXT, verdict TEXT, "
                        "reward REAL, record TEXT, gpu_s REAL, worker TEXT, ts TEXT, "
                        "PRIMARY KEY (gpu, mnk, dtype, acc, key))")
        self.db.commit()

    def ingest(self, rows: Iterable[Mapping[str, str]], source: str) -> int:
        """Add rows (from ``source``); returns how many were new."""
        n0 = self.count()
        with self.db:
            for r in rows:
                row = json.dumps(dict(r), sort_keys=True)
                dig = hashlib.sha256((source + row).encode()).hexdigest()
                self.db.execute("INSERT OR IGNORE INTO trials VALUES (?,?,?,?,?,?,?)",
                                (dig, source, r.get("gpu", ""), r.get("mnk", ""), r.get("candidate", ""),
                                 r.get("protocol", ""), row))
        return self.count() - n0

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]

    def rows(self, gpu: str | None = None, sources: Iterable[str] | None = None) -> list[dict[str, str]]:
        q, args = "SELECT source, row FROM trials", []
        if gpu:
            q, args = q + " WHERE gpu = ?", [gpu]
        srcs = set(sources) if sources is not None else None
        return [dict(_as_text(json.loads(r)), source=s) for s, r in self.db.execute(q, args)
                if srcs is None or s in srcs]

    def add_outcomes(self, outcomes: Iterable[Mapping], rows: Iterable[Mapping[str, str]], source: str) -> int:
        """Store a group's outcomes (dicts with the ``outcomes`` columns) and its result rows in one transaction;
        returns how many outcomes were new (a retried candidate already stored is not stored twice)."""
        cols = ("gpu", "mnk", "dtype", "acc", "key", "run", "proposer", "family", "layout", "payload", "name",
                "verdict", "reward", "record", "gpu_s", "worker", "ts")
        n0 = self.db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]
        with self.db:
            for o in outcomes:
                self.db.execute(f"INSERT OR IGNORE INTO outcomes VALUES ({','.join('?' * len(cols))})",
                                tuple(o.get(c) for c in cols))
            for r in rows:
                r = _as_text(r)
                row = json.dumps(r, sort_keys=True)
                dig = hashlib.sha256((source + row).encode()).hexdigest()
                self.db.execute("INSERT OR IGNORE INTO trials VALUES (?,?,?,?,?,?,?)",
                                (dig, source, r.get("gpu", ""), r.get("mnk", ""), r.get("candidate", ""),
                                 r.get("protocol", ""), row))
        return self.db.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0] - n0

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file (so the one file holds everything, e.g. to copy it)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def outcomes(self, gpu: str | None = None, run: str | None = None) -> list[dict]:
        q, args, where = "SELECT * FROM outcomes", [], []
        if gpu is not None:
            where.append("gpu = ?")
            args.append(gpu)
        if run is not None:
            where.append("run = ?")
            args.append(run)
        if where:
            q += " WHERE " + " AND ".join(where)
        cur = self.db.execute(q + " ORDER BY ts, rowid", args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur]

    def close(self) -> None:
        self.db.close()


# -- building the library from measured rows ----------------------------------------------------------------
def _kind(candidate: str) -> str | None:
    for fam, prefixes in KERNELS.items():
        if candidate.startswith(prefixes):
            return fam
    if candidate in BASELINES:
        return "vendor"
    return None


def _impl(kind: str, r: Mapping[str, str]) -> str | None:
    """The kernel a generated family's row measured (its ``algo``; a ``triton:``/``cutlass:``/``tiny:`` name holds it
    too). None for a re-measured selection without ``algo`` (``cutlass-sel:graph`` does not say which config it was),
    and for a CUTLASS or tiny config that is not one of the row's layout and dtype (no entry could serve it)."""
    head, cand = KERNELS[kind][0], r.get("candidate", "")
    impl = r.get("algo") or (cand[len(head):] if cand.startswith(head) else "")
    if not impl or _impl_problems(kind, impl, r.get("layout") or "nn", r.get("dtype", "")):
        return None
    return impl


def served_desc(r: Mapping[str, str]) -> str:
    """What served a ``gemmrl`` row (``gemmrl bench --library``) in its protocol, as dispatch describes it in the
    row's ``algo`` (``eager=<desc>; graph=<desc>; hot=...``; a desc is ``<family>:<impl> (<protocol> entry ...)``,
    with a note): the graph part in ``graph``, the eager part otherwise; "" where the row says neither."""
    want = "graph=" if r.get("protocol") == "graph" else "eager="
    for part in (r.get("algo") or "").split(";"):
        if (part := part.strip()).startswith(want):
            return part[len(want):]
    return ""


def _served_kernel(r: Mapping[str, str]) -> Mapping[str, str] | None:
    """A ``gemmrl`` row (gemmrl.mm timed by ``gemmrl bench --library``) that a Triton or CUTLASS entry served, as a
    row of that config: the library's own re-measurement of a kernel it chose. The served kernel is read from the
    row's ``algo`` (``eager=<desc>; graph=<desc>; hot=...``, each desc as dispatch writes it:
    ``<family>:<impl> (<protocol> entry ...)``). None for other rows (those a vendor path or torch.matmul served
    included), and for host-timed rows whose call went through a hot path other than the one built against torch
    (``hot=torch``): the C and Python hot paths added 1-10 us per call on an H100 (the first serving run), a cost of that path,
    not of the kernel."""
    if r.get("candidate") != "gemmrl":
        return None
    if r.get("protocol") != "graph" and "hot=torch" not in (r.get("algo") or ""):
        return None
    served = served_desc(r).split(" (", 1)[0].strip()
    fam, _, impl = served.partition(":")
    if fam not in KERNELS or not impl:
        return None
    return dict(r, candidate=served, algo=impl)


_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def stale_before(rows: Iterable[Mapping[str, str]], before: Mapping[str, str]) -> tuple[list[Mapping[str, str]], int]:
    """The rows less the measurements of a Triton variant's configs timed before that variant's kernel changed
    (``before``: variant -> UTC time ``YYYY-MM-DDTHH:MM:SSZ``, as rows stamp ``timestamp``), and how many were
    dropped. A config keeps its name across a kernel change, so ``build_entries`` would otherwise take one median
    over two kernels. A ``gemmrl`` row that such a config served counts as one of its measurements and goes too;
    vendor rows and the other variants stay."""
    bad = [f"{v}={t}" for v, t in before.items() if v not in CONFIG_TYPES or not _STAMP.fullmatch(t)]
    if bad:
        raise LibraryError(f"stale-before {', '.join(bad)}: give VARIANT=YYYY-MM-DDTHH:MM:SSZ (UTC, as rows stamp "
                           f"their timestamp) with VARIANT one of {', '.join(CONFIG_TYPES)}")
    kept, dropped = [], 0
    for r in rows:
        k = _served_kernel(r) or r
        impl = _impl("triton", k) if _kind(k.get("candidate", "")) == "triton" else None
        variant = impl.split("(", 1)[0] if impl else None
        if variant in before and (r.get("timestamp") or "") < before[variant]:
            dropped += 1
            continue
        kept.append(r)
    return kept, dropped


def unjudged_repins(base: "Library", built: Iterable[Entry], rows: Iterable[Mapping[str, str]]) -> list[tuple[Entry, Entry]]:
    """(library entry, new entry) pairs where merging ``built`` would hand a cell the library serves with a generated
    kernel to a vendor path, although ``rows`` never timed that kernel in that cell (same GPU, dtype, layout,
    protocol and shape): a re-screen of another family judged the vendor paths only. ``gemmrl lib build`` warns of
    them; ``--generated-only`` keeps those cells."""
    timed = set()
    for r in rows:
        kind = _kind(r.get("candidate", ""))
        if kind in KERNELS:
            impl = _impl(kind, r)
            if impl:
                timed.add((r.get("gpu", ""), r.get("dtype", ""), r.get("layout") or "nn", r.get("protocol", ""),
                           r.get("mnk", ""), kind, impl))
    out = []
    for e in built:
        old = base._find_same(e)
        if e.family == "vendor" and old is not None and old.family != "vendor" and \
                (old.gpu, old.dtype, old.layout, old.protocol, old.mnk, old.family, old.impl) not in timed:
            out.append((old, e))
    return out


def build_entries(rows: Iterable[Mapping[str, str]], buckets: bool = True) -> list[Entry]:
    """Winners per (GPU, dtype, acc, shape, layout, protocol) over the rows' measurements (verified, timed, above
    the floor, from any number of runs; a noise-rule re-measurement counts for a candidate that has a first-run
    row): each candidate (a Triton config, a CUTLASS config with its knobs, or a vendor path with its algorithm)
    is judged by the median of its measurements, and the fastest candidate that read that layout wins.
    ``vendor_best`` is the fastest vendor path in any layout, also by median. Medians, not minima: with several
    runs a minimum picks whichever candidate drew the luckiest measurement, and the library then serves a path
    that loses in the next run. Each measurement counts relative to its own run: divided by the fastest vendor
    path's first-run time in the same run (a row's ``source``, its file) at that shape and protocol. Runs on
    different machines differ by more than the candidates do (cold small shapes: ~25% between two H100 hosts), so
    absolute times from two runs would favour a candidate timed only in the faster one. Where a run timed no vendor
    path at a shape, its rows are judged against the median of the other runs' references. With one run the
    result is the same as by absolute times; an entry's ``time_ms`` is its median absolute time and its
    ``vendor_best_ms`` is scaled from it by the relative medians (in one run: the vendor path's median time).
    A Triton or CUTLASS config is one candidate whatever label its rows carry (``triton-sel:graph``,
    ``cutlass:<config>:<knobs>``, ``cutlass-sel:graph+cold``, ...: keyed by its ``algo``), and a ``gemmrl`` row
    that it served (a ``gemmrl bench --library`` run) is one more measurement of it. With ``buckets``, Triton
    winners of one config at neighbouring measured M of one (N, K) are merged into a bucket entry that serves the
    M between them. An entry of a protocol served to eager calls (all but graph) that a vendor path won goes to a
    Triton config or vendor path with a cheaper host cost timed within HOST_BAND of it (``_cheaper_host``)."""
    times: dict[tuple, list[tuple[str, float]]] = {}  # candidate key -> [(run, time_ms)]
    first: dict[tuple, Mapping[str, str]] = {}
    ref: dict[tuple, float] = {}  # (shape, run) -> the run's fastest vendor first-run time there
    for r in rows:
        r = _served_kernel(r) or r
        kind = _kind(r.get("candidate", ""))
        if kind is None or r.get("members"):
            continue
        recheck = bool(r.get("recheck"))
        if not usable(dict(r, recheck="") if recheck else r):
            continue
        shape = (r["gpu"], r["dtype"], r["acc"], r["mnk"], r["protocol"])
        if kind == "vendor":  # a vendor path is one candidate per algorithm it ran
            name, variant = r["candidate"], r.get("algo", "")
        elif (variant := _impl(kind, r)) is None:
            continue
        else:
            name = f"{kind}:{variant}"  # a config is one candidate whatever label its rows carry
        key = shape + (r.get("layout") or "nn", kind, name, variant)
        run, t = r.get("source") or "", float(r["time_ms"])
        times.setdefault(key, []).append((run, t))
        if not recheck:
            first.setdefault(key, r)
            if kind == "vendor":
                ref[shape + (run,)] = min(ref.get(shape + (run,), math.inf), t)
    refs: dict[tuple, list[float]] = {}
    for k, t in ref.items():
        refs.setdefault(k[:5], []).append(t)
    pooled = {k: statistics.median(v) for k, v in refs.items()}  # for a run that timed no vendor path at a shape
    score: dict[tuple, tuple[float, float]] = {}  # key -> (median relative time, median absolute time)
    for key in sorted(k for k in times if k in first):
        rel = [t / (ref.get(key[:5] + (run,)) or pooled[key[:5]]) for run, t in times[key] if key[:5] in pooled]
        if rel:
            score[key] = (statistics.median(rel), statistics.median(t for _, t in times[key]))
    best: dict[tuple, tuple[tuple, tuple]] = {}   # (shape, layout) -> ((relative median, absolute), key)
    vbest: dict[tuple, tuple[tuple, tuple]] = {}  # shape -> the same, any layout
    for key, (rel, t) in score.items():
        shape, layout, kind = key[:5], key[5], key[6]
        rank = (round(rel, 9), t)  # a tie in one run (cold times come in 32 ns steps) falls to the absolute time,
        if kind == "vendor" and (shape not in vbest or rank < vbest[shape][0]):  # not to the division's last bit
            vbest[shape] = (rank, key)
        if (shape + (layout,)) not in best or rank < best[shape + (layout,)][0]:
            best[shape + (layout,)] = (rank, key)
    ranked: dict[tuple, list[tuple]] = {}  # (shape, layout) -> its candidates with a host rank (Triton, vendor)
    for key in score:
        if key[6] in ("vendor", "triton"):
            ranked.setdefault(key[:6], []).append(key)
    for cell, (rank, key) in best.items():
        if cell[4] != "graph" and key[6] == "vendor":
            best[cell] = _cheaper_host(rank, key, {k: score[k] for k in ranked[cell]})
    out: list[Entry] = []
    for (gpu, dtype, acc, mnk, proto, layout), (_rank, key) in best.items():
        if (gpu, dtype, acc, mnk, proto) not in vbest:
            continue  # no vendor reference measured: nothing to claim against
        vkey = vbest[(gpu, dtype, acc, mnk, proto)][1]
        (rel, t), vrel = score[key], score[vkey][0]
        vt = score[vkey][1] if vkey == key else t * vrel / rel
        r = first[key]
        M, N, K = (int(x) for x in mnk.split("_"))
        fam = key[6]
        impl = r["candidate"] if fam == "vendor" else key[8]
        out.append(Entry(gpu=gpu, cc=r.get("cc", ""), dtype=dtype, acc=acc, layout=layout, protocol=proto, M=M, N=N,
                         K=K, family=fam, impl=impl, algo=r.get("algo", ""), time_ms=t, vendor_best_ms=vt,
                         vendor_best=vkey[7], m_lo=M, m_hi=M, members=(mnk,), verified=True, torch=r.get("torch", ""),
                         triton=r.get("triton", ""), cuda=r.get("cuda", ""), driver=r.get("driver", ""),
                         git_sha=r.get("git_sha", ""), timestamp=r.get("timestamp", ""), source=r.get("source", "")))
    return bucketize(out) if buckets else out


# Host cost of the paths an eager call can take, cheapest first: what it pays besides the kernel. Measured on the
# H100 in CUDA-L2's offline mode (the completed measure pass, h100_grid1000-offline_library-cublaslt-autotuned_offline_3cb2dd4_*):
# per call against the cuBLASLt extension (cublaslt_autotuned), gemmrl.mm serving a cuBLASLt path +0.0 us median,
# cuBLAS (cublasGemmEx) +2.3..2.5 us, torch.matmul +10.1 us, on kernels of about the same device time; a Triton
# config through the direct launch path -6 us (device time included; its host cost alone 7.3-9.7 us a call against
# 10.4-13.8 us for the cuBLASLt extension, the first serving run). CUTLASS entries are not ranked (one offline shape: +14 us).
HOST_ORDER = ("triton", "cublaslt", "cublas", "torch")
HOST_BAND = 0.02  # device time an eager entry gives up for a cheaper host path: the noise rule's 2%


def host_rank(path: str) -> int:
    """A candidate's place in HOST_ORDER by its name (``triton:<config>``, a vendor path); len(HOST_ORDER) for
    anything else."""
    return next((i for i, p in enumerate(HOST_ORDER) if path.startswith(p)), len(HOST_ORDER))


def _cheaper_host(rank: tuple, key: tuple, score: Mapping[tuple, tuple[float, float]]) -> tuple[tuple, tuple]:
    """An eager entry (every protocol but graph: the call pays its path's host cost) won by the vendor path ``key``
    gives way to another candidate of the same shape, protocol and layout (``score``: the Triton configs and vendor
    paths there, key -> (relative median, median time)) with a cheaper host path (``host_rank``) timed within
    HOST_BAND of it: the cheapest such, then the fastest. The device time it gives up is inside the noise rule's
    band; the host time it saves (2-10 us a call, HOST_ORDER) is most of a small shape's eager call."""
    pick = (host_rank(key[7]), rank, key)
    for k, (rel, t) in score.items():
        if host_rank(k[7]) < pick[0] and rel <= score[key][0] * (1 + HOST_BAND):
            pick = min(pick, (host_rank(k[7]), (round(rel, 9), t), k))
    return pick[1], pick[2]


def bucketize(entries: list[Entry]) -> list[Entry]:
    """Exact entries stay; where neighbouring measured M (same GPU, dtype, acc, layout, protocol, N, K) were won
    by the same Triton config, one bucket entry spanning them is added (its time and vendor time: the worst
    speedup among its members, so it never claims more than its weakest member). Triton only: a CUTLASS config
    takes any M at run time too, but its tile scheduler knobs (swizzle, split-K) were picked for the measured
    grid of tiles, so its winners stay exact entries until an unmeasured M is shown not to lose."""
    out = list(entries)
    by: dict[tuple, list[Entry]] = {}
    for e in entries:
        by.setdefault((e.gpu, e.dtype, e.acc, e.layout, e.protocol, e.N, e.K), []).append(e)
    for group in by.values():
        group.sort(key=lambda e: e.M)
        run: list[Entry] = []
        for e in group + [None]:
            if (e is not None and run and family(e.family).buckets
                    and (e.family, e.impl) == (run[-1].family, run[-1].impl)):
                run.append(e)
                continue
            if len(run) > 1:
                worst = min(run, key=lambda x: x.speedup)
                out.append(replace(worst, m_lo=run[0].M, m_hi=run[-1].M, members=tuple(x.mnk for x in run)))
            run = [e] if e is not None else []
    return out
