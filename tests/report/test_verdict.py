"""CPU tier for the verdict lines and the per-shape table that open `gemmrl report`: numbers checked against a hand
computation over a small synthetic results file (graph with the noise rule's rechecks, cold without)."""

import csv
import html
import math

import pytest

from gemmrl.cli.main import main
from gemmrl.report import data as D
from gemmrl.report import make as R
from gemmrl.report import verdict as V
from gemmrl.results import COLUMNS
from gemmrl.summary import BASELINES

ALGO = "eager=triton:tiled(BM=16) (offline entry); graph=triton:tiled(BM=32) (graph entry, raced); hot=torch"


def _row(mnk, cand, tflops, proto="graph", **kw):
    m, n, k = (int(x) for x in mnk.split("_"))
    r = {c: "" for c in COLUMNS}
    r.update(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate=cand, protocol=proto, tflops=str(tflops),
             time_ms=str(1.0 / tflops), n="10", verified="true", gpu="NVIDIA H200", cc="9.0", git_sha="abc",
             timestamp="2026-11-29T00:00:00Z", M=str(m), N=str(n), K=str(k), floor_ms="1e-9", floor_ok="true",
             rep="0", algo=ALGO if cand == "gemmrl" else "")
    r.update(kw)
    return r


def _shape(mnk, ours, vendor, proto="graph", aggregate=True):
    """gemmrl at ``ours`` TFLOPS; ``vendor`` = {member: TFLOPS}; the vendor_best aggregate row as bench writes it
    (its winning member in ``members``) unless ``aggregate`` is False (then the report fills it in)."""
    rows = [_row(mnk, "gemmrl", ours, proto)] + [_row(mnk, m, v, proto) for m, v in vendor.items()]
    if aggregate:
        win = max(vendor, key=vendor.get)
        rows.append(_row(mnk, "vendor_best", vendor[win], proto, members=win))
    return rows


def _recheck(mnk, ours, member, theirs, k, proto="graph"):
    return [_row(mnk, "gemmrl", ours, proto, recheck=str(k)), _row(mnk, member, theirs, proto, recheck=str(k))]


def _rows():
    rows = []
    rows += _shape("64_64_64", 1.1, {"torch": 0.9, "cublas_tn": 1.0})                        # 1.100
    rows += _shape("128_64_64", 0.99, {"torch": 0.5, "cublas_nn": 1.0})                      # 0.990: within the bar
    rows += _shape("128_128_64", 0.9, {"torch": 1.0, "cublas_tn": 0.7})                      # 0.900: cleared
    rows += _shape("128_128_128", 0.8, {"cublaslt_autotuned_tn": 1.0, "torch": 0.6})         # 0.800: stays below
    rows += _shape("256_128_128", 0.5, {m: 1.0 if m == "cublas_nn" else 0.5 for m in BASELINES},
                   aggregate=False)                                                           # 0.500: not judged
    for k in (1, 2, 3):
        rows += _recheck("128_128_64", 1.0, "torch", 0.99, k)   # gemmrl 1.0 >= 0.99 * 0.98: not below after all
        rows += _recheck("128_128_128", 0.8, "cublaslt_autotuned_tn", 1.0, k)
    # cold: no rechecks in the rows
    rows += _shape("64_64_64", 1.2, {"torch": 1.0}, proto="cold")
    rows += _shape("128_64_64", 0.5, {"torch": 1.0}, proto="cold")
    # rows that never count: unverified, verified but not timed (a reason says why), a second repeat
    rows += [dict(_row("64_64_64", "gemmrl", 100.0), verified="false", reason="failed verification"),
             dict(_row("128_64_64", "torch", 100.0), reason="not timed", tflops="", time_ms=""),
             _row("64_64_64", "gemmrl", 100.0, rep="1")]
    return rows


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


GRAPH = (f"graph: gemmrl.mm / vendor_best geomean {(1.1 * 0.99 * 0.9 * 0.8 * 0.5) ** (1 / 5):.3f} over 5 shapes, "
         "min 0.500, 4 below 1.00 (2 below by more than 2% after the noise rule's rechecks)")
COLD = (f"cold: gemmrl.mm / vendor_best geomean {math.sqrt(1.2 * 0.5):.3f} over 2 shapes, min 0.500, 1 below 1.00 "
        "(no rechecks in these rows)")


def test_verdict_lines_by_hand(tmp_path):
    f = _write(tmp_path / "r.csv", _rows())
    rows = R.load([f])[f]
    vs = V.verdicts(rows, D.shape_table(rows), "gemmrl")
    assert [v.line() for v in vs] == [GRAPH, COLD]
    g = vs[0]
    assert (g.stats.n, g.below, g.after, g.margin) == (5, 4, 2, 0.02)
    assert g.stats.geomean == pytest.approx(math.prod((1.1, 0.99, 0.9, 0.8, 0.5)) ** (1 / 5))


def test_a_pair_rechecked_at_every_shape_reports_its_second_run_too(tmp_path):
    """Every shape's gemmrl and vendor_best member re-measured head to head (bench since it rechecks the pair at every
    shape): the line adds the geomean and min of those runs' ratios (medians over the batches)."""
    rows = _shape("64_64_64", 1.1, {"torch": 0.9, "cublas_tn": 1.0}) + _shape("128_64_64", 0.9, {"cublas_nn": 1.0})
    for k, (a, b) in enumerate([(1.0, 1.0), (1.05, 1.0), (0.95, 1.0)], 1):
        rows += _recheck("64_64_64", a, "cublas_tn", b, k) + _recheck("128_64_64", 0.98 * b, "cublas_nn", a, k)
    f = _write(tmp_path / "r.csv", rows)
    got = R.load([f])[f]
    (v,) = V.verdicts(got, D.shape_table(got), "gemmrl")
    assert v.second is not None and v.second.n == 2
    assert v.second.geomean == pytest.approx(math.sqrt(1.0 * 0.98)) and v.second.min == pytest.approx(0.98)
    assert v.line().endswith("after the noise rule's rechecks; from the rechecks (a second run of both): geomean "
                             f"{math.sqrt(0.98):.3f}, min 0.980)")
    # one shape without rechecks: no second-run figure (a subset would be chosen by who trailed)
    part = [r for r in got if not (r["mnk"] == "128_64_64" and r.get("recheck"))]
    (v,) = V.verdicts(part, D.shape_table(part), "gemmrl")
    assert v.second is None and "from the rechecks" not in v.line()


def test_per_shape_table_rows(tmp_path):
    f = _write(tmp_path / "r.csv", _rows())
    rows = R.load([f])[f]
    hdr, body = V.shape_rows(D.shape_table(rows), "gemmrl")
    assert hdr == ["shape", "protocol", "gemmrl.mm time (µs)", "vendor_best time (µs)", "vendor_best path",
                   "gemmrl.mm / vendor_best (speed)", "served by"]
    served = "triton:tiled(BM=32)"  # the graph part of the row's algo
    assert body == [
        ["256_128_128", "graph", "2000.00", "1000.00", "cublas_nn", "0.500", served],
        ["128_128_128", "graph", "1250.00", "1000.00", "cublaslt_autotuned_tn", "0.800", served],
        ["128_128_64", "graph", "1111.11", "1000.00", "torch", "0.900", served],
        ["128_64_64", "graph", "1010.10", "1000.00", "cublas_nn", "0.990", served],
        ["64_64_64", "graph", "909.09", "1000.00", "cublas_tn", "1.100", served],
        ["128_64_64", "cold", "2000.00", "1000.00", "torch", "0.500", "triton:tiled(BM=16)"],
        ["64_64_64", "cold", "833.33", "1000.00", "torch", "1.200", "triton:tiled(BM=16)"],
    ]


def test_html_opens_with_the_verdict_and_has_the_table(tmp_path, capsys):
    f = _write(tmp_path / "r.csv", _rows())
    rep = R.make_report([f], tmp_path / "out", plots=False)
    assert rep.verdict == [GRAPH, COLD]
    page = rep.html.read_text()
    body = page[page.index("<body>"):]
    first = body.index("<h1>gemmrl report</h1>") + len("<h1>gemmrl report</h1>")
    g, c = (body.index(f"<li>{html.escape(x)}</li>") for x in (GRAPH, COLD))
    assert g < c < body.index("<h2>")
    assert body[first:].lstrip().startswith("<p><b>Verdict</b>")
    assert "<td>256_128_128</td><td class=num>graph</td><td class=num>2000.00</td>" in page
    assert main(["report", str(f), "--out", str(tmp_path / "cli")]) == 0
    assert f"verdict: {GRAPH}\nverdict: {COLD}\n" in capsys.readouterr().out


def test_vendor_only_verdict_is_torch_against_vendor_best(tmp_path):
    rows = [r for r in _rows() if r["candidate"] != "gemmrl" and not r["recheck"]]
    f = _write(tmp_path / "v.csv", rows)
    rep = R.make_report([f], tmp_path / "out", plots=False)
    # torch / vendor_best in graph: 0.9/1.0, 0.5/1.0, 1.0/1.0, 0.6/1.0, 0.5/1.0; no recheck of torch against it
    g = (0.9 * 0.5 * 1.0 * 0.6 * 0.5) ** (1 / 5)
    assert rep.verdict[0] == (f"graph: torch / vendor_best geomean {g:.3f} over 5 shapes, min 0.500, 4 below 1.00 "
                              "(no rechecks in these rows); vendor-only rows, no candidate of ours")
