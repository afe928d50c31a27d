"""What the `gemmrl` subcommands share: the usage error and its exit code, the shape flags and the checks of the
flags every shape-taking subcommand has (shapes, protocols, ``--part``, ``--out``).

    from .common import CliError, problems_from, shape_args
    shape_args(parser)                      # --mnk/--grid/--sample/--seed/--shapes/--part/--dtype/--acc/...
    problems, what = problems_from(args)    # CliError (exit 2, one line) on a bad combination
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from ..problem import grid, parse_mnk, parse_part, part_of, read_shapes, sample_grid
from ..results import COLUMNS
from ..timing import PROTOCOLS

EXIT_USAGE = 2


class CliError(Exception):
    pass


def comma_list(text: str | None) -> tuple[str, ...]:
    """A comma list as given on the command line, blanks dropped."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def parse_protocols(text: str) -> tuple[str, ...]:
    ps = comma_list(text)
    bad = [p for p in ps if p not in PROTOCOLS]
    if bad or not ps:
        raise CliError(f"--protocol takes a comma list of {', '.join(PROTOCOLS)}; got {text!r}")
    return ps


def problems_from(args) -> tuple[list, str]:
    """(problems, short name of what is measured) from --mnk / --grid / --shapes (and the checks of the other
    flags every shape-taking subcommand shares)."""
    kw = {"dtype": args.dtype, "acc": args.acc}
    chosen = [x for x in (args.mnk, args.grid, args.shapes) if x]
    if len(chosen) != 1:
        raise CliError("give exactly one of --mnk M_N_K, --grid cuda-l2 or --shapes FILE")
    if args.sample is not None and not args.grid:
        raise CliError("--sample N draws N shapes of --grid cuda-l2; with --mnk or --shapes leave it out")
    if args.gpu_device_id is not None and args.gpu_device_id < 0:
        raise CliError(f"--gpu-device-id takes a GPU index >= 0 (as nvidia-smi lists them), got {args.gpu_device_id}")
    part = parse_part(args.part) if getattr(args, "part", None) else None
    if args.mnk:
        ps = [parse_mnk(s, **kw) for s in args.mnk.split(",")]
        what = ps[0].mnk if len(ps) == 1 else f"{len(ps)}shapes"
    elif args.grid:
        if args.grid != "cuda-l2":
            raise CliError(f"--grid knows only 'cuda-l2', got {args.grid!r}")
        if args.sample is not None:
            ps, what = sample_grid(args.sample, args.seed, **kw), f"grid{args.sample}s{args.seed}"
        else:
            ps, what = grid(**kw), "grid1000"
    else:
        if not Path(args.shapes).is_file():
            raise CliError(f"--shapes {args.shapes}: no such file (one M_N_K per line)")
        ps, what = read_shapes(args.shapes, **kw), Path(args.shapes).stem
    if part is None:
        return ps, what
    return apply_part(ps, args.part), f"{what}-part{part[0]}of{part[1]}"


def apply_part(ps: list, text: str) -> list:
    """``--part K/N`` of these shapes (``problem.part_of``), refused when there are fewer shapes than parts."""
    k, n = parse_part(text)
    if n > len(ps):
        raise CliError(f"--part {text}: {len(ps)} shape(s) cannot make {n} parts; give N <= {len(ps)}")
    return part_of(ps, k, n)


def check_out(out: Path, flag: str = "--out") -> None:
    """--out is a directory (file name derived) or a .csv that an earlier run of this version wrote (resumed): refuse
    anything else before any work, so a wrong path never costs a run nor touches a file that is not ours."""
    if out.suffix != ".csv":
        if out.exists() and not out.is_dir():
            raise CliError(f"{flag} {out}: an existing file that is not a .csv; give a directory or a .csv path")
        return
    if out.is_dir():
        raise CliError(f"{flag} {out}: a directory; give a .csv path (or the directory without the .csv name)")
    if out.is_file() and out.stat().st_size:
        try:
            with open(out, newline="") as fh:
                header = next(csv.reader([fh.readline()]), [])
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"{flag} {out}: cannot read it ({e}); give a new {flag}") from None
        if tuple(header) != COLUMNS:
            raise CliError(f"{flag} {out}: not a results CSV this gemmrl writes (other columns), so it cannot be "
                           f"resumed; give a new {flag} (the file is left as it is)")


def gpu_slug() -> str:
    """Short name of the current GPU model (h100, h200, ...) for derived output file names."""
    import torch  # start-up cost: only a run that names its output file needs torch, never --help

    name = torch.cuda.get_device_name(torch.cuda.current_device()).lower()
    for key in ("h200", "h100", "a100", "l40", "b200", "4090", "3090"):
        if key in name:
            return key
    return "".join(ch for ch in name.replace("nvidia", "") if ch.isalnum())[:12] or "gpu"


def shape_args(p: argparse.ArgumentParser) -> None:
    """The shape flags (read by ``problems_from``) and the device and imported-kernel flags they come with."""
    p.add_argument("--mnk", help="one shape M_N_K (or a comma list), e.g. 64_4096_64")
    p.add_argument("--grid", help="'cuda-l2': CUDA-L2's 1000 grid shapes")
    p.add_argument("--sample", type=int, help="with --grid: a reproducible sample of N shapes")
    p.add_argument("--seed", type=int, default=0, help="sample seed (timing seeds are drawn fresh for every measurement and recorded in the rows)")
    p.add_argument("--shapes", help="file with one M_N_K per line")
    p.add_argument("--part", help="K/N: only the K-th of N interleaved parts of those shapes (by FLOPs, so each part "
                                  "is a like mix; e.g. --grid cuda-l2 --part 1/5 for a 200-shape chunk)")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--acc", default="fp32", choices=("fp32", "fp16"), help="accumulator (fp16 is its own mode)")
    p.add_argument("--gpu-device-id", type=int, default=0)
    p.add_argument("--kernel-dir", help="directory of CUDA-L2-style M_N_K.cu files to import and measure")
    p.add_argument("--kernel-acc", default="fp32", choices=("fp32", "fp16"),
                   help="accumulator the imported set claims (checked by the battery, not trusted)")
