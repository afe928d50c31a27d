"""`gemmrl warmup --model NAME --tokens ...`: the token counts it warms (one per bucket of M the vendor fallback
shares a choice over, for a range), the shapes it hands to ``dispatch.warmup`` (every layer of the model at each),
and its one-line errors."""

from __future__ import annotations

import pytest

from gemmrl.cli import lib as L
from gemmrl.cli.common import CliError
from gemmrl.cli.main import main
from gemmrl.models import MODELS
from gemmrl.serve import dispatch, vendor_choice


@pytest.mark.parametrize("spec, ms", [("1-8192", [1 << i for i in range(14)]), ("3-100", [3, 4, 8, 16, 32, 64]),
                                      ("5-5", [5]), ("64-64", [64]), ("16,1,64", [1, 16, 64]), ("7", [7]),
                                      ("1-65536", [1 << i for i in range(17)])])
def test_token_counts(spec, ms):
    got = L.token_ms(spec)
    assert got == ms
    if "-" in spec:  # one M in every bucket of the range, no bucket twice
        lo, hi = map(int, spec.split("-"))
        buckets = [vendor_choice.m_bucket(m) for m in got]
        assert len(set(buckets)) == len(buckets)
        assert {vendor_choice.m_bucket(m) for m in range(lo, hi + 1)} == set(buckets)


@pytest.mark.parametrize("spec", ["0-5", "5-3", "1-70000", "a-b", "", ",", "-4", "1-2-3", "0"])
def test_bad_token_counts_are_one_line_errors(spec):
    with pytest.raises(CliError, match="--tokens") as e:
        L.token_ms(spec)
    assert "\n" not in str(e.value)


def test_warmup_a_model_hands_every_layer_at_each_token_count(monkeypatch, capsys):
    seen = []

    def warmup(shapes, dtype, layouts):
        seen.extend(shapes)
        return [{"mnk": f"{m}_{n}_{k}", "layout": lay, "eager": "vendor: x", "graph": "vendor: x"}
                for (m, n, k) in shapes for lay in layouts]

    monkeypatch.setattr(dispatch, "warmup", warmup)
    assert main(["warmup", "--model", "llama-3-8b", "--tokens", "1-16", "--layouts", "tn"]) == 0
    layers = MODELS["llama-3-8b"].values()
    assert sorted(seen) == sorted((m, n, k) for m in (1, 2, 4, 8, 16) for (n, k) in layers)
    assert capsys.readouterr().out.count("eager: vendor: x") == len(seen)


@pytest.mark.parametrize("argv, match", [
    (["warmup", "--model", "llama-3-8b", "--mnk", "4_4_4"], "give one of --model, --mnk"),
    (["warmup", "--mnk", "4_4_4", "--tokens", "1-8"], "--tokens goes with --model"),
    (["warmup", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["warmup", "--model", "llama-3-8b", "--tokens", "0-8"], "--tokens '0-8'"),
])
def test_warmup_model_errors(argv, match, capsys):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
