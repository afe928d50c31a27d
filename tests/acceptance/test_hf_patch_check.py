"""benchmarks/acceptance/hf_patch_check.py on the CPU: the tiny Llama preset in fp16 and bf16 passes every check
(each sampled GEMM within the battery's bounds on its own activations, unpatch restoring the modules and stock's
logits bit for bit, parameters the same tensors, a layer's state_dict round trip); a planted fault in gemmrl.mm
fails the GEMM check and the exit code; bad arguments get one-line errors."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

import gemmrl
from gemmrl.library import Library
from gemmrl.serve import dispatch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("hf_patch_check", ROOT / "benchmarks/acceptance/hf_patch_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "empty_library.json"
    Library().save(path)
    yield str(path)
    dispatch.use_library(None)


def rows_of(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def args(lib, out, *extra):
    return ["--device", "cpu", "--models", "tiny", "--inputs", "2x5,1x1", "--library", lib, "--out", str(out),
            "--tag", "t", *extra]


def test_tiny_llama_passes_every_check_in_both_dtypes(check, library, tmp_path, capsys):
    assert check.main(args(library, tmp_path)) == 0
    rows = rows_of(tmp_path / "hf_patch_t.csv")
    assert [(r["dtype"], r["input"]) for r in rows] == [(d, i) for d in ("fp16", "bf16") for i in ("2x5", "1x1")]
    for r in rows:
        assert r["patched_layers"] == "15" and r["skipped"] == ""
        for k in ("gemms_within_battery", "unpatch_restores_modules", "unpatch_logits_bit_identical",
                  "params_unchanged", "state_dict_roundtrip", "patch_allocates_nothing", "all_passed"):
            assert r[k] == "True", (k, r)
        assert float(r["top1_agreement"]) == 1.0 and r["peak_ratio"] == ""  # memory is measured on CUDA only
    layers = rows_of(tmp_path / "hf_patch_layers_t.csv")
    # one layer per distinct weight shape (q/o, k/v, gate/up, down, lm_head) per dtype and input
    assert len(layers) == 5 * 4
    assert {r["mnk"] for r in layers if r["input"] == "2x5"} == {"10_64_64", "10_32_64", "10_128_64", "10_64_128",
                                                                  "10_256_64"}
    assert all(r["gemmrl_passed"] == "True" and float(r["gemmrl_r"]) <= float(r["r_limit"]) for r in layers)
    assert capsys.readouterr().out.rstrip().endswith("hf_patch_t.csv")


def test_a_wrong_product_fails_the_gemm_check(check, library, tmp_path, monkeypatch, capsys):
    real = gemmrl.mm

    def off(a, b, out=None):
        c = real(a, b)
        c[0, 0] += 0.25 * c.abs().max()
        return c

    monkeypatch.setattr(gemmrl, "mm", off)
    assert check.main(args(library, tmp_path, "--dtypes", "bf16")) == 1
    rows = rows_of(tmp_path / "hf_patch_t.csv")
    assert all(r["gemms_within_battery"] == "False" and r["all_passed"] == "False" for r in rows)
    assert "GEMM outside the battery's bounds" in capsys.readouterr().out


@pytest.mark.parametrize("extra, says", [
    (["--models", "gpt-9"], "--models gpt-9: use some of"),
    (["--dtypes", "fp32"], "--dtypes fp32: use fp16 and/or bf16"),
    (["--inputs", "4by64"], "--inputs '4by64': give BxT pairs"),
    (["--inputs", "0x3"], "--inputs: give BxT pairs of positive integers"),
    (["--tag", "a/b"], "--tag 'a/b': letters, digits"),
])
def test_bad_arguments_get_one_line_errors(check, library, tmp_path, capsys, extra, says):
    assert check.main(args(library, tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf_patch_check.py: error: ") and says in err, err
