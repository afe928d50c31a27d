"""The LLM proposer and the LLM reward: prompts, extraction, Triton-source candidates, the real ``openai`` client
against a local scripted OpenAI-compatible server, the JSONL trajectories, the TRL / verl reward functions and
the HTTP reward server. CPU tier: Triton kernels run under the interpreter; no vendor baseline is timed, so a
verified kernel scores NO_BASELINE_REWARD (0.0) with verdict ok."""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from gemmrl.cli.main import main
from gemmrl.measure.evaluate import CandidateSpec
from gemmrl.kernels.cuda_source import CudaSource, ShapeRange
from gemmrl.kernels.triton_source import TritonSource, load_candidate
from gemmrl.problem import GemmProblem
from gemmrl.search import llm
from gemmrl.search.reward import (compute_score, dataset_rows, make_trl_reward, outcome_from_record, score_many,
                                  set_default_executor)
from gemmrl.search.reward_rule import FAIL_REWARD, MIN_OK_REWARD, NO_BASELINE_REWARD, training_reward
from gemmrl.search.reward_server import RewardServer, RewardServerError, check_host, serve_reward
from gemmrl.search.executor import GroupResult, InlineExecutor, RequestTemplate
from gemmrl.search.proposer import Context, Hardware, Outcome, Proposal
from gemmrl.timing import TimingConfig

PROBLEM = GemmProblem(33, 65, 40, layout="nn")
CONFIG = "tiled(BM=32,BN=32,BK=16,warps=4,stages=2,group_m=8)"

KERNEL = '''# gemmrl: layout=nn shapes=any
import triton
import triton.language as tl


@triton.jit
def _mm(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, LAST_K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn, mask=(kk[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    _mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
              BM=32, BN=32, BK=16)
'''
GOOD_KERNEL = KERNEL.replace("LAST_K", "K")
WRONG_KERNEL = KERNEL.replace("LAST_K", "((K + BK - 1) // BK - 1) * BK")  # skips the last K tile
CHEAT_KERNEL = GOOD_KERNEL.replace("    M, K = a.shape\n", "    return  # C is never written\n    M, K = a.shape\n")

ANSWERS = {
    "config": f'I would use a small tile.\n```json\n{{"family": "triton", "config": "{CONFIG}", "layout": "nn"}}\n```',
    "kernel": f"Here is a kernel:\n```python\n{GOOD_KERNEL}```\n",
    "wrong": f"```python\n{WRONG_KERNEL}```",
    "cheat": f"```python\n{CHEAT_KERNEL}```",
    "garbage": "I think the best approach is to use tensor cores and a large tile. Good luck!",
}
CUDA = '''// gemmrl: entry=my_gemm layout=tn shapes=M%1,N=1..128,K%8
#include <cuda_runtime.h>
extern "C" int my_gemm(const void* A, const void* B, void* C, int M, int N, int K, int lda, int ldb, int ldc,
                       void* ws, size_t ws_bytes, cudaStream_t stream) { return 0; }
'''


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))  # candidate files stay out of the user cache


def cpu_executor() -> InlineExecutor:
    return InlineExecutor(RequestTemplate(device="cpu", protocols=("offline",), baselines=(), graph_check=False,
                                          timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05)))


# ---------------------------------------------------------------------------------------------------------
# a scripted OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------------------
class ScriptedLLM:
    """POST /v1/chat/completions answers with the scripted completions in order; every request is kept."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        owner = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if self.path != "/v1/chat/completions" or body.get("model") == "missing":
                    return self._send(404, {"error": {"message": f"model {body.get('model')} not found",
                                                      "type": "invalid_request_error"}})
                n = body.get("n", 1)
                texts = [owner.script.pop(0) for _ in range(n)]
                self._send(200, {"id": f"chatcmpl-{len(owner.requests)}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body["model"],
                                 "choices": [{"index": i, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": t}}
                                             for i, t in enumerate(texts)],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def make(script):
        servers.append(ScriptedLLM(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _config(url, model="scripted", **kw):
    return llm.LLMConfig(base_url=url, model=model, api_key="test-key", timeout_s=30, max_retries=0, **kw)


# ---------------------------------------------------------------------------------------------------------
# the proposer, end to end
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.interpreter
def test_proposer_through_the_real_client(scripted, tmp_path):
    order = ["config", "kernel", "wrong", "cheat", "garbage"]
    server = scripted([ANSWERS[k] for k in order] + [ANSWERS["config"].replace("BK=16", "BK=32")])
    log = tmp_path / "trajectories.jsonl"
    prop = llm.LLMProposer(_config(server.base_url), log_path=log)
    ctx = Context(PROBLEM, Hardware())
    props = prop.propose(ctx, 5, random.Random(0))

    assert len(server.requests) == 5
    req = server.requests[0]
    assert req["model"] == "scripted" and req["auth"] == "Bearer test-key" and isinstance(req["seed"], int)
    assert [m["role"] for m in req["messages"]] == ["system", "user"] and "33_65_40" in req["messages"][1]["content"]
    assert [p.spec.family for p in props] == ["triton", "triton_source", "triton_source", "triton_source"]
    assert all(p.source == "llm" for p in props) and len({p.info for p in props}) == 4
    assert [(r.verdict, r.completion) for r in prop.rejected] == [("extract", ANSWERS["garbage"])]

    got = cpu_executor().submit(PROBLEM, [p.spec for p in props]).result()
    outcomes = [outcome_from_record(PROBLEM, p, ev) for p, ev in zip(props, got.evaluations)]
    assert [o.verdict for o in outcomes] + [r.verdict for r in prop.rejected] == \
        ["ok", "ok", "rejected", "rejected", "extract"], [o.reason for o in outcomes]
    prop.update(ctx, outcomes)

    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 5
    by_completion = {line["completion"][0]["content"]: line for line in lines}
    expect = {"config": ("ok", 0.0), "kernel": ("ok", 0.0), "wrong": ("rejected", -1.0), "cheat": ("rejected", -1.0),
              "garbage": ("extract", -1.0)}
    for key, (verdict, reward) in expect.items():
        line = by_completion[ANSWERS[key]]
        assert (line["verdict"], line["reward"]) == (verdict, reward), key
        assert line["prompt"] == req["messages"] and line["completion"][0]["role"] == "assistant"
        assert line["mnk"] == "33_65_40" and line["timestamp"] and math.isfinite(line["reward"])
    assert "exact" in by_completion[ANSWERS["wrong"]]["reason"]  # the missing K tile, seen by the integer check
    assert "not written" in by_completion[ANSWERS["cheat"]]["reason"]
    assert "no fenced" in by_completion[ANSWERS["garbage"]]["reason"]
    assert by_completion[ANSWERS["config"]]["measured_reward"] is None  # NaN never reaches the JSON

    # the next prompt for this shape carries why answers failed and what was already verified
    again = prop.propose(Context(PROBLEM, Hardware(), own=tuple(outcomes)), 1, random.Random(1))
    user = server.requests[-1]["messages"][1]["content"]
    assert len(again) == 1 and "BK=32" in again[0].spec.payload
    assert "not used (extract)" in user and "no fenced" in user
    assert "rejected" in user and "Verified at this shape already" in user


@pytest.mark.interpreter
def test_a_repeated_answer_is_not_proposed_again(scripted, tmp_path):
    server = scripted([ANSWERS["config"]])
    prop = llm.LLMProposer(_config(server.base_url), log_path=tmp_path / "t.jsonl")
    earlier = Proposal(llm.extract(ANSWERS["config"], PROBLEM), "llm")
    ctx = Context(PROBLEM, own=(Outcome(PROBLEM, earlier, "ok"),))
    assert prop.propose(ctx, 1, random.Random(0)) == []
    assert prop.rejected[-1].verdict == "duplicate"
    line = json.loads((tmp_path / "t.jsonl").read_text())
    assert line["verdict"] == "duplicate" and line["reward"] == FAIL_REWARD


def test_endpoint_refusal_is_a_config_error(scripted, tmp_path):
    server = scripted([])
    prop = llm.LLMProposer(_config(server.base_url, model="missing"), log_path=tmp_path / "t.jsonl")
    with pytest.raises(llm.LLMConfigError, match="GEMMRL_LLM_MODEL"):
        prop.propose(Context(PROBLEM), 1, random.Random(0))


def test_unreachable_endpoint_ends_the_round_with_a_warning(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prop = llm.LLMProposer(_config(f"http://127.0.0.1:{port}/v1"), log_path=tmp_path / "t.jsonl")
    with pytest.warns(RuntimeWarning, match="APIConnectionError"):
        assert prop.propose(Context(PROBLEM), 2, random.Random(0)) == []


def test_config_from_env():
    env = {"GEMMRL_LLM_BASE_URL": "http://h:1/v1", "GEMMRL_LLM_MODEL": "m", "OPENAI_API_KEY": "secret-xyz",
           "GEMMRL_LLM_N": "4"}
    c = llm.LLMConfig.from_env(env, temperature=0.2, max_tokens=None)
    assert (c.base_url, c.model, c.api_key, c.n, c.temperature, c.max_tokens) == ("http://h:1/v1", "m", "secret-xyz", 4, 0.2,
                                                                                 4096)
    assert "secret-xyz" not in repr(c)  # the key is not printed
    c = llm.LLMConfig.from_env({"OPENAI_BASE_URL": "http://o/v1", "GEMMRL_LLM_MODEL": "m",
                                "GEMMRL_LLM_API_KEY": "g", "OPENAI_API_KEY": "o"})
    assert (c.base_url, c.api_key) == ("http://o/v1", "g")
    with pytest.raises(llm.LLMConfigError, match="GEMMRL_LLM_BASE_URL"):
        llm.LLMConfig.from_env({"GEMMRL_LLM_MODEL": "m"})
    with pytest.raises(llm.LLMConfigError, match="GEMMRL_LLM_N"):
        llm.LLMConfig.from_env({**env, "GEMMRL_LLM_N": "many"})


# ---------------------------------------------------------------------------------------------------------
# the prompt
# ---------------------------------------------------------------------------------------------------------
def _outcome(problem, config, reward, verdict="ok", **kw):
    spec = CandidateSpec("triton", config, layout="tn")
    return Outcome(problem, Proposal(spec, "llm"), verdict, reward, **kw)


def test_prompt_is_contrastive_and_carries_the_hardware_and_the_last_errors():
    hw = Hardware(name="NVIDIA H200", sms=132, smem_per_block_kib=227, l2_mib=60, sm_clock_mhz=1980,
                  mem_clock_mhz=3201)
    near = GemmProblem(64, 128, 64)
    configs = [f"tiled(BM={bm},BN=64,BK=32,warps=4,stages=3,group_m=8)" for bm in (16, 32, 64, 128)]
    neighbours = (_outcome(near, configs[0], math.log(1.37), speedup={"graph": 1.37}),
                  _outcome(near, configs[1], math.log(0.52)),
                  _outcome(near, configs[2], math.log(1.05)),
                  _outcome(near, configs[3], math.nan, "rejected", reason="never shown"))
    src = CudaSource("int x = ;\n", entry="gemm_fn", shapes=ShapeRange.parse("M=1..64"), name="cuda:mine")
    own = (Outcome(PROBLEM, Proposal(CandidateSpec("cuda", src), "llm"), "build",
                   build={"ok": False, "error": {"stage": "compile", "file": "<candidate>", "line": 42,
                                                 "message": "expected an expression"}}),
           _outcome(PROBLEM, configs[2], math.nan, "rejected", reason="exact_int: 17 elements differ"),
           _outcome(PROBLEM, configs[1], math.log(0.9), profile={"sm__throughput.avg.pct_of_peak": 61.5}))
    system, user = (m["content"] for m in llm.build_prompt(Context(PROBLEM, hw, own, neighbours), examples=1))
    for text in ("NVIDIA H200", "132 SMs", "227 KiB", "60 MiB L2", "1980 MHz", "3201 MHz", "M=33 N=65 K=40"):
        assert text in user, text
    best, worst = user.index("x1.370"), user.index("x0.520")
    assert best < user.index("Slowest") < worst and configs[0] in user and configs[1] in user
    assert "x1.050" not in user and "never shown" not in user  # one of each side; failures are not examples
    assert "<candidate>:42: expected an expression" in user and "exact_int: 17 elements differ" in user
    assert "sm__throughput.avg.pct_of_peak=61.5" in user
    assert "```json" in system and "# gemmrl: layout=" in system and 'extern "C" int' in system


def test_a_real_load_error_reaches_the_next_prompt():
    broken = "```python\n# gemmrl: layout=nn shapes=any\nimport triton\n\ndef gemm(a, b, c)\n    pass\n```"
    prop = Proposal(llm.extract(broken, PROBLEM), "llm")
    ev = cpu_executor().submit(PROBLEM, [prop.spec]).result().evaluations[0]
    o = outcome_from_record(PROBLEM, prop, ev)
    assert o.verdict == "build" and o.build["error"]["line"] == 4
    user = llm.build_prompt(Context(PROBLEM, own=(o,)))[1]["content"]
    assert "load error at <candidate>:4: SyntaxError" in user and "def gemm(a, b, c)\n" in user
    assert str(Path(o.build["file"]).parent) not in user  # scratch paths are not shown to the model


# ---------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------
def test_extract_each_format():
    spec = llm.extract(ANSWERS["config"], PROBLEM)
    assert (spec.family, spec.payload, spec.layout) == ("triton", CONFIG, "nn")
    spec = llm.extract(ANSWERS["kernel"], PROBLEM)
    assert spec.family == "triton_source" and spec.payload.code == GOOD_KERNEL and spec.layout == "nn"
    assert spec.payload.name == f"triton_source:{spec.payload.source_hash}" and spec.payload.admits(PROBLEM)
    spec = llm.extract(f"first try:\n```cuda\n{CUDA}```\n", GemmProblem(33, 65, 40))
    assert spec.family == "cuda" and spec.layout == "tn" and spec.payload.entry == "my_gemm"
    assert spec.payload.shapes == ShapeRange(n=(1, 128), k_mult=8) and spec.payload.name.startswith("cuda:llm-")
    spec = llm.extract('{"family": "triton", "config": "' + CONFIG + '"}', PROBLEM)  # bare JSON, problem's layout
    assert spec.layout == "nn"
    two = ANSWERS["config"] + "\nOn second thought:\n" + ANSWERS["kernel"]
    assert llm.extract(two, PROBLEM).family == "triton_source"  # the last block is the answer


@pytest.mark.parametrize("text,match", [
    ("", "empty answer"),
    (ANSWERS["garbage"], "no fenced"),
    ("```python\nimport triton\n", "not closed"),
    ('```json\n{"family": "cutlass", "config": "x"}\n```', "unknown family 'cutlass'"),
    ('```json\n{"family": "triton", "config": "tiled(BM=48,BN=64,BK=32,warps=4,stages=3,group_m=8)"}\n```',
     "invalid for 33_65_40"),
    ('```json\n{"family": "triton", "config": "huge(BM=1)"}\n```', "cannot parse config"),
    ('```json\n{"family": "triton"}\n```', 'no "config"'),
    ('```json\n{"family": "triton", "config": "' + CONFIG + '",}\n```', "does not parse"),
    ('```json\n{"family": "triton", "config": "' + CONFIG + '", "layout": "nt"}\n```', "layout 'nt'"),
    (f"```python\n{GOOD_KERNEL.splitlines()[1]}\n```", "no declaration line"),
    ("```python\n# gemmrl: layout=nn shapes=M=64..128\nimport triton\n```", "do not include the problem 33_65_40"),
    ("```python\n# gemmrl: layout=nn shapes=M=what\nimport triton\n```", "declared shapes"),
    ("```python\n# gemmrl: layout=nn\nimport triton\n```", "no shapes="),
    ("```cuda\n// gemmrl: layout=tn shapes=any\nint x;\n```", "no entry="),
])
def test_extract_refuses_with_what_to_do(text, match):
    with pytest.raises(llm.ExtractError, match=match):
        llm.extract(text, PROBLEM)


# ---------------------------------------------------------------------------------------------------------
# Triton source candidates
# ---------------------------------------------------------------------------------------------------------
def test_triton_source_load_errors_are_records():
    cand, rec = load_candidate(TritonSource("import triton\n\ndef gemm(a, b, c)\n    pass\n"))
    err = rec["error"]
    assert cand is None and rec["ok"] is False and (err["stage"], err["file"], err["line"]) == ("load", "<candidate>", 3)
    assert "SyntaxError" in err["message"]
    cand, rec = load_candidate(TritonSource("x = 1\ny = 1 / 0\n"))
    assert cand is None and rec["error"]["line"] == 2 and "ZeroDivisionError" in rec["error"]["message"]
    cand, rec = load_candidate(TritonSource("def matmul(a, b, c):\n    pass\n"))
    assert cand is None and "no function 'gemm'" in rec["error"]["message"] and "matmul" in rec["error"]["message"]


def test_triton_source_declaration():
    src = TritonSource("def gemm(a, b, c): pass\n", layout="tn", shapes=ShapeRange.parse("M=1..64,N%8"))
    assert src.admits(GemmProblem(64, 16, 3)) and not src.admits(GemmProblem(65, 16, 3))
    assert not src.admits(GemmProblem(64, 16, 3, dtype="bf16"))
    cand, rec = load_candidate(src)
    assert rec["ok"] and (cand.name, cand.layout, cand.acc) == (src.name, "tn", "fp32")
    assert cand.info()["source_hash"] == src.source_hash
    with pytest.raises(ValueError, match="layout"):
        TritonSource("x", layout="nt")


@pytest.mark.interpreter
def test_scoring_through_the_sandbox(tmp_path):
    """The path a served reward takes: candidates built and run in an isolated worker, which may write only to
    its scratch dir (the Triton source goes there when the build cache is not writable)."""
    from gemmrl.search.executor import SandboxExecutor

    ex = SandboxExecutor(template=cpu_executor().template, timeout_s=120, n_workers=1, gpus=(),
                         scratch_root=tmp_path, env={"TRITON_INTERPRET": "1"})
    try:
        got = score_many([ANSWERS[k] for k in ("kernel", "wrong", "garbage")], [PROBLEM] * 3, ex)
    finally:
        ex.close()
    assert [g[:2] for g in got] == [(0.0, "ok"), (-1.0, "rejected"), (-1.0, "extract")], got


@pytest.mark.interpreter
def test_triton_source_outside_its_declaration_is_never_loaded():
    spec = llm.extract(ANSWERS["kernel"].replace("shapes=any", "shapes=M=1..64"), PROBLEM)
    got = cpu_executor().submit(GemmProblem(65, 65, 40, layout="nn"), [spec]).result().evaluations[0]
    assert got["failure"] == "shape" and "M=1..64" in got["reason"]


# ---------------------------------------------------------------------------------------------------------
# the reward as a library: training_reward, TRL, verl
# ---------------------------------------------------------------------------------------------------------
def test_training_reward_ranks_every_verified_kernel_above_every_failure():
    assert training_reward("ok", math.log(1.2)) == pytest.approx(math.log(1.2))
    assert training_reward("ok", math.nan) == NO_BASELINE_REWARD == 0.0
    assert training_reward("ok", math.log(0.01)) == MIN_OK_REWARD > FAIL_REWARD
    for verdict in ("extract", "build", "rejected", "timeout", "crash"):
        assert training_reward(verdict, 0.5) == FAIL_REWARD


@pytest.mark.interpreter
def test_compute_score_and_trl_reward():
    ex = cpu_executor()
    set_default_executor(ex)
    try:
        assert compute_score("gemmrl", ANSWERS["config"], "33_65_40", {"layout": "nn"}) == 0.0
        assert compute_score("gemmrl", ANSWERS["wrong"], json.dumps({"mnk": "33_65_40", "layout": "nn"})) == -1.0
        assert compute_score("gemmrl", ANSWERS["garbage"], {"mnk": "33_65_40"}) == -1.0
    finally:
        set_default_executor(None)
    fn = make_trl_reward(ex)
    completions = [[{"role": "assistant", "content": ANSWERS[k]}] for k in ("kernel", "cheat", "garbage")]
    assert fn(prompts=[[]] * 3, completions=completions, mnk=["33_65_40"] * 3, layout=["nn"] * 3) == [0.0, -1.0, -1.0]
    fn = make_trl_reward(ex, {"shape-a": PROBLEM}, column="shape")
    assert fn([[]], [ANSWERS["config"]], shape=["shape-a"]) == [0.0]
    with pytest.raises(ValueError, match="'shape' column"):
        fn([[]], [ANSWERS["config"]], mnk=["33_65_40"])


def test_dataset_rows_carry_prompt_and_ground_truth():
    rows = dataset_rows([PROBLEM])
    assert rows[0]["mnk"] == "33_65_40" and rows[0]["prompt"][1]["role"] == "user"
    assert json.loads(rows[0]["reward_model"]["ground_truth"])["layout"] == "nn"


# ---------------------------------------------------------------------------------------------------------
# the reward server
# ---------------------------------------------------------------------------------------------------------
def _post(url, body, headers=None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", "/score", data, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


@pytest.mark.interpreter
def test_serve_reward_over_http():
    with serve_reward(executor=cpu_executor(), max_request_bytes=64 * 1024) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        status, got = _post(srv.url, {"completion": ANSWERS["config"], "mnk": "33_65_40", "layout": "nn"})
        assert status == 200 and (got["reward"], got["verdict"]) == (0.0, "ok")
        status, got = _post(srv.url, {"completion": ANSWERS["cheat"], "mnk": "33_65_40", "layout": "nn"})
        assert status == 200 and (got["reward"], got["verdict"]) == (-1.0, "rejected") and got["reason"]
        status, got = _post(srv.url, {"completion": ANSWERS["garbage"], "mnk": "33_65_40"})
        assert status == 200 and got["verdict"] == "extract" and "no fenced" in got["reason"]
        for body, match in ((b"{not json", "not JSON"), ({"mnk": "33_65_40"}, "completion"),
                            ({"completion": "x"}, "mnk"), ({"completion": "x", "mnk": "33x65"}, "M_N_K"),
                            ({"completion": "x", "mnk": "33_65_40", "dtype": "fp8"}, "dtype"), (b"[1]", "object")):
            status, got = _post(srv.url, body)
            assert status == 400 and match in got["error"], (body, got)
        status, got = _post(srv.url, b"x" * (64 * 1024 + 1))
        assert status == 413 and "65536" in got["error"]
        host, port = srv.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)  # a huge declared body is never read
        conn.putrequest("POST", "/score")
        conn.putheader("Content-Length", str(1 << 30))
        conn.endheaders()
        assert conn.getresponse().status == 413
        conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/health")
        r = conn.getresponse()
        health = json.loads(r.read())
        assert r.status == 200 and health["ok"] is True and health["device"] == "cpu"
        conn.close()


class _StuckExecutor:
    """Never finishes a group until released."""

    slots = 1

    def __init__(self):
        self.futures = []

    def submit(self, problem, specs):
        self.futures.append(Future())
        return self.futures[-1]

    def close(self):
        pass


def test_serve_reward_time_limit():
    ex = _StuckExecutor()
    with serve_reward(executor=ex, time_limit_s=0.3) as srv:
        t0 = time.monotonic()
        status, got = _post(srv.url, {"completion": ANSWERS["config"], "mnk": "33_65_40", "layout": "nn"})
        assert status == 504 and "--time-limit-s" in got["error"] and time.monotonic() - t0 < 10
    for f in ex.futures:
        f.set_result(GroupResult(PROBLEM, ({"failure": "", "reward": 0.0},)))


def test_serve_reward_drops_clients_that_stop_mid_body(capfd):
    """Clients that send part of a body and stall are dropped after the read timeout, quietly, and the server keeps
    answering the others."""
    import socket
    import urllib.request

    with serve_reward(executor=cpu_executor(), read_timeout_s=0.5) as srv:
        host, port = srv.httpd.server_address[:2]
        stalled = []
        for _ in range(20):
            s = socket.create_connection((host, port))
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"completion\"")
            stalled.append(s)
        time.sleep(1.5)
        for s in stalled:
            s.settimeout(5)
            assert s.recv(100) == b""  # closed by the server, nothing sent back
            s.close()
        with urllib.request.urlopen(f"{srv.url}/health", timeout=10) as r:
            assert json.loads(r.read())["ok"] is True
    assert "Traceback" not in capfd.readouterr().err


def test_cli_serve_reward_needs_a_gpu_for_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert main(["serve-reward", "--port", "0"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_serve_reward_refuses_a_remote_address_unless_allowed():
    for host in ("0.0.0.0", "192.168.1.10", "example.org", "::"):
        with pytest.raises(RewardServerError, match="allow_remote"):
            RewardServer(_StuckExecutor(), host=host)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_host(host)
    check_host("0.0.0.0", allow_remote=True)


def test_cli_serve_reward(capsys):
    from gemmrl.cli.main import build_parser, main

    args = build_parser().parse_args(["serve-reward"])
    assert (args.host, args.allow_remote, args.max_request_kb, args.device, args.sandbox) == \
        ("127.0.0.1", False, 256, "cuda", True)
    assert build_parser().parse_args(["serve-reward", "--no-sandbox", "--device", "cpu"]).sandbox is False
    assert main(["serve-reward", "--host", "0.0.0.0", "--no-sandbox"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
