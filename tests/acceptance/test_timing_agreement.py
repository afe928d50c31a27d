"""benchmarks/acceptance/timing_agreement.py: two bench runs of the same shapes compared (our fastest over vendor_best in each),
only where both completed every vendor path; wall time per shape from the row timestamps."""

from __future__ import annotations


import pytest

from gemmrl.results import ResultsWriter
from gemmrl.summary import BASELINES
from conftest import script_module


def _load():
    return script_module("timing_agreement")


def _rows(ours: dict, vendor: float, minute: int, cut: str = "") -> list[dict]:
    """Every baseline at ``vendor`` ms (one 10% slower), ours per shape; shape i starts at minute+i:00."""
    out = []
    for i, (mnk, t) in enumerate(ours.items()):
        ts = f"2026-11-25T10:{minute + i:02d}:00Z"
        for b in BASELINES:
            if mnk == cut and b == "cublas_nn":
                continue   # cut off part-way: not compared
            out.append(dict(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate=b, protocol="graph",
                            time_ms=vendor * (1.1 if b == "torch" else 1.0), verified="true", rep=0, timestamp=ts))
        out += [dict(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate="triton-sel:graph", protocol="graph",
                     time_ms=t, verified="true", rep=0, timestamp=ts),
                dict(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate="triton-sel:graph", protocol="graph",
                     time_ms=t / 10, verified="false", reason="failed verification", rep=0, timestamp=ts)]
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_two_runs_compared_where_both_completed(tmp_path, gz):
    mod = _load()
    a = _rows({"64_64_64": 2.0, "128_128_128": 0.5, "256_256_256": 1.0}, 1.0, 0)
    b = _rows({"64_64_64": 2.0, "128_128_128": 0.55, "256_256_256": 1.0}, 1.0, 0, cut="256_256_256")
    b[0]["timestamp"] = "2026-11-25T10:00:00Z"
    res = mod.compare(a, b)
    assert [k for k, _, _ in res["per"]] == [("128_128_128", "graph"), ("64_64_64", "graph")]
    ga, gb, n, worst = res["geo"]["graph"]
    assert n == 2 and ga == pytest.approx((2.0 * 0.5) ** 0.5) and gb == pytest.approx((1 / 0.55 * 0.5) ** 0.5)
    assert worst == pytest.approx(1 - 0.5 / 0.55)
    assert res["seconds"] == (120.0, 120.0, 2)
    pa, pb = tmp_path / "a.csv", tmp_path / "b.csv"
    ResultsWriter(pa).write_batch(a)
    ResultsWriter(pb).write_batch(b)
    if gz:   # the committed CSVs are gzipped
        import gzip

        with open(pa, "rb") as src, gzip.open(tmp_path / "a.csv.gz", "wb") as dst:
            dst.write(src.read())
        pa = tmp_path / "a.csv.gz"
    assert mod.main([str(pa), str(pb), "--names", "full,quick", "--md", str(tmp_path / "t.md")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "| graph | 2 |" in text and "full 120 s, quick 120 s" in text
    with pytest.raises(SystemExit):
        mod.main([str(pa), str(tmp_path / "missing.csv")])
