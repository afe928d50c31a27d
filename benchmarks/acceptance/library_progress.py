"""How far the tuned library has come, per tuning run and in all, from a trials store (selection-run numbers).

    python benchmarks/acceptance/library_progress.py STORE.sqlite[.gz] [--runs grid1000-part] [--md OUT.md]

Per run whose name starts with --runs: shapes tuned, candidates and failures, device-minutes spent (the GPU time the
tune charged its groups), and per shape the best generated candidate (highest reward = mean log speedup over
vendor_best in graph and cold) summarized as geomeans of its graph and cold speedups, alone and with the vendor
fallback (max(1, x): what `gemmrl.mm` serves), the shapes where it beat vendor_best in both, and the best's family.
The last row takes every matched run together (a shape's best over all of them). These are the tune's own
measurements: the figures that count come from re-measuring the library in a separate `gemmrl bench` run.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def _f(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def _geo(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def summarize(rows: list[dict], label: str, baselines: set[str] | None = None) -> dict:
    """One table row from outcome rows (``search.loop.summary_rows``'s columns) of one or more runs; ``baselines``:
    the vendor paths that ran beside them (vendor_best is the fastest of those only)."""
    best: dict[str, dict] = {}
    for r in rows:
        rew = _f(r["reward"])
        if r["verdict"] != "ok" or not math.isfinite(rew):
            continue
        if r["mnk"] not in best or rew > _f(best[r["mnk"]]["reward"]):
            best[r["mnk"]] = r
    g = [_f(b["speedup_graph"]) for b in best.values()]
    c = [_f(b["speedup_cold"]) for b in best.values()]
    fam = Counter(str(b["candidate"]).split(":")[0] for b in best.values())
    return {"run": label, "shapes": len({r["mnk"] for r in rows}), "candidates": len(rows),
            "failures": sum(r["verdict"] != "ok" for r in rows),
            "device_min": sum(_f(r["gpu_s"]) for r in rows if math.isfinite(_f(r["gpu_s"]))) / 60.0,
            "graph": _geo(g), "cold": _geo(c), "graph_fb": _geo([max(1.0, x) for x in g]),
            "cold_fb": _geo([max(1.0, x) for x in c]),
            "wins_both": sum(a > 1.0 and b > 1.0 for a, b in zip(g, c)),
            "families": ", ".join(f"{k} {v}" for k, v in fam.most_common()),
            "baselines": ", ".join(sorted(baselines)) if baselines is not None else ""}


def table(outcomes: list[dict], prefix: str, baselines: dict[str, set[str]] | None = None) -> list[dict]:
    """Rows per run whose name starts with ``prefix``, then all of them; ``baselines``: per run, the vendor paths
    that gave verified rows."""
    runs = sorted({r["run"] for r in outcomes if r["run"].startswith(prefix)})
    if not runs:
        raise SystemExit(f"no run whose name starts with {prefix!r} (runs: "
                         f"{', '.join(sorted({r['run'] for r in outcomes})) or 'none'})")
    base = baselines or {}
    out = [summarize([r for r in outcomes if r["run"] == run], run, base.get(run)) for run in runs]
    if len(runs) > 1:
        every = [base[r] for r in runs if r in base]
        out.append(summarize([r for r in outcomes if r["run"] in runs], f"all {len(runs)} runs",
                             set.intersection(*every) if every else None))
    return out


def markdown(rows: list[dict]) -> str:
    head = ("| run | shapes | candidates | failures | device-min | generated best, graph / cold | with vendor fallback "
            "| won both | best's family | vendor paths beside |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
    return head + "".join(
        f"| {r['run']} | {r['shapes']} | {r['candidates']} | {r['failures']} | {r['device_min']:.1f} | "
        f"{r['graph']:.3f} / {r['cold']:.3f} | {r['graph_fb']:.3f} / {r['cold_fb']:.3f} | {r['wins_both']} | "
        f"{r['families']} | {r['baselines']} |\n" for r in rows)


def load_outcomes(store: Path, gpu: str | None) -> tuple[list[dict], dict[str, set[str]]]:
    """(outcome rows, per run the vendor baselines with verified rows) of the store's one GPU (or ``gpu``)."""
    from gemmrl.search.run_export import only_gpu, open_copy   # the store read in a temporary copy (.gz unpacked)

    from gemmrl.search.loop import run_rows, summary_rows
    from gemmrl.summary import BASELINES

    with open_copy(store) as st:
        gpu = only_gpu(st.outcomes(), gpu, str(store))
        outs = summary_rows(st, gpu)
        ran = {run: {r["candidate"] for r in run_rows(st, gpu, run) if r["candidate"] in BASELINES
                     and str(r.get("verified")).lower() in ("true", "1")} for run in {o["run"] for o in outs}}
        return outs, ran


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--runs", default="", help="only runs whose name starts with this (e.g. grid1000-part)")
    ap.add_argument("--gpu", help="GPU model, as the store names it (default: the store's only one)")
    ap.add_argument("--md", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    if not args.store.is_file():
        ap.error(f"{args.store}: no such file (a trials store gemmrl tune wrote, .sqlite or .sqlite.gz)")
    outs, ran = load_outcomes(args.store, args.gpu)
    text = markdown(table(outs, args.runs, ran))
    print(text, end="")
    if args.md:
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
