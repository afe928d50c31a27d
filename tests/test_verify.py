"""The correctness battery (gemmrl.verify).

CPU tier: the tolerance model on CPU "kernels" (torch ops): a correctly rounded fp32-accumulating product
passes on many seeds and odd shapes; simulated fp16 accumulation and bf16-rounded inputs fail with the
accuracy reason; every adversarial candidate (partial write, out-of-bounds write, input mutation, cached
result, timing tamper, stray thread, crash) fails with its own reason. CUDA-L2's 0/1 check passes the
fp16-accumulating kernel, which ours rejects.
Interpreter tier (``-m interpreter``): the planted Triton kernels on CPU tensors under the Triton
interpreter. GPU tier (``-m gpu``): the same kernels compiled, vendor torch.matmul, a side-stream cheat.
"""

import math
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmrl import verify as V
from gemmrl.adversarial.planted import planted_candidates
from gemmrl.candidate import FnCandidate
from gemmrl.problem import GemmProblem

CPU = "cpu"
SHAPES = [(1, 7, 13), (33, 65, 129), (64, 64, 64), (130, 200, 72), (3, 4096, 40)]


# ----------------------------------------------------------------------------------------------------
# CPU "kernels"
# ----------------------------------------------------------------------------------------------------
def _b(b, bt, layout):
    return b.float() if layout == "nn" else bt.float().t()


def correct_fn(layout="nn"):
    """fp32 accumulation, one rounding to the output dtype: what a legitimate kernel computes."""
    def fn(a, b, bt, c):
        c.copy_((a.float() @ _b(b, bt, layout)).to(c.dtype))
    return fn


def half_acc_fn(chunk=16, acc_dtype=torch.float16):
    """An fp16 (or bf16) accumulator updated every ``chunk`` products: mma with an f16 accumulator."""
    def fn(a, b, bt, c):
        acc = torch.zeros(c.shape, dtype=acc_dtype)
        for k0 in range(0, a.shape[1], chunk):
            acc = (acc.float() + a[:, k0:k0 + chunk].float() @ b[k0:k0 + chunk].float()).to(acc_dtype)
        c.copy_(acc)
    return fn


def bf16_inputs_fn(a, b, bt, c):
    c.copy_((a.bfloat16().float() @ b.bfloat16().float()).to(c.dtype))


def cand(name, fn, layout="nn"):
    return FnCandidate(name, layout, fn)


def P(shape, **kw):
    return GemmProblem(*shape, **kw)


# ----------------------------------------------------------------------------------------------------
# Tolerance model
# ----------------------------------------------------------------------------------------------------
def test_tolerance_model():
    assert V.tolerance_for(P((8, 8, 8))) is V.FP32_ACC
    assert V.tolerance_for(P((8, 8, 8), acc="fp16")) is V.FP16_ACC
    assert V.FP32_ACC.r_limit(16384) == V.FP32_ACC.r_max  # fp32 model: no growth with K
    assert V.FP16_ACC.growth(16) == 1.0
    assert V.FP16_ACC.growth(64) == pytest.approx(math.sqrt(2.5))
    assert V.FP32_ACC.calibration and V.FP16_ACC.calibration


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("shape", SHAPES)
def test_correct_kernel_passes_every_seed(shape, layout, dtype):
    p = P(shape, dtype=dtype)
    r = V.check_accuracy(cand("fp32", correct_fn(layout), layout), p, CPU, seeds=range(12))
    assert r.passed, r.reason
    # correctly rounded up to fp32 accumulation noise: the final rounding (alpha) accounts for all of it
    assert 0.99 <= r.stats["r"] <= 1.01 and r.stats["beta_needed"] < 0.05, r.stats


@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("shape", SHAPES)
def test_correct_kernel_passes_battery(shape, layout):
    v = V.verify(cand("fp32", correct_fn(layout), layout), P(shape), CPU, trials=3)
    assert v.passed, v.reason
    assert v.reason == "" and v.failed_check == ""
    assert {c.name for c in v.checks} >= {"nan_fill", "stream_order", "exact_int", "accuracy", "second_call",
                                          "guard_band", "inputs_unchanged", "stream", "tamper"}
    assert len(v.stats["seeds"]) == 3
    so = next(c for c in v.checks if c.name == "stream_order")
    assert so.passed and so.stats.get("skipped")  # CPU tensors: no streams to order


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 300), st.sampled_from(["fp16", "bf16"]),
       st.integers(0, 2 ** 31 - 1))
def test_correct_kernel_passes_random_shapes(m, n, k, dtype, seed):
    p = GemmProblem(m, n, k, dtype=dtype)
    c = cand("fp32", correct_fn())
    for r in (V.check_accuracy(c, p, CPU, seeds=[seed]), V.check_exact_int(c, p, CPU, seeds=[seed])):
        assert r.passed, r.reason


@pytest.mark.parametrize("shape", [(33, 65, 129), (64, 64, 64), (130, 200, 72), (3, 4096, 40), (16, 16, 4096)])
def test_fp16_accumulation_fails_accuracy(shape):
    for seed in range(3):
        r = V.check_accuracy(cand("f16acc", half_acc_fn()), P(shape), CPU, seeds=[seed])
        assert not r.passed and r.name == "accuracy", r
        assert "that of the correctly rounded result" in r.reason and "fp16 accumulation" in r.reason
        assert r.stats["r"] > 1.25 * 1.1  # rejected by the global statistic with a margin
    # and the whole battery rejects it for that reason (the exact-integer check cannot see it)
    v = V.verify(cand("f16acc", half_acc_fn()), P(shape), CPU, trials=2)
    assert not v.passed and v.failed_check == "accuracy" and v.reason.startswith("accuracy:")


@pytest.mark.parametrize("shape", [(1, 1, 16383), (1, 3, 8192), (2, 5, 4096), (1, 1, 1), (16383, 1, 1)])
def test_correct_kernel_passes_on_small_outputs_with_long_k(shape):
    """Over a few elements R is noise (one honest sum rounded to the other neighbour reads as 2-3x): the check pools
    its trials until R has enough elements, and judges fewer element by element only."""
    for seed in range(0, 40, 4):
        r = V.check_accuracy(cand("fp32", correct_fn()), P(shape), CPU, seeds=[seed, seed + 1])
        assert r.passed, r.reason


def test_r_is_not_judged_over_too_few_elements():
    p = P((1, 1, 16383))
    m = {"r": 2.18, "r_limit": 1.25, "elem_ratio": 0.02, "beta_needed": 0.0, "at": (0, 0), "got": 0.0435181,
         "want": 0.043539, "n": 1}
    V.judge(m, p, V.tolerance_for(p), "probe")  # passes: one element, well inside its bound
    with pytest.raises(V.AccuracyError, match="that of the correctly rounded result"):
        V.judge({**m, "n": V.R_MIN_ELEMENTS}, p, V.tolerance_for(p), "probe")


def noisy_rounding_fn(a, b, bt, c):
    """Every element off by up to half a unit in the last place before rounding: inside each element's bound, about
    twice the correctly rounded error overall (what the global statistic is for)."""
    ref = a.double() @ b.double()
    ulp = (ref.to(c.dtype).double().abs() * 2.0 ** -10).clamp_min(2.0 ** -24)
    noise = (torch.rand(ref.shape, generator=torch.Generator().manual_seed(int(a.double().sum().item() * 1e3) % 2**31),
                        dtype=torch.float64) - 0.5) * ulp
    c.copy_((ref + noise).to(c.dtype))


@pytest.mark.parametrize("shape", [(1, 16, 8192), (2, 3, 4096), (1, 4, 2048)])
def test_small_outputs_are_judged_by_pooled_r(shape):
    r = V.check_accuracy(cand("noisy", noisy_rounding_fn), P(shape), CPU, seeds=[0])
    assert not r.passed and r.name == "accuracy", r
    assert "seeds pooled" in r.reason and "that of the correctly rounded result" in r.reason, r.reason
    r = V.check_accuracy(cand("f16acc", half_acc_fn()), P(shape), CPU, seeds=[0])
    assert not r.passed and r.name == "accuracy", r


def test_fp16_accumulation_error_grows_like_sqrt_k():
    rs = {}
    for k in (64, 1024):
        p = P((32, 32, k))
        rs[k] = V.calibrate([p], [cand("f16acc", half_acc_fn())], [0], CPU)[0]["r"]
        assert rs[k] == pytest.approx(V.FP16_ACC.growth(k), rel=0.2)
    assert rs[1024] > 3 * rs[64]


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_rounded_inputs_fail_accuracy(shape):
    r = V.check_accuracy(cand("bf16in", bf16_inputs_fn), P(shape), CPU, seeds=[1, 2])
    assert not r.passed and r.name == "accuracy" and r.stats["r"] > 4, r


def test_bf16_accumulation_fails_on_bf16_data():
    p = P((64, 64, 256), dtype="bf16")
    r = V.check_accuracy(cand("bf16acc", half_acc_fn(16, torch.bfloat16)), p, CPU, seeds=[0, 1])
    assert not r.passed and r.name == "accuracy" and "fp16 accumulation" in r.reason


def test_acc_fp16_tolerance():
    """acc='fp16' problems: an fp16 accumulator is the contract; worse than that still fails."""
    for shape in [(64, 64, 64), (33, 65, 129), (16, 16, 2048)]:
        p = P(shape, acc="fp16")
        for fn in (correct_fn(), half_acc_fn(16), half_acc_fn(8)):
            r = V.check_accuracy(cand("ok", fn), p, CPU, seeds=[0, 1, 2])
            assert r.passed, r.reason
        r = V.check_accuracy(cand("per_product", half_acc_fn(1)), p, CPU, seeds=[0])
        assert not r.passed and "fp16 accumulator updated every 16 products" in r.reason
    r = V.check_accuracy(cand("bf16in", bf16_inputs_fn), P((64, 64, 256), acc="fp16"), CPU, seeds=[0])
    assert not r.passed and r.name == "accuracy"


def test_one_wrong_element_fails_element_bound():
    def fn(a, b, bt, c):
        correct_fn()(a, b, bt, c)
        c[5, 7] = c[5, 7] * (1 + 2 ** -8)  # a few ulps: R barely moves
    r = V.check_accuracy(cand("one_off", fn), P((64, 64, 64)), CPU, seeds=[0])
    assert not r.passed and "C[5,7]" in r.reason and "element bound" in r.reason
    assert r.stats["r"] < V.FP32_ACC.r_max  # only the element-wise bound sees it


def test_wrong_values_named_as_such():
    def skip_last_chunk(a, b, bt, c):
        c.copy_((a[:, :-8].float() @ b[:-8].float()).to(c.dtype))
    r = V.check_accuracy(cand("skip", skip_last_chunk), P((64, 64, 72)), CPU, seeds=[0])
    assert not r.passed and "wrong values" in r.reason and r.stats["r"] > 256


def test_exact_int_inputs_are_exact():
    for dtype, k in (("fp16", 13), ("fp16", 129), ("fp16", 5000), ("bf16", 40), ("bf16", 3000)):
        p = P((9, 11, k), dtype=dtype)
        a, b = V._int_inputs(p, torch.device(CPU), seed=k)
        bound = float((a.double().abs() @ b.double().abs()).max())
        assert 0 < bound <= V._EXACT_INT[dtype]
        assert torch.equal(a.double(), a.double().round()) and bool((a != 0).any()) and bool((b != 0).any())


def test_exact_int_catches_a_dropped_product():
    def fn(a, b, bt, c):  # the last column misses its last product
        c.copy_((a.float() @ b.float()).to(c.dtype))
        c[:, -1] = (a[:, :-1].float() @ b[:-1, -1].float()).to(c.dtype)
    v = V.verify(cand("drop", fn), P((20, 30, 50)), CPU, trials=1)
    assert not v.passed and v.failed_check == "exact_int" and "cols 29..29" in v.reason


# ----------------------------------------------------------------------------------------------------
# Integrity: NaN fill, guard bands, inputs, cached results, tampering, threads, crashes
# ----------------------------------------------------------------------------------------------------
def test_partial_write_fails_nan_fill():
    def fn(a, b, bt, c):
        c[:-1].copy_((a[:-1].float() @ b.float()).to(c.dtype))
    v = V.verify(cand("partial", fn), P((33, 65, 129)), CPU)
    assert not v.passed and v.failed_check == "nan_fill" and "65 of 2145" in v.reason


def test_accumulating_into_c_fails_nan_fill():
    def fn(a, b, bt, c):
        c.add_((a.float() @ b.float()).to(c.dtype))
    v = V.verify(cand("acc_into_c", fn), P((16, 16, 32)), CPU)
    assert not v.passed and v.failed_check == "nan_fill"


@pytest.mark.parametrize("offset", ["after", "before"])
def test_write_outside_c_fails_guard_band(offset):
    def fn(a, b, bt, c):
        correct_fn()(a, b, bt, c)
        start = c.storage_offset() + (c.numel() if offset == "after" else -1)
        torch.as_strided(c, (1,), (1,), start).fill_(1.0)
    v = V.verify(cand("oob", fn), P((17, 19, 23)), CPU)
    assert not v.passed and v.failed_check == "guard_band"
    assert f"guard band {offset} c" in v.reason and "1 elements" in v.reason


def test_input_mutation_fails():
    def fn(a, b, bt, c):
        correct_fn()(a, b, bt, c)
        bt[3, 2] = 0.0
    v = V.verify(cand("mutate", fn), P((17, 19, 23)), CPU)
    assert not v.passed and v.failed_check == "inputs_unchanged" and "input bt" in v.reason


def test_cached_result_fails():
    cache = {}

    def fn(a, b, bt, c):  # computes once per output buffer, then replays
        if c.data_ptr() not in cache:
            correct_fn()(a, b, bt, c)
            cache[c.data_ptr()] = c.clone()
        c.copy_(cache[c.data_ptr()])
    r = V.check_second_call(cand("cached", fn), P((32, 48, 64)), CPU, seeds=[1, 2])
    assert not r.passed and r.name == "second_call" and "cached" in r.reason
    cache.clear()
    assert not V.verify(cand("cached", fn), P((32, 48, 64)), CPU).passed


def test_timing_tamper_fails_and_is_undone():
    orig_pc, orig_sync = time.perf_counter, torch.cuda.synchronize

    def fn(a, b, bt, c):
        correct_fn()(a, b, bt, c)
        time.perf_counter = lambda: 0.0
        torch.cuda.synchronize = lambda *args, **kw: None
    v = V.verify(cand("tamper", fn), P((8, 8, 16)), CPU)
    assert time.perf_counter is orig_pc and torch.cuda.synchronize is orig_sync
    assert not v.passed and v.failed_check == "tamper"
    assert "time.perf_counter" in v.reason and "torch.cuda.synchronize" in v.reason


def test_thread_left_running_fails():
    done = threading.Event()

    def fn(a, b, bt, c):
        def late():
            done.wait(5)
            correct_fn()(a, b, bt, c)
        threading.Thread(target=late, daemon=True).start()
    try:
        v = V.verify(cand("thread", fn), P((8, 8, 16)), CPU)
    finally:
        done.set()
    assert not v.passed and v.failed_check == "tamper" and "thread" in v.reason


def test_crash_is_a_failed_check():
    def fn(a, b, bt, c):
        raise RuntimeError("illegal memory access")
    v = V.verify(cand("crash", fn), P((8, 8, 16)), CPU)
    assert not v.passed and v.failed_check == "crash" and "illegal memory access" in v.reason


# ----------------------------------------------------------------------------------------------------
# CUDA-L2's check, rows, import hygiene
# ----------------------------------------------------------------------------------------------------
def test_cuda_l2_check_cannot_see_fp16_accumulation():
    p = P((64, 64, 256))
    f16 = cand("f16acc", half_acc_fn())
    l2 = V.cuda_l2_check(f16, p, CPU, iterations=10, seed=0)
    assert l2.passed and l2.name == "cuda_l2" and l2.stats["iterations"] == 10, l2
    v = V.verify(f16, p, CPU, cuda_l2=True, cuda_l2_iterations=5)
    assert not v.passed and v.failed_check == "accuracy" and v.cuda_l2.passed


def test_cuda_l2_check_failures():
    p = P((24, 40, 72))

    def skip_last(a, b, bt, c):
        c.copy_((a[:, :-8].float() @ b[:-8].float()).to(c.dtype))

    def oob(a, b, bt, c):
        correct_fn()(a, b, bt, c)
        torch.as_strided(c, (1,), (1,), c.storage_offset() + c.numel()).fill_(3.0)

    assert V.cuda_l2_check(cand("ok", correct_fn("tn"), "tn"), p, CPU, iterations=5, seed=1).passed
    r = V.cuda_l2_check(cand("skip", skip_last), p, CPU, iterations=5, seed=1)
    assert not r.passed and "exceeds 0" in r.reason
    r = V.cuda_l2_check(cand("oob", oob), p, CPU, iterations=5, seed=1)
    assert not r.passed and "memory overflow" in r.reason
    # padded operands (its tile multiples): the candidate sees the padded shapes
    seen = []
    r = V.cuda_l2_check(cand("pad", lambda a, b, bt, c: (seen.append((a.shape, bt.shape)), correct_fn()(a, b, bt, c))),
                        p, CPU, iterations=2, padding=(8, 24, 8), seed=1)
    assert r.passed and seen[0] == (torch.Size([32, 80]), torch.Size([64, 80]))


def test_rows_for_csv():
    probs = [P((16, 24, 40)), P((16, 24, 40), dtype="bf16")]
    cands = [cand("fp32", correct_fn()), cand("f16acc", half_acc_fn())]
    rows = V.verify_rows(probs, cands, CPU, trials=2, cuda_l2_iterations=3)
    assert len(rows) == 8
    battery = {(r["dtype"], r["candidate"]): r for r in rows if r["check"] == "battery"}
    assert battery[("fp16", "fp32")]["verified"] and battery[("fp16", "fp32")]["reason"] == ""
    assert not battery[("fp16", "f16acc")]["verified"] and battery[("fp16", "f16acc")]["failed_check"] == "accuracy"
    assert all({"mnk", "dtype", "acc", "layout", "candidate", "check", "verified", "reason"} <= set(r) for r in rows)
    cal = V.calibrate(probs, lambda p: cands, range(3), CPU)
    assert len(cal) == 12 and all(r["error"] == "" for r in cal)
    assert max(r["r"] for r in cal if r["candidate"] == "fp32") < 1.01
    assert min(r["r"] for r in cal if r["candidate"] == "f16acc" and r["dtype"] == "fp16") > 1.3
    assert max(r["beta_needed"] for r in cal if r["candidate"] == "fp32") < 0.1
    summary = {(s["dtype"], s["candidate"]): s for s in V.calibration_summary(cal)}
    assert summary[("fp16", "fp32")]["n"] == 3 and summary[("fp16", "fp32")]["fails"] == 0
    assert summary[("fp16", "f16acc")]["fails"] == 3 and summary[("fp16", "f16acc")]["r_over_limit_max"] > 1


def test_import_does_nothing():
    code = "import sys, gemmrl.verify; assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    src = os.path.dirname(os.path.dirname(os.path.abspath(V.__file__)))
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": path})


# ----------------------------------------------------------------------------------------------------
# Planted Triton kernels: interpreter tier (CPU tensors) and GPU tier
# ----------------------------------------------------------------------------------------------------
def _check_planted(device, problem, layout, seeds=None, trials=2):
    for c in planted_candidates(layout):
        v = V.verify(c, problem, device, seeds=seeds, trials=trials)
        if c.expect:
            assert not v.passed, f"{c.name} ({c.why}) passed at {problem}"
            assert v.failed_check == c.expect, f"{c.name}: {v.reason}"
        else:
            assert v.passed, f"{c.name} at {problem}: {v.reason}"


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the interpreter's own int(array) in range()
@pytest.mark.parametrize("dtype,layout", [("fp16", "nn"), ("fp16", "tn"), ("bf16", "nn")])
def test_planted_triton_interpreter(dtype, layout):
    pytest.importorskip("triton")
    _check_planted(CPU, P((40, 48, 160), dtype=dtype), layout)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_planted_triton_interpreter_tails_and_cuda_l2():
    pytest.importorskip("triton")
    correct, f16 = planted_candidates("tn")[:2]
    v = V.verify(correct, P((17, 33, 50)), CPU, trials=1)
    assert v.passed, v.reason
    assert V.cuda_l2_check(f16, P((32, 32, 128)), CPU, iterations=2, seed=0).passed


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return "cuda"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 64, 64), (257, 129, 1000), (128, 256, 4096)])
@pytest.mark.parametrize("dtype,layout", [("fp16", "nn"), ("fp16", "tn"), ("bf16", "tn")])
def test_planted_triton_gpu(shape, dtype, layout):
    pytest.importorskip("triton")
    _check_planted(_cuda(), P(shape, dtype=dtype), layout, trials=3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (64, 64, 64), (1000, 1000, 4096)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_torch_matmul_gpu_passes(shape, dtype):
    dev = _cuda()
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    v = V.verify(cand("torch", lambda a, b, bt, c: torch.matmul(a, b, out=c)), P(shape, dtype=dtype), dev,
                 cuda_l2=True, cuda_l2_iterations=5)
    assert v.passed, v.reason
    assert v.stats["r"] < 1.1 and v.cuda_l2.passed


@pytest.mark.gpu
def test_side_stream_fails_gpu():
    dev = _cuda()

    def fn(a, b, bt, c):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(5_000_000)
            torch.matmul(a, b, out=c)
    v = V.verify(cand("side_stream", fn), P((256, 256, 256)), dev)
    assert not v.passed and v.failed_check == "stream", v.reason


@pytest.mark.gpu
def test_default_stream_launch_fails_stream_order_gpu():
    """A kernel on the legacy default stream (CUDA-L2's ``<<<grid, block, smem>>>`` with no stream) looks right
    when the current stream is the default one, and runs unordered on any other: caught by stream_order."""
    dev = _cuda()

    def fn(a, b, bt, c):
        with torch.cuda.stream(torch.cuda.default_stream()):
            torch.matmul(a, b, out=c)
    v = V.verify(cand("default_stream", fn), P((512, 512, 512)), dev)
    assert not v.passed and v.failed_check == "stream_order", v.reason
    assert "not run on torch's current stream" in v.reason


@pytest.mark.gpu
def test_joined_side_stream_passes_gpu():
    """Work on a side stream that waits on the current stream and is joined back is correctly ordered."""
    dev = _cuda()

    def fn(a, b, bt, c):
        cur = torch.cuda.current_stream()
        s = torch.cuda.Stream()
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            torch.matmul(a, b, out=c)
        cur.wait_stream(s)
    v = V.verify(cand("joined", fn), P((512, 512, 512)), dev)
    assert v.passed, v.reason


# ----------------------------------------------------------------------------------------------------
# Memoizing kernels: the memo check
# ----------------------------------------------------------------------------------------------------
def _memo(key_of, keep: int = 1):
    """Replays a stored output when ``key_of(a, b, c)`` matches one of the last ``keep`` keys."""
    store: list = []

    def fn(a, b, bt, c):
        k = key_of(a, b, c)
        hit = next((out for kk, out in store if kk == k), None)
        if hit is not None:
            c.copy_(hit)
            return
        correct_fn()(a, b, bt, c)
        store.append((k, c.clone()))
        del store[:-keep]
    return fn


def _armed_after(n: int):
    calls: dict = {}

    def fn(a, b, bt, c):
        key = (a.data_ptr(), b.data_ptr(), c.data_ptr(), tuple(a.shape))
        calls[key] = calls.get(key, 0) + 1
        if calls[key] > n and ("out", key) in calls:
            c.copy_(calls[("out", key)])
            return
        correct_fn()(a, b, bt, c)
        calls[("out", key)] = c.clone()
    return fn


def _changed_rows_only():
    """Recomputes only the rows whose first element changed (and everything when a sample of B changed)."""
    prev: dict = {}

    def fn(a, b, bt, c):
        sig_a, sig_b = a[:, 0].clone(), float(b.reshape(-1)[::89].float().sum())
        if prev and prev["sig_b"] == sig_b and torch.equal(prev["sig_a"].isnan(), sig_a.isnan()) \
                and prev["sig_a"].shape == sig_a.shape:
            rows = (sig_a != prev["sig_a"]).nonzero().view(-1)
            out = prev["out"].clone()
            out[rows] = (a[rows].float() @ b.float()).to(c.dtype)
            c.copy_(out)
        else:
            correct_fn()(a, b, bt, c)
        prev.update(sig_a=sig_a, sig_b=sig_b, out=c.clone())
    return fn


def _changed_cols_only():
    """Recomputes only the columns whose first element changed (and everything when A changed anywhere)."""
    prev: dict = {}

    def fn(a, b, bt, c):
        sig_a, sig_b = a.double().sum().item(), b[0].clone()
        if prev and prev["sig_a"] == sig_a and prev["sig_b"].shape == sig_b.shape:
            cols = (sig_b != prev["sig_b"]).nonzero().view(-1)
            out = prev["out"].clone()
            out[:, cols] = (a.float() @ b[:, cols].float()).to(c.dtype)
            c.copy_(out)
        else:
            correct_fn()(a, b, bt, c)
        prev.update(sig_a=sig_a, sig_b=sig_b, out=c.clone())
    return fn


MEMOS = {
    "row 0 of A and B": lambda: _memo(lambda a, b, c: (tuple(a[0].tolist()), tuple(b[0].tolist()))),
    "sampled checksum": lambda: _memo(lambda a, b, c: (float(a.reshape(-1)[::97].float().sum()),
                                                       float(b.reshape(-1)[::89].float().sum()))),
    "pointers and shape, armed after 3 calls": lambda: _armed_after(3),
    "4 outputs by sampled checksum": lambda: _memo(lambda a, b, c: (float(a.reshape(-1)[::97].float().sum()),
                                                                    float(b.reshape(-1)[::89].float().sum())), keep=4),
    "only changed rows recomputed": _changed_rows_only,
    # caught only where one element of B changes: every other step changes all of A or a sampled column of B
    "all of A, sampled checksum of B": lambda: _memo(lambda a, b, c: (a.double().sum().item(),
                                                                      float(b.reshape(-1)[::89].float().sum()))),
    "only changed columns recomputed": _changed_cols_only,
}


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 64, 256), (33, 65, 129), (7, 300, 17)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_memo_check_passes_correct_kernels(shape, dtype, layout):
    for seed in range(3):
        r = V.check_memo(cand("ok", correct_fn(layout), layout), P(shape, dtype=dtype, layout=layout), CPU, seed)
        assert r.passed, r.reason


@pytest.mark.parametrize("kind", list(MEMOS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_memo_check_rejects_every_memo(kind, seed):
    r = V.check_memo(cand("memo", MEMOS[kind]()), P((33, 65, 129)), CPU, seed)
    assert not r.passed and r.name == "memo" and r.reason.startswith("memo: after calls on other inputs"), r


@pytest.mark.parametrize("kind", list(MEMOS))
def test_the_battery_rejects_every_memo(kind):
    v = V.verify(cand("memo", MEMOS[kind]()), P((33, 65, 129)), CPU, seeds=[11, 12, 13])
    assert not v.passed and v.failed_check in ("memo", "second_call", "accuracy", "exact_int"), v.reason


# ----------------------------------------------------------------------------------------------------
# check_output: a product computed on the caller's own operands (a model's activations and weights)
# ----------------------------------------------------------------------------------------------------
def _operands(shape, dtype, scale=1.0, seed=0):
    M, N, K = shape
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype])
    a = (torch.randn(M, K, generator=g) * scale).to(dt)   # activations need not be unit-scale
    w = (torch.randn(N, K, generator=g) / math.sqrt(K)).to(dt)  # a weight [N, K]; the operand is its transpose
    return a, w.t()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(1, 300, 64), (3, 257, 4096), (64, 128, 1000), (256, 96, 33)])
def test_check_output_passes_a_correctly_accumulated_product(shape, dtype):
    a, b = _operands(shape, dtype, scale=3.0)
    c = (a.float() @ b.float()).to(a.dtype)
    r = V.check_output(c, a, b, P(shape, dtype=dtype, layout="tn"))
    assert r.passed, r.reason
    assert r.stats["r"] <= r.stats["r_limit"] and r.stats["tolerance"] == "fp32"


@pytest.mark.parametrize("shape", [(16, 256, 256), (2, 512, 4096)])
def test_check_output_fails_fp16_accumulation_and_a_wrong_element(shape):
    a, b = _operands(shape, "fp16")
    p = P(shape, layout="tn")
    acc = torch.zeros(shape[0], shape[1], dtype=torch.float16)
    for k0 in range(0, shape[2], 16):
        acc = (acc.float() + a[:, k0:k0 + 16].float() @ b[k0:k0 + 16].float()).half()
    r = V.check_output(acc, a, b, p)
    assert not r.passed and r.name == "accuracy" and "accumulation" in r.reason
    c = (a.float() @ b.float()).half()
    c[1, 3] += 0.05 * c.abs().max()  # one element off by a few percent of the output's scale
    r = V.check_output(c, a, b, p)
    assert not r.passed and "C[1,3]" in r.reason
