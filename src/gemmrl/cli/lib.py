"""``gemmrl lib list|show|build|export|import|verify`` and ``gemmrl warmup``: the library from the command line.

    gemmrl lib list
    gemmrl lib show 64_4096_64 --dtype bf16
    gemmrl lib build benchmarks/results/h100/h100_*.csv --out library.json
    gemmrl warmup --shapes shapes.txt --layouts tn,nn
    gemmrl warmup --model qwen2.5-7b --tokens 1-8192 --layouts tn
"""

from __future__ import annotations

import sqlite3
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from ..candidate import make_buffers
from ..library import (AS_GPU_SOURCE, FAMILIES, PROTOCOL_ORDER, Library, LibraryError, TrialsStore, build_entries,
                      known_gpu, load_default, require_known_gpus, stale_before, unjudged_repins, user_library_path)
from ..models import model_shapes
from ..problem import GemmProblem, parse_mnk
from ..results import ResultsError, read_rows
from ..summary import BASELINES, usable
from .common import CliError, comma_list, problems_from, shape_args


class LibCliError(Exception):
    pass


def _load(path: str | None) -> Library:
    try:
        return Library.load(path) if path else load_default()
    except LibraryError as e:
        raise LibCliError(str(e)) from None


def _writable(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise LibCliError(f"{path} is a directory; give a file name for the library JSON, e.g. {path / 'library.json'}")
    return path


def _save(lib: Library, path: Path) -> None:
    try:
        lib.save(_writable(path))
    except OSError as e:
        raise LibCliError(f"cannot write {path}: {e}") from None


def cmd_list(args) -> int:
    lib = _load(args.library)
    print(f"sources: {', '.join(lib.sources) or '(none: no packaged or user library)'}")
    print(f"user library: {user_library_path()}")
    c = Counter((e.gpu, e.dtype, e.protocol, e.family, "bucket" if e.m_hi > e.m_lo else "exact") for e in lib.entries)
    print(f"{'gpu':28} {'dtype':5} {'protocol':8} {'family':7} {'kind':6} {'entries':>7}")
    for (gpu, dt, proto, fam, kind), n in sorted(c.items()):
        print(f"{gpu[:28]:28} {dt:5} {proto:8} {fam:7} {kind:6} {n:7d}")
    fam = Counter(e.family for e in lib.entries)
    ours = len(lib.entries) - fam["vendor"]
    print(f"{len(lib.entries)} entries; {ours} serve a generated kernel ({_generated(fam)}), {fam['vendor']} a vendor "
          "path")
    return 0


def _generated(fam: Counter) -> str:
    """Entries per generated family that has any, e.g. '3 triton, 2 cutlass' ('none' if no family has one)."""
    return ", ".join(f"{fam[f]} {f}" for f in FAMILIES if f != "vendor" and fam[f]) or "none"


def cmd_show(args) -> int:
    lib = _load(args.library)
    p = parse_mnk(args.mnk, dtype=args.dtype)
    gpus = [args.gpu] if args.gpu else sorted({e.gpu for e in lib.entries}) or ["(none)"]
    for gpu in gpus:
        for layout in ("tn", "nn"):
            for mode, order in PROTOCOL_ORDER.items():
                e = lib.lookup_any(gpu, p.dtype, p.acc, layout, order, p.M, p.N, p.K)
                what = "vendor fallback (torch.matmul)" if e is None else (
                    f"{e.family}:{e.impl}  [{e.protocol} entry at {e.mnk}"
                    f"{'' if e.m_lo == e.m_hi else f', bucket M {e.m_lo}..{e.m_hi}'}; {e.time_ms * 1e3:.2f} us vs "
                    f"vendor_best {e.vendor_best_ms * 1e3:.2f} us ({e.vendor_best}), x{e.speedup:.3f}]")
                print(f"{gpu[:28]:28} {p.mnk} {layout} {mode:5}: {what}")
    return 0


def torch_only_shapes(rows) -> list[str]:
    """Shapes whose verified vendor rows are all ``torch`` (a run whose cuBLAS baselines failed, e.g. grid parts 3-5
    of the first grid tune): a library built from them alone claims speedups over torch, not over vendor_best."""
    seen: dict[str, set] = {}
    for r in rows:
        if r.get("candidate") in BASELINES and usable(r):
            seen.setdefault(r["mnk"], set()).add(r["candidate"])
    return sorted(m for m, names in seen.items() if names == {"torch"})


def cmd_build(args) -> int:
    if args.generated_only and args.replace:
        raise LibCliError("--generated-only merges these rows' generated winners into an existing library; drop "
                          "--replace (or drop --generated-only to build a library from these rows alone)")
    out = _writable(args.out) if args.out else user_library_path()
    try:
        store = TrialsStore(args.trials) if args.trials else TrialsStore()
    except (sqlite3.Error, OSError) as e:
        raise LibCliError(f"cannot open the trials store {args.trials or 'in the cache directory'}: {e} "
                          "(give another file with --trials)") from None
    rows = []
    try:
        for path in args.results:
            try:
                rs = read_rows([path])
            except (ResultsError, OSError) as e:
                raise LibCliError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
            new = store.ingest(rs, Path(path).name)
            print(f"{path}: {len(rs)} rows ({new} new in the trials store {store.path})")
            rows += [dict(r, source=Path(path).name) for r in rs]
    finally:
        store.close()
    if args.stale_before:
        try:
            rows, dropped = stale_before(rows, dict(x.partition("=")[::2] for x in args.stale_before))
        except LibraryError as e:
            raise LibCliError(str(e)) from None
        print(f"--stale-before {' '.join(args.stale_before)}: {dropped} rows left out (timed before the kernel changed)")
    entries = build_entries(rows, buckets=not args.no_buckets)
    if args.generated_only:
        kept = [e for e in entries if e.family != "vendor"]
        print(f"--generated-only: {len(entries) - len(kept)} vendor entries of these rows left out (the library's "
              "entries for those cells stay)")
        entries = kept
        if not entries:
            raise LibCliError("--generated-only: no generated kernel won a cell in these rows; nothing to merge")
    if not entries:
        raise LibCliError("no winners: the files hold no verified, timed rows of both a kernel and a vendor path")
    torch_only = torch_only_shapes(rows)
    if torch_only:
        print(f"warning: {len(torch_only)} shape(s) have torch as their only vendor path in these files (e.g. "
              f"{', '.join(torch_only[:3])}): their entries are judged against torch, not every cuBLAS path; add a run "
              "that timed the cuBLAS baselines (gemmrl bench) before serving them")
    built = Library(entries)
    base = Library()
    if out.is_file() and not args.replace:
        base = _load(str(out))
    repins = unjudged_repins(base, entries, rows)
    if repins:
        (old, new), n = repins[0], len(repins)
        print(f"warning: {n} cell(s) the library serves with a generated kernel go to a vendor path from rows that "
              f"never timed that kernel there (e.g. {old.mnk} {old.layout} {old.protocol}: {old.family}:{old.impl} -> "
              f"{new.impl}); to keep them, build from the same files with --generated-only")
    lib = base.merge(built)
    _save(lib, out)
    fam = Counter(e.family for e in entries)
    print(f"{len(entries)} entries ({len(entries) - fam['vendor']} generated: {_generated(fam)}; {fam['vendor']} "
          f"vendor) -> {out} ({len(lib.entries)} entries in all)")
    return 0


def retarget(lib: Library, gpu: str) -> Library:
    """``lib``'s entries relabelled for GPU model ``gpu`` (one of the same compute capability: the same kernels run
    there), so the dispatcher serves them on it until that GPU is tuned. Times stay those measured on the source GPU;
    each entry's ``source`` says so. One source GPU only: two would give one cell two different answers."""
    src = sorted({e.gpu for e in lib.entries})
    if len(src) != 1:
        raise LibCliError(f"--as-gpu relabels the entries of one GPU; this library has {len(src)} "
                          f"({', '.join(src) or 'none'}): pick one with --gpu")
    if src[0] == gpu:
        raise LibCliError(f"the entries are already {gpu}'s")
    return Library(replace(e, gpu=gpu, source=f"{AS_GPU_SOURCE}{e.gpu}: {e.source}") for e in lib.entries)


def cmd_export(args) -> int:
    lib = _load(args.library)
    if args.gpu:
        lib = Library(lib.for_gpu(args.gpu))
        if not lib.entries:
            raise LibCliError(f"no entries for GPU {args.gpu!r} (`gemmrl lib list` names the GPUs the library has)")
    if args.as_gpu:
        lib = retarget(lib, args.as_gpu)
        if not known_gpu(args.as_gpu):
            print(f"warning: {args.as_gpu!r} is no GPU model gemmrl knows: `gemmrl lib import` will refuse "
                  f"{args.out}", file=sys.stderr)
    _save(Library(lib.entries), Path(args.out))
    print(f"{len(lib.entries)} entries -> {args.out}" + (f" (as {args.as_gpu})" if args.as_gpu else ""))
    return 0


def cmd_import(args) -> int:
    new = _load(args.file)
    try:  # checked before the user library is read or written: a refused file changes nothing
        require_known_gpus(new, args.file)
    except LibraryError as e:
        raise LibCliError(str(e)) from None
    up = user_library_path()
    base = _load(str(up)) if up.is_file() else Library()
    lib = base.merge(new)
    _save(lib, up)
    print(f"{len(new.entries)} entries from {args.file} merged into {up} ({len(lib.entries)} in all)")
    return 0


def cmd_verify(args) -> int:
    """Run the battery on every entry of this GPU (at its measured shapes); exit 1 if any fails."""
    import torch  # start-up cost: torch

    from ..serve import dispatch, launchers  # start-up cost: imports torch
    from ..verify import verify  # start-up cost: the battery, not needed by --help

    if not torch.cuda.is_available():
        raise LibCliError("gemmrl lib verify runs the correctness battery on the GPU; no CUDA device here")
    lib = _load(args.library)
    dev = torch.device("cuda", torch.cuda.current_device())
    gpu, sw = dispatch._identity(dev)
    ents = [e for e in lib.for_gpu(gpu) if e.m_lo == e.m_hi]
    if not ents:
        print(f"no entries for {gpu} in {', '.join(lib.sources) or 'the library'}")
        return 0
    bad = 0
    for e in ents:
        p = GemmProblem(e.M, e.N, e.K, dtype=e.dtype, acc=e.acc, layout=e.layout)
        bufs = make_buffers(p, dev)
        try:
            v = verify(launchers.launch(e, p, bufs).candidate, p, "cuda")
            ok, why = v.passed, v.reason
        except Exception as ex:  # noqa: BLE001
            ok, why = False, f"{type(ex).__name__}: {ex}"
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {e.mnk} {e.layout} {e.protocol} {e.family}:{e.impl} {why}"[:240])
    print(f"{len(ents) - bad} of {len(ents)} entries pass the battery on {gpu}")
    return 1 if bad else 0


MAX_TOKENS = 65536


def token_ms(spec: str) -> list[int]:
    """The token counts (M) ``--tokens`` asks to warm: a range ``LO-HI`` gives one M per bucket of M the vendor
    fallback shares a choice over (powers of two: LO, then each power of two up to HI), a comma list gives itself."""
    try:
        if "-" in spec.strip()[1:]:
            lo, hi = (int(x) for x in spec.split("-"))
            if not 1 <= lo <= hi <= MAX_TOKENS:
                raise ValueError
            ms = [lo] + [1 << i for i in range(lo.bit_length(), hi.bit_length()) if (1 << i) <= hi]
        else:
            ms = sorted({int(x) for x in comma_list(spec)})
            if not ms or not 1 <= ms[0] <= ms[-1] <= MAX_TOKENS:
                raise ValueError
    except ValueError:
        raise CliError(f"--tokens {spec!r}: give a range LO-HI (e.g. 1-8192) or a comma list (e.g. 1,16,64) of token "
                       f"counts in 1..{MAX_TOKENS}") from None
    return ms


def warmup_problems(args) -> list[GemmProblem]:
    """The shapes `gemmrl warmup` builds: a model's layers at ``--tokens``, or --mnk / --grid / --shapes."""
    if args.model is None:
        if args.tokens is not None:
            raise CliError("--tokens goes with --model (the token counts of that model's layers)")
        return problems_from(args)[0]
    if any((args.mnk, args.grid, args.shapes)):
        raise CliError("give one of --model, --mnk, --grid or --shapes")
    try:
        return model_shapes(args.model, token_ms(args.tokens or "1-8192"), dtype=args.dtype, acc=args.acc)
    except ValueError as e:
        raise CliError(str(e)) from None


def cmd_warmup(args) -> int:
    """`gemmrl warmup`: build what serves these shapes now (compiles into the on-disk caches; races the vendor
    fallback once per bucket of M where no entry serves)."""
    problems = warmup_problems(args)
    layouts = comma_list(args.layouts)
    if not layouts or set(layouts) - {"tn", "nn"}:
        raise CliError(f"--layouts takes tn and/or nn, got {args.layouts!r}")
    from ..serve import dispatch  # start-up cost: imports torch

    import torch  # start-up cost: torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    for r in dispatch.warmup([(p.M, p.N, p.K) for p in problems], dtype=dt, layouts=layouts):
        print(f"{r['mnk']:>20} {r['layout']}  eager: {r['eager']}\n{'':>23} graph: {r['graph']}", flush=True)
    return 0


def add_parser(sub) -> None:
    """`gemmrl lib ...` and `gemmrl warmup`."""
    lib = sub.add_parser("lib", help="the library of winners: list, show, build, export, import, verify")
    lib.set_defaults(func=cmd_lib)
    ls = lib.add_subparsers(dest="lib_cmd", required=True)
    p = ls.add_parser("list", help="entries per GPU, dtype, protocol and family")
    p.add_argument("--library", help="a library JSON (default: the package's, overridden by the user's)")
    p.set_defaults(lib_func=cmd_list)
    p = ls.add_parser("show", help="what serves one shape, per layout and mode (eager / CUDA graph)")
    p.add_argument("mnk")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--gpu", help="GPU model name as results rows record it (default: every GPU in the library)")
    p.add_argument("--library")
    p.set_defaults(lib_func=cmd_show)
    p = ls.add_parser("build", help="winners from result CSVs (gemmrl bench/select rows) into the user library")
    p.add_argument("results", nargs="+", metavar="RESULTS.csv")
    p.add_argument("--out", help="write this library JSON instead of the user library")
    p.add_argument("--replace", action="store_true", help="start from an empty library instead of merging")
    p.add_argument("--no-buckets", action="store_true", help="exact shapes only (no M ranges)")
    p.add_argument("--generated-only", action="store_true",
                   help="merge only the cells these rows give a generated kernel; every other entry of the library "
                        "stays (a re-screen of one family did not time the kernels of others the library serves)")
    p.add_argument("--trials", help="trials store (default: the cache directory's trials.sqlite)")
    p.add_argument("--stale-before", nargs="+", metavar="VARIANT=UTC", default=[],
                   help="leave out the rows of a Triton variant's configs timed before its kernel changed, e.g. "
                        "splitk=2026-11-26T09:00:00Z (its configs keep their names: without this one median would "
                        "mix both kernels)")
    p.set_defaults(lib_func=cmd_build)
    p = ls.add_parser("export", help="write the library (or one GPU's part) to a JSON file")
    p.add_argument("out")
    p.add_argument("--gpu", help="only this GPU model's entries (the name `gemmrl lib list` shows)")
    p.add_argument("--as-gpu", metavar="NAME",
                   help="relabel the entries for GPU model NAME (as torch.cuda.get_device_name gives it) of the same "
                        "compute capability, e.g. 'NVIDIA H200' from an H100 library: served there until it is "
                        "tuned, with the times measured on the source GPU")
    p.add_argument("--library")
    p.set_defaults(lib_func=cmd_export)
    p = ls.add_parser("import", help="merge a library JSON into the user library (checked first)")
    p.add_argument("file")
    p.set_defaults(lib_func=cmd_import)
    p = ls.add_parser("verify", help="run the correctness battery on this GPU's entries")
    p.add_argument("--library")
    p.set_defaults(lib_func=cmd_verify)
    w = sub.add_parser("warmup", help="build what serves these shapes now (compiles into the on-disk caches)")
    shape_args(w)
    w.add_argument("--model", help="a model's linear layers (gemmrl tune --model's names; comma list or all)")
    w.add_argument("--tokens", help="with --model: token counts, a range LO-HI (one per bucket of M, default 1-8192) "
                                    "or a comma list")
    w.add_argument("--layouts", default="tn,nn")
    w.set_defaults(func=cmd_warmup)


def cmd_lib(args) -> int:
    try:
        return args.lib_func(args)
    except LibCliError as e:
        print(f"gemmrl lib {args.lib_cmd}: error: {e}", file=sys.stderr)
        return 2
