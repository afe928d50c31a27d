"""The family table (gemmrl.kernels.registry): every family parses, checks and builds through one interface, and
the consumers (selection, library entries, the tuner's specs) read it instead of switching on family names."""

from __future__ import annotations

import pytest

from gemmrl.kernels import cutlass_sm90 as cs
from gemmrl.kernels import registry as R
from gemmrl.kernels import tiny_gemm as tg
from gemmrl.kernels import wgmma_gemm as wg
from gemmrl.kernels.cuda_source import CudaSource, ShapeRange
from gemmrl.kernels.triton_gemm import TiledConfig, TritonGemm
from gemmrl.library import FAMILIES as LIBRARY_FAMILIES
from gemmrl.library import Entry, LibraryError
from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.problem import GemmProblem
from gemmrl.results import ResultsWriter
from gemmrl.search.selection import load_selection, selected_candidates

CONFIGS = {
    "triton": str(TiledConfig(BM=32, BN=32, BK=64, warps=4, stages=3, group_m=8)),
    "cutlass": "pingpong_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1",
    "tiny": str(tg.TinyConfig(32, 32, 4)),
    "wgmma": str(wg.WgmmaConfig(1, 64, 8, 2)),
    "vendor": "cublaslt_heuristic_tn",
}


def test_names_and_prefixes():
    assert set(R.FAMILIES) >= {"triton", "cutlass", "tiny", "wgmma", "vendor", "cuda", "triton_source",
                               "planted_triton"}
    for name, fam in R.FAMILIES.items():
        assert fam.name == name and fam.prefix == f"{name}:" and fam.selected == f"{name}-sel:"
    assert R.of_candidate("triton:tiled(BM=16):tn").name == "triton"
    assert R.of_candidate("cutlass-sel:cold+graph").name == "cutlass"
    assert R.of_candidate("cublas_tn") is None and R.of_candidate("gemmrl") is None


def test_served_and_selectable_are_what_library_and_screen_take():
    from gemmrl.search.screen import SCREENS

    assert R.SERVED == LIBRARY_FAMILIES == ("triton", "cutlass", "tiny", "decode", "vendor")
    assert set(R.SELECTABLE) == {"triton", "cutlass", "tiny", "wgmma", "decode"} == set(SCREENS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trip(name):
    fam = R.family(name)
    cfg = fam.parse(CONFIGS[name])
    text = f"{cfg[0]}:{cfg[1]}" if name == "cutlass" else str(cfg)
    assert text == CONFIGS[name]
    assert fam.config(CONFIGS[name]) == cfg and fam.config(cfg) is cfg  # a parsed config passes through


@pytest.mark.parametrize("name, bad", [("triton", "tiled(BM=-1"), ("cutlass", "pingpong_1x2"), ("tiny", "64x64"),
                                       ("wgmma", "nonsense"), ("vendor", "cublas_xx")])
def test_unreadable_configs_are_refused_with_a_value_error(name, bad):
    with pytest.raises(ValueError):
        R.family(name).parse(bad)


def test_unknown_family_names_the_known_ones():
    with pytest.raises(R.FamilyError, match="unknown kernel family 'toy'.*triton.*cutlass"):
        R.family("toy")
    with pytest.raises(ValueError, match="unknown kernel family"):
        CandidateSpec("toy", "x")


def test_validity_predicates_are_the_families_own():
    tn, nn = GemmProblem(64, 64, 1024, layout="tn"), GemmProblem(64, 64, 1024, layout="nn")
    tiny = R.family("tiny")
    cfg = tiny.parse(CONFIGS["tiny"])
    assert tiny.valid(cfg, tn) == tg.valid(cfg, tn) and tiny.valid(cfg, tn)[0]
    ok, why = tiny.valid(cfg, nn)
    assert not ok and "tn" in why
    cut = R.family("cutlass")
    c = cut.parse(CONFIGS["cutlass"])
    assert cut.valid(c, GemmProblem(256, 256, 256)) == cs.valid(*c, GemmProblem(256, 256, 256))
    assert not cut.valid(c, GemmProblem(5, 8, 13))[0]  # TMA: K=13 rows are not 16-byte aligned


def test_mismatch_names_the_layout_and_dtype_a_config_is_built_for():
    cut = R.family("cutlass")
    c = cut.parse(CONFIGS["cutlass"])
    assert cut.mismatch(c, "tn", "fp16") == ""
    assert cut.mismatch(c, "nn", "fp16") == "a tn/fp16 config for a nn/fp16 problem"
    assert R.family("triton").mismatch(R.family("triton").parse(CONFIGS["triton"]), "nn", "bf16") == ""


def test_library_entries_are_checked_through_the_table():
    kw = dict(gpu="G", cc="9.0", dtype="fp16", acc="fp32", layout="nn", protocol="graph", M=64, N=64, K=64,
              time_ms=0.01, vendor_best_ms=0.02, vendor_best="cublas_tn", m_lo=64, m_hi=64, members=("64_64_64",),
              verified=True)
    Entry(family="cutlass", impl=CONFIGS["cutlass"].replace("_tn_", "_nn_"), algo="", **kw)
    with pytest.raises(LibraryError, match="is a tn/fp16 config for a nn/fp16 entry"):
        Entry(family="cutlass", impl=CONFIGS["cutlass"], algo="", **kw)
    with pytest.raises(LibraryError, match="family 'wgmma'"):  # screened, not served
        Entry(family="wgmma", impl=CONFIGS["wgmma"], algo="", **kw)


def test_build_refuses_a_source_outside_its_declared_shapes():
    src = CudaSource("// nothing", entry="gemmrl_gemm", layout="tn", shapes=ShapeRange.parse("M=1..64,N%8,K%8"))
    cand, rec = R.family("cuda").build(src, GemmProblem(128, 64, 64))
    assert cand is None and rec["error"]["stage"] == "shape" and "outside the declared" in rec["error"]["message"]


def test_build_of_a_config_family_makes_its_candidate_in_the_problems_layout():
    cand, rec = R.family("triton").build(CONFIGS["triton"], GemmProblem(64, 64, 64, layout="nn"))
    assert rec == {"ok": True} and isinstance(cand, TritonGemm)
    assert cand.layout == "nn" and cand.name == f"triton:{CONFIGS['triton']}"
    spec_cand, _ = CandidateSpec("triton", CONFIGS["triton"], name="mine", layout="tn").make(GemmProblem(64, 64, 64))
    assert spec_cand.layout == "tn" and spec_cand.name == "mine"


def test_planted_modes_are_fresh_copies():
    fam = R.family("planted_triton")
    a, b = fam.candidate("fp16_acc", None, None), fam.candidate("fp16_acc", None, None)
    assert a.mode == "fp16_acc" and a is not b
    with pytest.raises(ValueError, match="unknown planted Triton mode"):
        fam.candidate("nope", None, None)


def test_a_new_family_is_one_table_entry(monkeypatch, tmp_path):
    """A family added to the table is re-measured from a selection like the others, with no other change."""
    made = []

    def candidate(cfg, problem, name):
        made.append((cfg, problem.layout, name))
        return ("toy", cfg, name)

    monkeypatch.setitem(R.FAMILIES, "toy", R.Family("toy", parse=lambda s: s.upper(), candidate=candidate))
    rows = [{"mnk": "64_64_64", "protocol": p, "candidate": f"toy:{c}", "algo": c, "time_ms": t, "tflops": 1 / t,
             "verified": True,
             "floor_ok": True, "layout": "nn", "dtype": "fp16", "acc": "fp32"}
            for p, c, t in (("graph", "a", 1.0), ("graph", "b", 0.5), ("cold", "b", 0.7))]
    path = tmp_path / "sel.csv"
    ResultsWriter(path).write_batch(rows)
    sel = load_selection([path], "toy")
    assert sel == {"64_64_64": {"graph": ("b", "nn"), "cold": ("b", "nn")}}
    assert selected_candidates(GemmProblem(64, 64, 64), sel, "toy") == [("toy", "B", "toy-sel:cold+graph")]
    assert made == [("B", "nn", "toy-sel:cold+graph")]
