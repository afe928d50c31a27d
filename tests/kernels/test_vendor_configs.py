"""cuBLASLt configurations outside the heuristic's list (kernels/vendor.py: config_key, parse_config,
CtypesCandidate.add_config and split_variants; launchers.vendor_plan's pin of a raced configuration).

CPU tier: descriptions read back to attributes, the split-K factors tried for small and large grids, the pin at
another M of a bucket (found without its wave count, built where the heuristic does not list it, else the
heuristic's first), and the race's switch. GPU tier: a split-K configuration the heuristic did not list runs and
matches an fp64 product; one cuBLASLt refuses is not added.
"""

from __future__ import annotations

import statistics

import pytest

from gemmrl.candidate import make_buffers
from gemmrl.kernels import vendor as V
from gemmrl.problem import GemmProblem
from gemmrl.serve import launchers
from gemmrl.serve import vendor_choice as VCH

NAMES = {"tile": {"34": "256x8", "20": "128x128"}, "stages": {"30": "64xAUTO"}, "cluster": {"2": "2x1x1"},
         "inner": {"0": "UNDEFINED"}, "reduction": {"0": "NONE", "2": "COMPUTE_TYPE"}}
D0 = ("id=66 tile=256x8 stages=64xAUTO splitk=1 reduction=NONE swizzle=0 custom=1 inner=UNDEFINED cluster=2x1x1 "
      "ws=4 waves=3.795")


def test_config_key_drops_what_depends_on_m():
    other_m = D0.replace("waves=3.795", "waves=1.902").replace("ws=4", "ws=0")
    assert V.config_key(D0) == V.config_key(other_m) != V.config_key(D0.replace("splitk=1", "splitk=2"))
    assert "ws=" not in V.config_key(D0) and "waves=" not in V.config_key(D0)


@pytest.mark.parametrize("desc,want", [
    (D0, [66, 34, 30, 1, 0, 0, 1, 0, 2]),
    ("id=7 tile=20 stages=3 splitk=4 reduction=2 swizzle=1 custom=0 inner=0 cluster=2", [7, 20, 3, 4, 2, 1, 0, 0, 2]),
    (D0.replace("tile=256x8", "tile=999x9"), None),   # a name this cublasLt.h does not have
    (D0.replace(" custom=1", ""), None),               # an attribute missing
])
def test_parse_config_reads_descriptions_back(desc, want):
    assert V.parse_config(desc, NAMES) == want


def test_tile_dims():
    assert V.tile_dims(D0) == (256, 8)
    assert V.tile_dims("id=7 tile=20") is None  # no name: the tile's size is unknown


class _FakeLib:
    """vendor_blas's surface that add_config / split_variants use, on the CPU: a plan of heuristic results ``descs``
    whose kernels take split-K where ``splittable``; add_config appends what cuBLASLt's check (``runs``) accepts."""

    def __init__(self, descs, splittable=None, runs=lambda attrs: True):
        self.descs, self.names, self.runs = list(descs), NAMES, runs
        self.splittable = splittable if splittable is not None else [True] * len(descs)
        self.added: list[list[int]] = []

    def plan_count(self, ptr):
        return len(self.descs)

    def describe(self, ptr, i):
        return self.descs[i]

    def lt_splitk_support(self, ptr, i, out):
        out._obj.value = int(i < len(self.splittable) and self.splittable[i])
        return 0

    def lt_plan_add_config(self, ptr, attrs, out):
        a = list(attrs)
        if not self.runs(a):
            return 1015
        self.added.append(a)
        self.descs.append(" ".join(f"{k}={v}" for k, v in zip(V.CONFIG_FIELDS, a)) + " ws=0 waves=1.000")
        self.splittable.append(False)
        out._obj.value = len(self.descs) - 1
        return 0


def _cand(lib, align=256):
    c = V.CtypesCandidate("vendor:cublaslt", "tn", "fp32", "heuristic")
    c._lib, c._ptr, c.align_mask = lib, 1, align - 1
    return c


def test_split_variants_fill_an_idle_grid_and_leave_a_full_one_alone():
    lib = _FakeLib([D0, D0.replace("custom=1", "custom=4"), D0.replace("custom=1", "custom=4")])
    c = _cand(lib)
    got = c.split_variants(GemmProblem(1, 4096, 4096), sms=132)
    # 16 tiles of 256x8: factors up to 16 keep the grid within two waves of 132 SMs; 1 is the heuristic's own
    assert sorted(a[3] for a in lib.added) == sorted([2, 3, 4, 6, 8, 12, 16] * 2)  # two distinct kernels
    assert got == list(range(3, 3 + 14))
    assert all(a[4] == 0 or a[3] > 1 for a in lib.added)  # the C side sets the fp32 reduction of a split
    full = _FakeLib([D0.replace("tile=256x8", "tile=128x128")])
    assert _cand(full).split_variants(GemmProblem(4096, 4096, 4096), sms=132) == []  # 1024 tiles: no split
    short_k = _FakeLib([D0])
    _cand(short_k).split_variants(GemmProblem(1, 4096, 512), sms=132)
    assert sorted(a[3] for a in short_k.added) == [2, 3, 4]  # a split of K = 512 stays >= 128 long


def test_split_variants_skip_kernels_without_split_k_and_refused_configs():
    lib = _FakeLib([D0, D0.replace("custom=1", "custom=4")], splittable=[False, True],
                   runs=lambda a: a[3] != 8)
    got = _cand(lib).split_variants(GemmProblem(1, 4096, 4096), sms=132)
    assert {a[6] for a in lib.added} == {4} and 8 not in [a[3] for a in lib.added]
    assert len(got) == len(lib.added) == 6


def test_add_config_finds_a_listed_configuration_at_another_m_else_builds_it():
    lib = _FakeLib([D0])
    c = _cand(lib)
    assert c.add_config(D0.replace("waves=3.795", "waves=7.590")) == 0 and lib.added == []
    assert c.add_config(D0.replace("splitk=1", "splitk=4")) == 1 and lib.added[0][3] == 4
    assert c.add_config(D0.replace("tile=256x8", "tile=999x9")) is None  # cannot be read back
    assert _cand(_FakeLib([D0]), align=16).add_config(D0.replace("splitk=1", "splitk=4")) is None  # not 256-aligned
    assert _cand(_FakeLib([D0], runs=lambda a: False)).add_config(D0.replace("splitk=1", "splitk=2")) is None


_REAL_ADD_CONFIG, _REAL_ADD_ATTRS = V.CtypesCandidate.add_config, V.CtypesCandidate._add_attrs


class _FakeLt:
    """CtypesCandidate as vendor_plan uses it: a plan listing ``LISTED``; ``add_config`` as the real one answers."""

    LISTED = [D0, D0.replace("custom=1", "custom=4")]
    made: list = []

    def __init__(self, name, layout, acc, mode):
        self.selected, self.lib = None, _FakeLib(self.LISTED)
        _FakeLt.made.append(self)

    def prepare(self, problem, bufs, protocol, timer):
        self.align_mask = 255

    def algorithms(self):
        return list(self.lib.descs)

    def add_config(self, desc):
        return _REAL_ADD_CONFIG(self, desc)

    def _add_attrs(self, attrs):
        return _REAL_ADD_ATTRS(self, attrs)

    @property
    def _lib(self):
        return self.lib

    _ptr = 1

    def select_algorithm(self, i):
        self.selected = i

    def hot_plan(self):
        return 0, 1

    def plan_error(self, st):
        return RuntimeError(st)

    def info(self):
        return {}


@pytest.mark.parametrize("algo,selected,note", [
    (_FakeLt.LISTED[1].replace("waves=3.795", "waves=0.950"), 1, ""),  # listed at this M: its wave count differs
    (D0.replace("splitk=1", "splitk=6"), 2, " [raced configuration, built at this M]"),
    (D0.replace("tile=256x8", "tile=999x9"), None, " [raced algorithm does not run at this shape (heuristic lists 2): "
                                                   "the heuristic's first]"),
])
def test_vendor_plan_pins_the_raced_configuration_at_another_m(monkeypatch, algo, selected, note):
    monkeypatch.setattr(V, "CtypesCandidate", _FakeLt)
    monkeypatch.setattr(launchers, "wrap", lambda cand, problem, bufs, note="": launchers.Launch(None, cand, (), note))
    _FakeLt.made.clear()
    got = launchers.vendor_plan("cublaslt", algo, GemmProblem(9, 4096, 4096), None)
    assert _FakeLt.made[-1].selected == selected and got.note == note


@pytest.mark.parametrize("value,want", [(None, True), ("1", True), ("0", False), (" 0 ", False)])
def test_the_races_split_switch(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(VCH.SPLITS_ENV, raising=False)
    else:
        monkeypatch.setenv(VCH.SPLITS_ENV, value)
    assert VCH.split_variants() is want


def test_a_bad_split_switch_says_what_to_do(monkeypatch):
    monkeypatch.setenv(VCH.SPLITS_ENV, "yes")
    with pytest.raises(VCH.VendorChoiceError, match="use 1 .* or 0"):
        VCH.split_variants()


# -- GPU: real cuBLASLt ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mnk", [(1, 4096, 4096), (16, 1024, 8192), (5, 3000, 1000)])
def test_gpu_split_variants_run_and_match_fp64(mnk, dtype, monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    p = GemmProblem(*mnk, dtype=dtype, layout="tn")
    bufs = make_buffers(p, torch.device("cuda"), seed=3, on_device=True)
    c = V.CtypesCandidate("vendor:cublaslt", "tn", "fp32", "heuristic")
    c.prepare(p, bufs, "graph", None)
    n = len(c.algorithms())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    extra = c.split_variants(p, sms)
    assert extra and all(i >= n for i in extra), c.algorithms()
    a, b, bt, out = bufs.args()
    ref = a.double() @ bt.double().t()
    tol = (2e-2 if dtype == "bf16" else 4e-3) * max(1.0, ref.abs().max().item())
    descs = c.algorithms()
    for i in extra:
        assert "splitk=1 " in descs[i] or "reduction=COMPUTE_TYPE" in descs[i], descs[i]
        out.fill_(float("nan"))
        c.algorithm_call(i)(a, b, bt, out)
        torch.cuda.synchronize()
        err = (out.double() - ref).abs().max().item()
        assert err <= tol, (descs[i], err)
    # a configuration found again by its description (another M reads it without its wave count)
    assert c.add_config(descs[extra[0]].replace("waves=", "waves=9")) == extra[0]
    bogus = descs[0].replace(descs[0].split()[0], "id=999999")
    assert c.add_config(bogus) is None


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_gpu_fresh_timer_takes_the_refill_out(layout):
    """The graph race's timer refills A and the form of B the layout reads before each call and takes the refill's
    time out: what is left is one GEMM's time, near the bench's graph protocol's for the same call and nowhere near
    GEMM + refill."""
    import torch

    from gemmrl.timing import TimingConfig, time_graph

    p = GemmProblem(39, 6144, 4096, dtype="fp16", layout=layout)
    bufs = make_buffers(p, torch.device("cuda"), seed=5, on_device=True)
    a, b, bt, c = bufs.args()
    w = bt.t() if layout == "tn" else b
    fn = lambda: torch.matmul(a, w, out=c)  # noqa: E731
    t = VCH.fresh_timer(bufs, layout)
    got = statistics.median([t(fn) for _ in range(5)])
    refill = t._prelude_off()
    bench = time_graph({"torch": fn}, bufs, TimingConfig(), layouts={"torch": layout})["torch"].time_ms
    assert refill > 0.2 * got, (refill, got)  # the refill writes 50 MB: not a negligible part of a sample
    assert 0.85 * bench < got < 1.15 * bench, (got, bench)
