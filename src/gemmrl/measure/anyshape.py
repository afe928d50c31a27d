"""The shapes "any shape" is measured on, drawn from a committed seed before anything is measured.

- **Model shapes**: the linear layers of the six models of ``gemmrl tune --model`` (``models.MODELS``), layout ``tn``,
  at token counts M drawn in the bands ``M_BANDS`` (between the token counts a library is tuned at, 1, 16, 64, 256,
  1024, 4096, and the bucket edges 8 and 8192), log-uniform inside a band; the same number per band (the remainder
  to the first bands), the models in turn; none an exact entry or a measured bucket member of the library under test for that GPU.
- **Random shapes**: M, N and K log-uniform in [1, 16384]; two thirds rounded up to multiples of 8 in every dim, a
  third with N or K (or both) not a multiple of 8.
- **A new user's journey** (``--journey MODEL``): the model's layers at the token counts ``gemmrl tune --model`` tunes
  (its ladder, ``models.TOKENS``), and off the ladder: ``--per-band`` shapes per band of M, its layers in turn.

    python -m gemmrl.measure.anyshape --seed 0 --out benchmarks/shapes   # writes the files and prints what it drew
    python -m gemmrl.measure.anyshape --journey qwen2.5-7b --seed 0       # the journey's two files
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from ..library import Library
from ..models import ALIASES, MODELS, model_shapes as ladder_shapes
from ..problem import GemmProblem

M_BANDS = ((2, 7), (9, 15), (17, 63), (65, 255), (257, 1023), (1025, 4095), (4097, 8192))
MAX_DIM = 16384


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _held(lib: Library | None, gpu: str, p: GemmProblem) -> bool:
    """Whether the library holds ``p`` as an exact entry or a measured bucket member (any protocol)."""
    if lib is None:
        return False
    return any(e.gpu == gpu and e.dtype == p.dtype and e.layout == p.layout and e.N == p.N and e.K == p.K
               and (e.M == p.M or p.mnk in e.members) for e in lib.entries)


def model_shapes(n: int, seed: int, dtype: str, lib: Library | None = None, gpu: str = "") -> list[GemmProblem]:
    """``n`` model shapes in ``dtype`` (see the module), seeded, spread evenly over the bands of M."""
    rng = random.Random(f"models|{seed}|{dtype}")
    models = sorted(MODELS)
    per = [n // len(M_BANDS) + (i < n % len(M_BANDS)) for i in range(len(M_BANDS))]
    out: list[GemmProblem] = []
    for (lo, hi), want in zip(M_BANDS, per):
        got, tries = 0, 0
        while got < want:
            tries += 1
            if tries > 100 * max(1, want):
                raise ValueError(f"could not draw {want} shapes with M in {lo}..{hi} that the library does not hold")
            model = models[len(out) % len(models)]  # every model in turn, a random layer of it
            N, K = rng.choice(sorted(MODELS[model].values()))
            p = GemmProblem(_log_uniform(rng, lo, hi), N, K, dtype=dtype, acc="fp32", layout="tn")
            if p in out or _held(lib, gpu, p):
                continue
            out.append(p)
            got += 1
    return out


def random_shapes(n: int, seed: int, dtype: str = "fp16") -> list[GemmProblem]:
    """``n`` random shapes (see the module), seeded; every third has N or K not a multiple of 8."""
    rng = random.Random(f"random|{seed}")
    out: list[GemmProblem] = []
    while len(out) < n:
        M, N, K = (_log_uniform(rng, 1, MAX_DIM) for _ in range(3))
        if len(out) % 3 == 2:  # N or K off a multiple of 8
            if N % 8 == 0 and K % 8 == 0:
                N = N - 1 if N > 1 else N + 1
        else:
            M, N, K = (min(MAX_DIM, -(-d // 8) * 8) for d in (M, N, K))
        p = GemmProblem(M, N, K, dtype=dtype, acc="fp32", layout="tn")
        if p not in out:
            out.append(p)
    return out


def journey_shapes(model: str, seed: int, per_band: int = 2, dtype: str = "fp16"
                   ) -> tuple[list[GemmProblem], list[GemmProblem]]:
    """(the ladder, off the ladder) of ``model`` (see the module), layout tn, seeded: off the ladder ``per_band``
    shapes in each band of M, the model's layers in turn, none at a ladder M."""
    name = ALIASES.get(model.strip().lower(), model.strip().lower())
    ladder = [p.with_(layout="tn") for p in ladder_shapes(name, dtype=dtype)]  # ValueError for an unknown model
    rng = random.Random(f"journey|{name}|{seed}|{dtype}")
    layers = sorted(MODELS[name].values())
    off: list[GemmProblem] = []
    for lo, hi in M_BANDS:
        for _ in range(per_band):
            N, K = layers[len(off) % len(layers)]
            while True:
                p = GemmProblem(_log_uniform(rng, lo, hi), N, K, dtype=dtype, acc="fp32", layout="tn")
                if p not in off and p not in ladder:
                    break
            off.append(p)
    return ladder, off


def fewest_flops(by_dtype: dict[str, list[GemmProblem]], n: int) -> dict[str, list[GemmProblem]]:
    """The ``n`` problems of fewest FLOPs over all dtypes together (ties by dtype, then M, N, K), kept per dtype in
    their drawn order: the server mode's set (small calls, where host cost shows)."""
    ranked = sorted(((2 * p.M * p.N * p.K, dt, p.M, p.N, p.K, i) for dt, ps in by_dtype.items()
                     for i, p in enumerate(ps)))[:n]
    keep = {(dt, i) for _, dt, _, _, _, i in ranked}
    return {dt: [p for i, p in enumerate(ps) if (dt, i) in keep] for dt, ps in by_dtype.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/shapes")
    ap.add_argument("--models", type=int, default=30, help="model shapes per dtype (fp16 and bf16)")
    ap.add_argument("--random", type=int, default=40)
    ap.add_argument("--fewest-flops", type=int, default=20,
                    help="also write the model shapes of fewest FLOPs over both dtypes, per dtype (the server set)")
    ap.add_argument("--library", help="the library under test (its held shapes are left out)")
    ap.add_argument("--gpu", default="NVIDIA H200", help="the GPU model whose entries are left out")
    ap.add_argument("--journey", metavar="MODEL", help="write only a new user's journey files for MODEL (its ladder and "
                                                      "shapes off it)")
    ap.add_argument("--per-band", type=int, default=2, help="--journey: shapes off the ladder per band of M")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.journey:
        try:
            ladder, off = journey_shapes(args.journey, args.seed, args.per_band)
        except ValueError as e:
            ap.error(str(e))
        name = ALIASES.get(args.journey.strip().lower(), args.journey.strip().lower())
        for fname, ps, what in ((f"journey_{name}_ladder.txt", ladder, "at the token counts tune tunes"),
                                (f"journey_{name}_off-ladder_seed{args.seed}.txt", off,
                                 f"{args.per_band} per band of M off them")):
            (out / fname).write_text(f"# {fname}: python -m gemmrl.measure.anyshape --journey {name} --seed {args.seed}"
                                     f" --per-band {args.per_band} ({name}'s layers {what}; layout tn)\n"
                                     + "".join(f"{p.mnk}\n" for p in ps))
            print(f"{out / fname}: {len(ps)} shapes")
        return 0
    lib = Library.load(args.library) if args.library else None
    drawn = {dt: model_shapes(args.models, args.seed, dt, lib, args.gpu) for dt in ("fp16", "bf16")}
    files = {f"anyshape_models{args.models}_{dt}_seed{args.seed}.txt": ps for dt, ps in drawn.items()}
    notes: dict[str, str] = {}
    if args.fewest_flops:
        for dt, ps in fewest_flops(drawn, args.fewest_flops).items():
            name = f"anyshape_models{args.models}_{dt}_seed{args.seed}_fewest-flops{args.fewest_flops}-of-{2 * args.models}.txt"
            files[name] = ps
            notes[name] = f"; the {args.fewest_flops} of fewest FLOPs over the fp16 and bf16 model files, these in {dt}"
    files[f"anyshape_random{args.random}_seed{args.seed}.txt"] = random_shapes(args.random, args.seed)
    for name, ps in files.items():
        how = f"--seed {args.seed}" + (f" --library {args.library} --gpu '{args.gpu}'" if args.library else "")
        (out / name).write_text(f"# {name}: python -m gemmrl.measure.anyshape {how} (layout tn{notes.get(name, '')})\n"
                                + "".join(f"{p.mnk}\n" for p in ps))
        print(f"{out / name}: {len(ps)} shapes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
