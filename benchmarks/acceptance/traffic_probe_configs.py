"""Config lists for the traffic probe: does L2->SM traffic (A re-read once per N tile, B once per M tile)
set the pace on decode (M 8-32) and few-tile long-K shapes, so that wide tiles with a deeper split beat the cost
model's picks?  Writes two `gemmrl select --configs @FILE` lists:

  decode:  smallm on tensor cores, BM 16 and 32, BN 16..256 with the split that gives ~128-256 programs at N = 4096
  fewtile: split-K, tiles 64x64..256x128, splits 2..16, kept where some probe shape gets 96..300 programs

    python benchmarks/acceptance/traffic_probe_configs.py --decode benchmarks/configs/traffic_probe_decode.txt \
        --fewtile benchmarks/configs/traffic_probe_fewtile.txt --fewtile-shapes benchmarks/shapes/fewtile_probe9.txt

Only configs the validity predicate accepts for at least one probe shape are written."""

from __future__ import annotations

import argparse
import itertools

from gemmrl.kernels.triton_gemm.configs import SmallMConfig, SplitKConfig, valid
from gemmrl.problem import GemmProblem, read_shapes


def decode_configs(shapes: list[GemmProblem]) -> list[str]:
    warps_for = {16: (1, 2), 32: (1, 2), 64: (2, 4), 128: (4,), 256: (4, 8)}
    splits_for = {16: (1, 2), 32: (1, 2), 64: (2, 4), 128: (4, 8), 256: (8, 16)}
    out = []
    for bm in (16, 32):
        for bn, bk in itertools.product((16, 32, 64, 128, 256), (64, 128, 256)):
            if bk == 64 and bn < 128:
                continue
            for warps, split in itertools.product(warps_for[bn], splits_for[bn]):
                cfg = SmallMConfig(BM=bm, BN=bn, BK=bk, warps=warps, stages={64: 6, 128: 4, 256: 3}[bk], split=split,
                                   reduction="none" if split == 1 else "fused", tma=False)
                if any(valid(cfg, p)[0] for p in shapes):
                    out.append(str(cfg))
    return out


def fewtile_configs(shapes: list[GemmProblem]) -> list[str]:
    out = []
    for (bm, bn), bk, split, red in itertools.product(((64, 64), (64, 128), (128, 64), (128, 128), (128, 256),
                                                        (256, 128)), (64, 128), (2, 3, 4, 6, 8, 12, 16),
                                                       ("fused", "two_pass")):
        cfg = SplitKConfig(BM=bm, BN=bn, BK=bk, warps=8 if bm * bn > 128 * 128 else 4, stages={64: 5, 128: 4}[bk],
                           group_m=8, split=split, reduction=red, tma=False)
        for p in shapes:
            progs = -(-p.M // bm) * -(-p.N // bn) * split
            if 96 <= progs <= 300 and valid(cfg, p)[0]:
                out.append(str(cfg))
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", required=True)
    ap.add_argument("--decode-shapes", default="benchmarks/shapes/decode_probe12.txt")
    ap.add_argument("--fewtile", required=True)
    ap.add_argument("--fewtile-shapes", default="benchmarks/shapes/fewtile_probe9.txt")
    a = ap.parse_args()
    for path, shapes_path, make, what in ((a.decode, a.decode_shapes, decode_configs, "smallm (tensor cores)"),
                                          (a.fewtile, a.fewtile_shapes, fewtile_configs, "split-K")):
        cfgs = make(read_shapes(shapes_path))
        with open(path, "w") as f:
            f.write(f"# the traffic probe, {what}: written by benchmarks/acceptance/traffic_probe_configs.py for "
                    f"{shapes_path}\n")
            f.write("\n".join(cfgs) + "\n")
        print(f"{path}: {len(cfgs)} configs")


if __name__ == "__main__":
    main()
