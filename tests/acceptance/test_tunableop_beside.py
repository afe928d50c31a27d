"""benchmarks/acceptance/tunableop_beside.py: gemmrl.mm against TunableOp's torch.matmul from two bench CSVs (CPU)."""
import csv
import gzip
import math

import pytest

from conftest import script_module

FIELDS = ["mnk", "candidate", "protocol", "time_ms", "verified", "recheck", "rep"]


def _write(path, rows):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({"verified": "true", "recheck": "", "rep": "0", **r})


@pytest.mark.parametrize("gz", [False, True])
def test_the_ratio_is_tunableops_time_over_gemmrls_over_the_shapes_both_hold(tmp_path, gz):
    ext = ".csv.gz" if gz else ".csv"
    ours, tun = tmp_path / f"ours{ext}", tmp_path / f"tun{ext}"
    _write(ours, [
        {"mnk": "8_4096_4096", "candidate": "gemmrl", "protocol": "graph", "time_ms": "0.010"},
        {"mnk": "8_4096_4096", "candidate": "vendor_best", "protocol": "graph", "time_ms": "0.011"},
        {"mnk": "8_4096_4096", "candidate": "gemmrl", "protocol": "graph", "time_ms": "0.5", "recheck": "1"},
        {"mnk": "64_64_64", "candidate": "gemmrl", "protocol": "graph", "time_ms": "0.004"},
        {"mnk": "64_64_64", "candidate": "vendor_best", "protocol": "graph", "time_ms": "0.004"},
        {"mnk": "3_5_7", "candidate": "gemmrl", "protocol": "graph", "time_ms": "0.002", "verified": "false"},
        {"mnk": "8_4096_4096", "candidate": "gemmrl", "protocol": "offline", "time_ms": "0.030"},
        {"mnk": "8_4096_4096", "candidate": "gemmrl", "protocol": "cold", "time_ms": "0.020"},
    ])
    _write(tun, [
        {"mnk": "8_4096_4096", "candidate": "torch", "protocol": "graph", "time_ms": "0.012"},
        {"mnk": "64_64_64", "candidate": "torch", "protocol": "graph", "time_ms": "0.003"},
        {"mnk": "3_5_7", "candidate": "torch", "protocol": "graph", "time_ms": "0.002"},
        {"mnk": "8_4096_4096", "candidate": "torch", "protocol": "offline", "time_ms": "0.040"},
        {"mnk": "8_4096_4096", "candidate": "torch", "protocol": "cold", "time_ms": "0.019", "verified": "false"},
    ])
    mod = script_module("tunableop_beside")
    rows = mod.compare(ours, tun)
    assert [r["protocol"] for r in rows] == ["graph"]  # offline is host time; the cold torch row failed its check
    g = rows[0]
    assert g["shapes"] == 2 and g["below_1"] == 1 and g["min_shape"] == "64_64_64"
    assert g["gemmrl_over_tunableop"] == pytest.approx(math.sqrt(1.2 * 0.75), abs=1e-4)
    assert g["min"] == pytest.approx(0.75)
    assert g["vendor_best_over_tunableop"] == pytest.approx(math.sqrt(12 / 11 * 0.75), abs=1e-4)
    out = tmp_path / "t.md"
    assert mod.main(["--ours", str(ours), "--tunableop", str(tun), "--out", str(out)]) == 0
    assert "| graph | 2 | 0.949 | 0.750 (64_64_64) | 1 |" in out.read_text()


def test_files_that_share_no_shape_or_do_not_exist_say_what_to_do(tmp_path, capsys):
    ours, tun = tmp_path / "ours.csv", tmp_path / "tun.csv"
    _write(ours, [{"mnk": "8_8_8", "candidate": "gemmrl", "protocol": "graph", "time_ms": "0.01"}])
    _write(tun, [{"mnk": "9_9_9", "candidate": "torch", "protocol": "graph", "time_ms": "0.01"}])
    mod = script_module("tunableop_beside")
    with pytest.raises(SystemExit, match="same shape file"):
        mod.compare(ours, tun)
    assert mod.main(["--ours", str(tmp_path / "missing.csv"), "--tunableop", str(tun)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1
