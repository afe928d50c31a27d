"""Bad input at every public entry point: a clear error that says what to do, and nothing lost.

CPU tier, no GPU needed: every failure here happens before any GPU work, so the same cases hold on a GPU machine.
- every CLI subcommand, in-process through ``gemmrl.cli.main.main``: malformed flags exit 2 with one line on stderr
  (argparse's own errors: usage plus one error line), never a traceback;
- "nothing lost": a refused command leaves every file it was pointed at (results CSV, trials store, policy, user
  library) byte-identical, creates nothing beside them, and a resumed results CSV keeps every finished row;
- corrupt, truncated or foreign library files are refused wherever they enter (``gemmrl lib import``,
  ``gemmrl.use_library``, ``GEMMRL_LIBRARY``) and another GPU's entries are never served here;
- ``gemmrl.mm`` / ``gemmrl.linear`` / ``gemmrl.warmup`` arguments that test_dispatch.py and test_dispatch_fuzz.py
  do not already cover (they cover fp32 and mixed fp16/bf16, K mismatch, 1-D a, batched b, a non-tensor operand and
  a wrong-shape/dtype/non-contiguous out), on the C hot path and the Python one.

Run: python -m pytest -q tests/cli/test_bad_input.py
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch

import gemmrl
from gemmrl.serve import dispatch
from gemmrl import library as L
from gemmrl.cli.main import main
from gemmrl.library import Entry, Library, LibraryError, TrialsStore
from gemmrl.problem import ProblemError
from gemmrl.results import COLUMNS, ResultsError, ResultsWriter, read_rows

GPU_H100 = "NVIDIA H100 80GB HBM3"
CFG = "tiled(BM=32,BN=32,BK=32,warps=4,stages=2,group_m=1)"


# -- fixtures -------------------------------------------------------------------------------------------------
def _entry(M=64, N=128, K=256, gpu=GPU_H100, **kw) -> Entry:
    d = dict(gpu=gpu, cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="offline", M=M, N=N, K=K,
             family="triton", impl=CFG, algo=CFG, time_ms=0.01, vendor_best_ms=0.02, vendor_best="cublas_tn",
             m_lo=M, m_hi=M, members=(f"{M}_{N}_{K}",), verified=True)
    d.update(kw)
    return Entry(**d)


def _result_row(mnk="64_128_256", cand="cublas_tn", reason="") -> dict:
    m, n, k = mnk.split("_")
    return dict(mnk=mnk, dtype="fp16", acc="fp32", layout="tn", candidate=cand, protocol="offline", time_ms=1.0,
                verified=True, reason=reason, gpu=GPU_H100, M=m, N=n, K=k, rep=0)


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A user's data: results, a trials store with a run, a policy, a good library, the user library; and bad files."""
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GEMMRL_LIBRARY", raising=False)
    d = tmp_path / "data"
    d.mkdir()
    f = {"tmp": str(d), "missing": str(d / "missing.txt")}
    ResultsWriter(d / "results.csv").write_batch([_result_row(), _result_row(cand="torch")])
    f["results"] = str(d / "results.csv")
    st = TrialsStore(d / "trials.sqlite")
    st.add_outcomes([{"gpu": "model:" + GPU_H100, "mnk": "64_64_64", "dtype": "fp16", "acc": "fp32", "key": "k1",
                      "run": "tune", "proposer": "rl", "verdict": "ok", "reward": 0.1, "ts": "t"}], [], "tune:tune")
    st.checkpoint()
    st.close()
    f["trials"] = str(d / "trials.sqlite")
    f["policy"] = str(shutil.copy(Path(L.__file__).with_name("policies") / "h100.json", d / "policy.json"))
    good = Library([_entry(), _entry(M=128)])
    f["lib"] = str(good.save(d / "lib.json"))
    L.user_library_path().write_text(good.to_json())
    f["user_lib"] = str(L.user_library_path())

    def put(key: str, name: str, content: str | bytes) -> None:
        path = d / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        f[key] = str(path)

    doc = json.loads(good.to_json())
    put("lib_truncated", "lib_truncated.json", good.to_json()[: len(good.to_json()) // 2])
    edited = dict(doc, entries=[dict(doc["entries"][0], time_ms=0.001)] + doc["entries"][1:])
    put("lib_checksum", "lib_checksum.json", json.dumps(edited))
    put("lib_schema2", "lib_schema2.json", json.dumps(dict(doc, schema=2)))
    for key, field, value in (("lib_bad_gpu", "gpu", "../../etc/" + GPU_H100), ("lib_bad_impl", "impl", "a/../b")):
        ents = [dict(doc["entries"][0], **{field: value})]  # checksummed as written: refused for what it says
        put(key, f"{key}.json", json.dumps(dict(doc, entries=ents, sha256=L._digest(ents))))
    put("shapes_bad", "shapes_bad.txt", "64_64_64\n# a comment\n\n12_x_3\n")
    put("shapes_bad_csv", "shapes_bad.csv", "mnk,label\n64_64_64,a\n0_64_64,b\n")
    put("shapes_empty", "shapes_empty.txt", "# nothing here\n\n")
    put("binary", "binary.bin", b"\xff\xfe\x00\x81garbage")
    put("foreign_csv", "foreign.csv", "name,value\nx,1\n")
    put("text", "notes.txt", "not a results file\n")
    put("list_json", "list.json", "[1, 2, 3]")
    return f


def _fmt(argv: list[str], f: dict) -> list[str]:
    return [a.format(**f) for a in argv]


def _snapshot(*roots) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for r in roots for p in sorted(Path(r).rglob("*")) if p.is_file()}


def _usage_error(argv, capsys) -> str:
    """Run the CLI in-process; it must exit 2 with one line on stderr (argparse: usage, then one error line), and no
    traceback. Returns that error line."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code, own = e.code, False
    else:
        own = True
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    if own:
        assert len(lines) == 1, err
    else:
        assert lines[0].startswith("usage: gemmrl"), err
    assert lines[-1].startswith("gemmrl") and ": error: " in lines[-1], err
    return lines[-1]


def _id(argv: list[str]) -> str:
    """A test id: the command and its distinguishing flags (the shared prefixes left out)."""
    s = " ".join(argv)
    for common in (" --executor model --no-progress", " --mnk 64_64_64", " --trials {tmp}/new.sqlite",
                   " --trials {trials} --policy {policy}"):
        s = s.replace(common, "")
    return s


# -- shapes: every subcommand that takes --mnk / --grid / --shapes ----------------------------------------------
SHAPE_CMDS = {
    "bench": ["bench"], "select": ["select"], "verify": ["verify"], "warmup": ["warmup"],
    "tune": ["tune", "--executor", "model", "--no-progress", "--trials", "{tmp}/new.sqlite"],
}
SHAPE_CASES = [
    (["--mnk", "0_1_2"], ["M must be >= 1"]),
    (["--mnk", "64_64"], ["cannot parse shape '64_64'", "M_N_K"]),
    (["--mnk", "a_b_c"], ["cannot parse shape 'a_b_c'"]),
    (["--mnk=-64_64_64"], ["M must be >= 1, got -64"]),
    (["--mnk", "64_-1_64"], ["N must be >= 1"]),
    (["--mnk", "64_64_64,"], ["cannot parse shape ''"]),
    (["--mnk", "2000000_64_64"], ["exceeds", "split the GEMM"]),
    (["--shapes", "{missing}"], ["{missing}", "no such file"]),
    (["--shapes", "{tmp}"], ["no such file"]),
    (["--shapes", "{shapes_bad}"], ["{shapes_bad}:4:", "'12_x_3'", "M_N_K"]),
    (["--shapes", "{shapes_bad_csv}"], ["{shapes_bad_csv}:3:", "M must be >= 1"]),
    (["--shapes", "{shapes_empty}"], ["holds no shapes", "one M_N_K per line"]),
    (["--shapes", "{binary}"], ["{binary} is not a text file"]),
    (["--grid", "cuda-l2", "--sample", "0"], ["--sample must be in 1..1000, got 0"]),
    (["--grid", "cuda-l2", "--sample", "1001"], ["--sample must be in 1..1000, got 1001"]),
    (["--grid", "other"], ["knows only 'cuda-l2'"]),
    (["--grid", "cuda-l2", "--part", "0/5"], ["--part takes K/N with 1 <= K <= N", "'0/5'"]),
    (["--grid", "cuda-l2", "--part", "half"], ["--part takes K/N"]),
    (["--mnk", "64_64_64,128_64_64", "--part", "1/3"], ["2 shape(s) cannot make 3 parts", "N <= 2"]),
    (["--mnk", "64_64_64", "--sample", "3"], ["--sample N draws N shapes of --grid"]),
    (["--mnk", "64_64_64", "--gpu-device-id", "-1"], ["--gpu-device-id takes a GPU index >= 0"]),
    ([], ["exactly one of --mnk"]),
    (["--mnk", "64_64_64", "--shapes", "{shapes_bad}"], ["exactly one of"]),
]


@pytest.mark.parametrize("cmd", SHAPE_CMDS)
@pytest.mark.parametrize("extra, needles", SHAPE_CASES, ids=[" ".join(c[0]) or "none" for c in SHAPE_CASES])
def test_shape_flags(data, capsys, cmd, extra, needles):
    line = _usage_error(_fmt(SHAPE_CMDS[cmd] + extra, data), capsys)
    assert line.startswith(f"gemmrl {cmd}: error: ")
    for n in needles:
        assert n.format(**data) in line, line


# -- argparse's own refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    ([], "required: cmd"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["bench", "--mnk", "64_64_64", "--dtype", "fp32"], "argument --dtype: invalid choice: 'fp32'"),
    (["bench", "--mnk", "64_64_64", "--acc", "bf16"], "argument --acc: invalid choice"),
    (["bench", "--mnk", "-64_64_64"], "argument --mnk: expected one argument"),
    (["bench", "--mnk", "64_64_64", "--repeat", "two"], "argument --repeat: invalid int value"),
    (["bench", "--mnk", "64_64_64", "--target-qps", "fast"], "argument --target-qps: invalid float value"),
    (["bench", "--mnk", "64_64_64", "--abi", "cuda"], "argument --abi: invalid choice"),
    (["bench", "--mnk", "64_64_64", "--timing", "fast"], "argument --timing: invalid choice: 'fast'"),
    (["bench", "--mnk", "64_64_64", "--host-loop", "crowd"], "argument --host-loop: invalid choice: 'crowd'"),
    (["select", "--mnk", "64_64_64", "--family", "cublas"], "argument --family: invalid choice"),
    (["tune", "--mnk", "64_64_64", "--proposer", "gpt"], "argument --proposer: invalid choice: 'gpt'"),
    (["tune", "--mnk", "64_64_64", "--executor", "cloud"], "argument --executor: invalid choice"),
    (["tune", "--mnk", "64_64_64", "--worker-executor", "x"], "argument --worker-executor: invalid choice"),
    (["report", "--compare", "a.csv"], "argument --compare: expected 2 arguments"),
    (["lib"], "required: lib_cmd"),
    (["lib", "remove"], "invalid choice: 'remove'"),
    (["lib", "show", "64_64_64", "--dtype", "int8"], "argument --dtype: invalid choice"),
    (["worker"], "required: --scheduler"),
    (["worker", "--scheduler", "tcp://127.0.0.1:1", "--cpu", "--gpu-device-id", "1"], "not allowed with"),
    (["serve-reward", "--device", "tpu"], "argument --device: invalid choice"),
    (["serve-reward", "--port", "http"], "argument --port: invalid int value"),
])
def test_argparse_refusals(data, capsys, argv, needle):
    assert needle in _usage_error(argv, capsys)


# -- each subcommand's own flags ------------------------------------------------------------------------------
M = ["--mnk", "64_64_64"]
TUNE = ["tune", "--executor", "model", "--no-progress", *M, "--trials", "{tmp}/new.sqlite"]
FLAG_CASES = [
    # bench
    (["bench", *M, "--protocol", "warm"], ["--protocol takes a comma list of graph, cold, offline, server"]),
    (["bench", *M, "--protocol", ","], ["--protocol takes"]),
    (["bench", *M, "--mode", "graph"], ["--mode is CUDA-L2's flag", "use --protocol"]),
    (["bench", *M, "--triton-top", "-1"], ["--triton-top takes a count", ">= 0"]),
    (["bench", *M, "--repeat", "0"], ["--repeat must be >= 1, got 0"]),
    (["bench", *M, "--baselines", "cublas"], ["--baselines 'cublas': unknown cublas", "cublaslt_autotuned_nn"]),
    (["bench", *M, "--baselines", ","], ["--baselines ',': no path named"]),
    (["bench", *M, "--baselines", "torch", "--cuda-source", "{missing}"], ["--baselines does not apply to --cuda-source"]),
    (["bench", *M, "--target-qps", "0"], ["--target-qps must be > 0"]),
    (["bench", *M, "--target-qps", "nan"], ["--target-qps must be > 0, got nan"]),
    (["bench", *M, "--warmup-seconds", "-1"], ["--warmup-seconds must be >= 0"]),
    (["bench", *M, "--benchmark-seconds", "0"], ["--benchmark-seconds must be > 0"]),
    (["bench", *M, "--sandbox-timeout", "-5"], ["--sandbox-timeout must be > 0"]),
    (["bench", *M, "--kernel-dir", "{missing}"], ["--kernel-dir {missing}: not a directory of M_N_K.cu files"]),
    (["bench", *M, "--library", "{missing}"], ["--library: {missing}: no such library file"]),
    (["bench", *M, "--library", "{lib_checksum}"], ["--library:", "checksum", "gemmrl lib build"]),
    (["bench", *M, "--library", "{lib_truncated}"], ["--library:", "not a usable gemmrl library"]),
    (["bench", *M, "--triton-from", "{missing}"], ["--triton-from: no such file(s): {missing}"]),
    (["bench", *M, "--triton-from", "{foreign_csv}"], ["--triton-from:", "not a gemmrl results file"]),
    (["bench", *M, "--cutlass-from", "{results}"], ["--cutlass-from: no verified cutlass:* rows",
                                                    "gemmrl select --family cutlass"]),
    (["bench", *M, "--out", "{foreign_csv}"], ["--out {foreign_csv}: not a results CSV", "give a new --out"]),
    (["bench", *M, "--out", "{text}"], ["--out {text}: an existing file that is not a .csv"]),
    (["bench", *M, "--out", "{binary}"], ["not a .csv"]),
    # select
    (["select", *M, "--top", "-1"], ["--top must be >= 0"]),
    (["select", *M, "--explore", "-2"], ["--explore must be >= 0"]),
    (["select", *M, "--chunk", "-1"], ["--chunk must be >= 0"]),
    (["select", *M, "--top", "0", "--explore", "0"], ["top + explore >= 1"]),
    (["select", *M, "--workers", "0"], ["--workers must be >= 1"]),
    (["select", *M, "--layouts", "tt"], ["use tn, nn or both"]),
    (["select", *M, "--protocol", "offline"], ["graph and cold", "gemmrl bench --triton-from"]),
    (["select", *M, "--protocol", "warm"], ["--protocol takes"]),
    (["select", *M, "--out", "{foreign_csv}"], ["not a results CSV"]),
    (["select", *M, "--retrieve", "{missing}"], ["--retrieve {missing}: no such file", "gemmrl select output"]),
    (["select", *M, "--retrieve", "{tmp}/nothing*.csv"], ["--retrieve {tmp}/nothing*.csv: no such file"]),
    (["select", *M, "--retrieve", "{results}"], ["no verified Triton screen rows", "gemmrl select"]),
    (["select", *M, "--retrieve", "{foreign_csv}"], ["not a gemmrl results file"]),
    (["select", *M, "--retrieve", "{results}", "--retrieve-shapes", "0"], ["retrieve needs >= 1 shape"]),
    (["select", *M, "--family", "cutlass", "--retrieve", "{results}"], ["retrieve adds earlier Triton winners"]),
    # verify
    (["verify", *M, "--seeds", "0"], ["--seeds must be >= 1"]),
    (["verify", *M, "--kernel-dir", "{missing}"], ["--kernel-dir {missing}: not a directory"]),
    (["verify", *M, "--out", "{tmp}"], ["--out {tmp}: a directory"]),
    # report
    (["report"], ["give RESULTS.csv files"]),
    (["report", "{missing}"], ["no such file(s): {missing}", "gemmrl bench"]),
    (["report", "{foreign_csv}"], ["{foreign_csv}: not a gemmrl results file", "missing columns"]),
    (["report", "{binary}"], ["{binary}: not a gemmrl results file (not text)"]),
    (["report", "--compare", "{results}", "{missing}"], ["no such file(s): {missing}"]),
    # warmup
    (["warmup", *M, "--layouts", "xx"], ["--layouts takes tn and/or nn, got 'xx'"]),
    (["warmup", *M, "--layouts", ","], ["--layouts takes tn and/or nn"]),
    # tune
    ([*TUNE, "--group", "0"], ["--group must be >= 1, got 0"]),
    ([*TUNE, "--rounds", "-1"], ["--rounds must be >= 1"]),
    ([*TUNE, "--budget-gpu-minutes", "-1"], ["--budget-gpu-minutes must be > 0"]),
    ([*TUNE, "--budget-wall-minutes", "0"], ["--budget-wall-minutes must be > 0"]),
    ([*TUNE, "--budget-gpu-minutes", "nan"], ["--budget-gpu-minutes must be > 0, got nan"]),
    ([*TUNE, "--more-below", "0"], ["--more-below must be > 0, got 0.0"]),
    ([*TUNE, "--policy-lr", "-0.01"], ["--policy-lr must be >= 0", "proposes without learning"]),
    ([*TUNE, "--policy-lr", "nan"], ["--policy-lr must be >= 0", "got nan"]),
    ([*TUNE, "--timeout-s", "0"], ["--timeout-s must be > 0"]),
    ([*TUNE, "--protocol", "warm"], ["--protocol takes"]),
    ([*TUNE, "--layouts", "xx"], ["--layouts takes tn and/or nn"]),
    ([*TUNE, "--dtypes", "fp32"], ["--dtypes takes fp16 and/or bf16, got 'fp32'"]),
    ([*TUNE, "--dtypes", ","], ["--dtypes takes fp16 and/or bf16"]),
    ([*TUNE, "--baselines", "cublas"], ["--baselines takes a comma list of torch, cublas_tn"]),
    ([*TUNE, "--model", "llama-3-8b"], ["give one of --model, --mnk"]),
    (["tune", "--executor", "model", "--model", "gpt-5"], ["unknown model 'gpt-5'", "known:"]),
    ([*TUNE, "--gpu-model", "H100"], ["--gpu-model", "give --scheduler too"]),
    ([*TUNE, "--scheduler", "nowhere"], ["--scheduler nowhere"]),
    ([*TUNE[:-1], "{foreign_csv}"], ["--trials {foreign_csv}: cannot use it as the trials store",
                                     "the file is left as it is"]),
    ([*TUNE[:-1], "{tmp}"], ["--trials {tmp}: a directory"]),
    ([*TUNE, "--library-out", "{tmp}"], ["--library-out {tmp}: a directory"]),
    ([*TUNE, "--summary-out", "{tmp}"], ["--summary-out {tmp}: a directory"]),
    ([*TUNE, "--rows-out", "{tmp}"], ["--rows-out {tmp}: a directory"]),
    ([*TUNE, "--policy", "{tmp}"], ["--policy {tmp}: a directory"]),
    ([*TUNE, "--policy", "{text}"], ["cannot read policy file {text}"]),
    ([*TUNE, "--policy", "{list_json}"], ["policy file {list_json} is not a gemmrl policy"]),
    ([*TUNE, "--policy", "{binary}"], ["policy file {binary} is not a gemmrl policy"]),
    ([*TUNE, "--policy", "{lib}"], ["policy file {lib}", "another version of gemmrl"]),
    ([*TUNE, "--priors", "{missing}"], ["--priors: {missing}: no such library file"]),
    ([*TUNE, "--priors", "{lib_truncated}"], ["--priors:", "not a usable gemmrl library"]),
    ([*TUNE, "--priors", "package", "--priors-gpu", "NVIDIA H300"], ["--priors-gpu 'NVIDIA H300'", "it holds"]),
    # lib
    (["lib", "list", "--library", "{missing}"], ["{missing}: no such library file"]),
    (["lib", "list", "--library", "{tmp}"], ["{tmp} is not a usable gemmrl library"]),
    (["lib", "list", "--library", "{results}"], ["{results} is not a usable gemmrl library"]),
    (["lib", "show", "64_64", "--library", "{lib}"], ["cannot parse shape '64_64'"]),
    (["lib", "show", "0_64_64", "--library", "{lib}"], ["M must be >= 1"]),
    (["lib", "show", *M[1:], "--library", "{lib_schema2}"], ["schema 2", "gemmrl lib build"]),
    (["lib", "build", "{missing}", "--trials", "{tmp}/t2.sqlite"], ["{missing}", "No such file"]),
    (["lib", "build", "{foreign_csv}", "--trials", "{tmp}/t2.sqlite"], ["not a gemmrl results file"]),
    (["lib", "build", "{results}", "--out", "{tmp}"], ["{tmp} is a directory", "library.json"]),
    (["lib", "build", "{results}", "--trials", "{foreign_csv}"], ["cannot open the trials store", "--trials"]),
    (["lib", "build", "{binary}", "--trials", "{tmp}/t2.sqlite"], ["{binary}: not a gemmrl results file"]),
    (["lib", "export", "{tmp}", "--library", "{lib}"], ["{tmp} is a directory"]),
    (["lib", "export", "{tmp}/x.json", "--library", "{lib_truncated}"], ["not a usable gemmrl library"]),
    (["lib", "export", "{tmp}/x.json", "--library", "{lib}", "--gpu", "NVIDIA H300"],
     ["no entries for GPU 'NVIDIA H300'", "gemmrl lib list"]),
    (["lib", "export", "{tmp}/x.json", "--library", "{lib}", "--as-gpu", GPU_H100], ["already", GPU_H100]),
    # worker and serve-reward (refused before anything starts or connects)
    (["worker", "--scheduler", "10.0.0.5:8786"], ["give the scheduler's address, e.g. tcp://"]),
    (["worker", "--scheduler", "tcp://127.0.0.1:1", "--reconnect-s", "-1"], ["--reconnect-s must be >= 0"]),
    (["worker", "--scheduler", "tcp://127.0.0.1:1", "--gpu-device-id", "-1"], ["--gpu-device-id takes a GPU index"]),
    (["serve-reward", "--device", "cpu", "--port", "-1"], ["--port takes 0..65535"]),
    (["serve-reward", "--device", "cpu", "--port", "65536"], ["--port takes 0..65535", "got 65536"]),
    (["serve-reward", "--device", "cpu", "--max-request-kb", "0"], ["--max-request-kb and --time-limit-s"]),
    (["serve-reward", "--device", "cpu", "--time-limit-s", "-1"], ["must be positive"]),
    (["serve-reward", "--device", "cpu", "--host", "0.0.0.0"], ["refusing to serve on '0.0.0.0'", "--allow-remote"]),
    (["serve-reward", "--device", "cpu", "--protocol", "warm"], ["--protocol takes"]),
]


@pytest.mark.parametrize("argv, needles", FLAG_CASES, ids=[_id(c[0]) for c in FLAG_CASES])
def test_subcommand_flags(data, capsys, argv, needles):
    line = _usage_error(_fmt(argv, data), capsys)
    for n in needles:
        assert n.format(**data) in line, line


def test_serve_reward_port_in_use(data, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        line = _usage_error(["serve-reward", "--device", "cpu", "--no-sandbox", "--port", str(port)], capsys)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "pick another --port" in line


# -- nothing lost ---------------------------------------------------------------------------------------------
TUNE_ON = ["tune", "--executor", "model", "--no-progress", *M, "--trials", "{trials}", "--policy", "{policy}"]
KEEP_CASES = [
    (["bench", "--mnk", "64_64", "--out", "{results}"], "cannot parse shape"),
    (["bench", *M, "--protocol", "warm", "--out", "{results}"], "--protocol takes"),
    (["bench", *M, "--repeat", "0", "--out", "{results}"], "--repeat must be"),
    (["bench", *M, "--library", "{lib_checksum}", "--out", "{results}"], "checksum"),
    (["bench", *M, "--out", "{foreign_csv}"], "not a results CSV"),
    (["select", *M, "--workers", "0", "--out", "{results}"], "--workers must be"),
    (["verify", *M, "--seeds", "0", "--out", "{results}"], "--seeds must be"),
    ([*TUNE_ON, "--group", "0"], "--group must be"),
    ([*TUNE_ON, "--mnk", "64_64"], "cannot parse shape"),
    ([*TUNE_ON, "--library-out", "{tmp}"], "--library-out"),
    ([*TUNE_ON, "--trials", "{foreign_csv}"], "cannot use it as the trials store"),
    ([*TUNE_ON, "--policy", "{list_json}"], "not a gemmrl policy"),
    (TUNE_ON, "pass --resume to continue it"),  # the store holds this run: nothing is written without --resume
    ([*TUNE_ON, "--proposer", "both", "--run", "new"], "GEMMRL_LLM"),  # after the policy was read
    (["lib", "build", "{foreign_csv}", "--out", "{lib}", "--trials", "{trials}"], "not a gemmrl results file"),
    (["lib", "build", "{results}", "--out", "{lib_checksum}", "--trials", "{tmp}/t2.sqlite"], "checksum"),
    (["lib", "export", "{lib}", "--library", "{lib_truncated}"], "not a usable gemmrl library"),
    (["lib", "export", "{lib}", "--library", "{lib}", "--gpu", "NVIDIA H300"], "no entries for GPU"),
    (["lib", "import", "{lib_checksum}"], "checksum"),
]


@pytest.mark.parametrize("argv, needle", KEEP_CASES, ids=[_id(c[0]) for c in KEEP_CASES])
def test_refused_commands_leave_every_file_as_it_was(data, capsys, monkeypatch, argv, needle):
    for k in ("GEMMRL_LLM_BASE_URL", "GEMMRL_LLM_MODEL", "GEMMRL_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    roots, new_store = (data["tmp"], Path(data["user_lib"]).parent), str(Path(data["tmp"]) / "t2")
    before = _snapshot(*roots)
    assert needle in _usage_error(_fmt(argv, data), capsys)
    after = {k: v for k, v in _snapshot(*roots).items() if not k.startswith(new_store)}  # lib build's new trials store
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{argv} changed {changed}"


def test_resume_keeps_rows_whose_fields_hold_newlines(tmp_path):
    """A reason with a newline (a compiler's message) is one quoted CSV field over two lines: resuming must keep that
    row and every row after it (it used to cut the file there, losing all later finished rows)."""
    p = tmp_path / "r.csv"
    w = ResultsWriter(p)
    w.write_batch([_result_row("1_1_1", reason='error: line 1\nline 2 with "quotes"\r\nline 3')])
    w.write_batch([_result_row("2_2_2")])
    text = p.read_text()
    again = ResultsWriter(p)
    assert p.read_text() == text
    assert {k[0] for k in again.done} == {"1_1_1", "2_2_2"}
    assert [r["reason"] for r in read_rows([p])][0].startswith("error: line 1\nline 2")


def test_resume_drops_only_a_torn_last_row(tmp_path):
    p = tmp_path / "r.csv"
    ResultsWriter(p).write_batch([_result_row("1_1_1")])
    good = p.read_text()
    p.write_text(good + '2_2_2,fp16,fp32,tn,torch,offline,,1.0,,,,,true,"a torn\nwrite')  # killed mid-write
    assert {k[0] for k in ResultsWriter(p).done} == {"1_1_1"}
    assert p.read_text() == good


def test_resume_refuses_a_damaged_row_in_the_middle(tmp_path):
    p = tmp_path / "r.csv"
    w = ResultsWriter(p)
    w.write_batch([_result_row("1_1_1")])
    w.write_batch([_result_row("2_2_2")])
    lines = p.read_text().split("\n")
    damaged = "\n".join([lines[0], lines[1], "1_1_1,edited by hand", *lines[2:]])
    p.write_text(damaged)
    with pytest.raises(ResultsError, match=r"r\.csv:3: a row that does not parse .* write to a new --out"):
        ResultsWriter(p)
    assert p.read_text() == damaged  # no row after the damaged one was cut


def test_resume_refuses_a_foreign_file(tmp_path):
    p = tmp_path / "r.csv"
    p.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ResultsError, match="not a results CSV"):
        ResultsWriter(p)
    assert p.read_bytes() == b"\xff\xfe\x00 not text"


# -- library files: refused wherever they enter, never used blindly ------------------------------------------
BAD_LIBS = [("lib_truncated", "not a usable gemmrl library"), ("lib_checksum", "checksum does not match"),
            ("lib_schema2", "schema 2, this gemmrl reads schema 1"), ("results", "not a usable gemmrl library"),
            ("policy", "no \"format\": \"gemmrl-library\" header"), ("list_json", "header"),
            ("binary", "not a usable gemmrl library"), ("tmp", "not a usable gemmrl library"),
            ("missing", "no such library file"), ("lib_bad_gpu", "no path separators"),
            ("lib_bad_impl", "no path separators")]


@pytest.mark.parametrize("user_lib", [True, False], ids=["user-lib", "no-user-lib"])
@pytest.mark.parametrize("name, needle", BAD_LIBS, ids=[b[0] for b in BAD_LIBS])
def test_lib_import_refuses_and_keeps_the_user_library(data, capsys, name, needle, user_lib):
    up = Path(data["user_lib"])
    if not user_lib:
        up.unlink()
    before = _snapshot(up.parent)
    line = _usage_error(["lib", "import", data[name]], capsys)
    assert line.startswith("gemmrl lib import: error: ") and needle in line and data[name] in line
    assert _snapshot(up.parent) == before and up.exists() == user_lib


@pytest.mark.parametrize("name, needle", BAD_LIBS, ids=[b[0] for b in BAD_LIBS])
def test_use_library_refuses_and_keeps_serving_the_old_one(data, name, needle):
    a, w = torch.randn(4, 8).half(), torch.randn(3, 8).half()
    try:
        gemmrl.use_library(Library())
        ref = gemmrl.mm(a, w.t())
        for path in (data[name], Path(data[name])):  # a str or a Path
            with pytest.raises(LibraryError, match=needle) as ei:
                gemmrl.use_library(path)
            assert str(path) in str(ei.value)
            assert dispatch.library().entries == []  # still the one served before
            assert torch.equal(gemmrl.mm(a, w.t()), ref)
    finally:
        dispatch.use_library(Library())


def test_use_library_takes_a_path_and_refuses_other_types(data):
    try:
        assert len(gemmrl.use_library(Path(data["lib"])).entries) == 2  # a Path used to be kept as "the library"
        with pytest.raises(TypeError, match="a Library, a library JSON path or None; got int"):
            gemmrl.use_library(3)
        assert len(dispatch.library().entries) == 2
    finally:
        dispatch.use_library(Library())


@pytest.mark.parametrize("name", ["lib_truncated", "lib_checksum", "lib_schema2", "lib_bad_gpu"])
def test_a_broken_default_library_is_an_error_not_silence(data, monkeypatch, name):
    """GEMMRL_LIBRARY naming a broken library is refused at the first call, naming the file; a broken user library
    (implicit, in the cache) is not silence either: serving goes on without it, with one warning naming the file."""
    for how in ("env", "user"):
        if how == "env":
            monkeypatch.setenv("GEMMRL_LIBRARY", data[name])
        else:
            monkeypatch.delenv("GEMMRL_LIBRARY")
            shutil.copy(data[name], data["user_lib"])
        dispatch._S.library = None  # what a fresh process starts with
        a, b = torch.randn(4, 8).half(), torch.randn(8, 3).half()
        try:
            if how == "env":
                with pytest.raises(LibraryError, match="gemmrl lib build|gemmrl lib import") as ei:
                    gemmrl.mm(a, b)
                assert data[name] in str(ei.value)
            else:
                with pytest.warns(RuntimeWarning, match="gemmrl lib build|gemmrl lib import") as rec:
                    assert torch.equal(gemmrl.mm(a, b), torch.matmul(a, b))
                assert len(rec) == 1 and data["user_lib"] in str(rec[0].message)
        finally:
            dispatch.use_library(Library())


def test_another_gpus_library_is_imported_but_never_served_here(data, capsys):
    """An H100 library merged into the user library is kept (for that GPU), and on this device (the CPU tier's 'cpu')
    the same shapes are served by torch.matmul, not by the H100's entries."""
    other = Library([_entry(M=4, N=3, K=8), _entry(M=4, N=3, K=8, protocol="graph")]).save(Path(data["tmp"]) / "o.json")
    assert main(["lib", "import", str(other)]) == 0
    assert "2 entries" in capsys.readouterr().out
    assert {e.gpu for e in Library.load(data["user_lib"]).entries} == {GPU_H100}
    try:
        dispatch.use_library(None)  # the package's and the user's
        got = gemmrl.served_by(torch.randn(4, 8).half(), torch.randn(3, 8).half().t())
        assert got == {"eager": "torch.matmul", "graph": "torch.matmul"}
    finally:
        dispatch.use_library(Library())



@pytest.mark.parametrize("user_lib", [True, False], ids=["user-lib", "no-user-lib"])
def test_lib_import_refuses_a_gpu_that_does_not_exist(data, capsys, user_lib):
    """Entries for a GPU model gemmrl does not know (no datasheet peaks: nothing was measured there) are refused
    with one line naming the GPU, the file, the known models and what to do; the user library is byte-identical,
    and a file mixing them with good entries imports none of them."""
    up = Path(data["user_lib"])
    if not user_lib:
        up.unlink()
    fake = Library([_entry(gpu="NVIDIA Z9000"), _entry(M=8, gpu="NVIDIA Z9000")]).save(Path(data["tmp"]) / "z.json")
    mixed = Library([_entry(M=4), _entry(M=8, gpu="NVIDIA Z9000")]).save(Path(data["tmp"]) / "mixed.json")
    before = _snapshot(up.parent)
    for path, n in ((fake, 2), (mixed, 1)):
        line = _usage_error(["lib", "import", str(path)], capsys)
        assert line.startswith(f"gemmrl lib import: error: {path}: {n} entr") and "'NVIDIA Z9000'" in line, line
        assert "no GPU model gemmrl knows" in line and "H100 or H200" in line and "nothing was imported" in line
        assert "--as-gpu" in line and "gemmrl lib export" in line
        assert _snapshot(up.parent) == before and up.exists() == user_lib


def test_lib_import_takes_every_known_gpu_name(data, capsys):
    """The names torch gives the GPUs gemmrl knows are imported, the shipped libraries' included."""
    names = sorted({e.gpu for e in L.packaged().entries} | {GPU_H100, "NVIDIA H200", "NVIDIA H100 PCIe"})
    ok = Library([_entry(M=4 + i, gpu=g) for i, g in enumerate(names)]).save(Path(data["tmp"]) / "ok.json")
    assert main(["lib", "import", str(ok)]) == 0
    assert f"{len(names)} entries from {ok}" in capsys.readouterr().out
    assert {e.gpu for e in Library.load(data["user_lib"]).entries} >= set(names)

# -- gemmrl.mm / linear / warmup arguments ----------------------------------------------------------------------
@pytest.fixture
def hot(hot_path):
    """An empty library (torch.matmul serves), through each hot path in turn (conftest.hot_path)."""
    dispatch.use_library(Library())
    yield hot_path
    dispatch.use_library(Library())


def h(*shape, dtype=torch.float16, device="cpu"):
    return torch.randn(*shape).to(dtype=dtype, device=device)


MM_BAD = [  # (name, make -> (a, b, kw), match); the cases test_dispatch*.py do not have
    ("int8", lambda: (h(4, 8, dtype=torch.int8), h(8, 3, dtype=torch.int8), {}), "float16 and bfloat16.*Cast"),
    ("fp16 a, fp64 b", lambda: (h(4, 8), h(8, 3, dtype=torch.float64), {}), "float16 and bfloat16"),
    ("bf16 a, fp32 b", lambda: (h(4, 8, dtype=torch.bfloat16), h(8, 3, dtype=torch.float32), {}),
     "float16 and bfloat16"),
    ("0-d a", lambda: (torch.tensor(1.0, dtype=torch.float16), h(8, 3), {}), r"2-D or more.*got \(\)"),
    ("0-d b", lambda: (h(4, 8), torch.tensor(1.0, dtype=torch.float16), {}), r"b \[K, N\] \(2-D\)"),
    ("1-d b", lambda: (h(4, 8), h(8), {}), r"b \[K, N\] \(2-D\); got \(4, 8\) and \(8,\)"),
    ("K mismatch, tn", lambda: (h(4, 8), h(3, 9).t(), {}), "last dim"),
    ("empty M", lambda: (h(0, 8), h(8, 3), {}), "empty operand"),
    ("empty K", lambda: (h(4, 0), h(0, 3), {}), "empty operand"),
    ("a on meta", lambda: (h(4, 8, device="meta"), h(8, 3), {}), "move them to one device"),
    ("b on meta", lambda: (h(4, 8), h(8, 3, device="meta"), {}), "move them to one device"),
    ("a None", lambda: (None, h(8, 3), {}), "two torch.Tensors, got NoneType and Tensor"),
    ("b ndarray", lambda: (h(4, 8), h(8, 3).numpy(), {}), "two torch.Tensors, got Tensor and ndarray"),
    ("out a list", lambda: (h(4, 8), h(8, 3), {"out": [[0.0] * 3] * 4}), "out must be a torch.Tensor"),
    ("out without the batch dims", lambda: (h(2, 4, 8), h(8, 3), {"out": torch.zeros(8, 3, dtype=torch.float16)}),
     r"out must be .* shape \(2, 4, 3\)"),
]


# these bad calls share their signature with a good call (b's dtype or out is the fault): also from the hot path
ON_HOT_PATH = {"fp16 a, fp64 b", "bf16 a, fp32 b", "out a list", "out without the batch dims"}
MM_PARAMS = [pytest.param(*m, seen, id=f"{m[0]}-{'hot-path' if seen else 'first-call'}")
             for m in MM_BAD for seen in (False, True) if not seen or m[0] in ON_HOT_PATH]


@pytest.mark.parametrize("name, make, match, seen", MM_PARAMS)
def test_mm_bad_arguments(hot, name, make, match, seen):
    a, b, kw = make()
    if seen:  # the good call of this signature first, so that the bad one starts on the hot path
        gemmrl.mm(a, b.to(a.dtype))
        assert gemmrl.served_by(a, b.to(a.dtype))["eager"] == "torch.matmul"
    out = kw.get("out")
    keep = out.clone() if isinstance(out, torch.Tensor) else None
    with pytest.raises(dispatch.DispatchError, match=match):
        gemmrl.mm(a, b, **kw)
    if keep is not None:
        assert torch.equal(out, keep)  # a refused out is not written


@pytest.mark.parametrize("seen", [False, True], ids=["first-call", "hot-path"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_mm_out_that_is_an_input_is_refused(hot, which, seen):
    a, b = h(8, 8), h(8, 8)
    if seen:
        gemmrl.mm(a, b, out=torch.empty(8, 8, dtype=torch.float16))
    keep = (a.clone(), b.clone())
    with pytest.raises(dispatch.DispatchError, match=f"out is {which} itself"):
        gemmrl.mm(a, b, out=a if which == "a" else b)
    assert torch.equal(a, keep[0]) and torch.equal(b, keep[1])  # the inputs are not overwritten


def test_mm_out_a_disjoint_view_of_the_same_buffer_is_fine(hot):
    buf = torch.randn(3, 8, 8).half()
    a, b, out = buf[0], buf[1], buf[2]
    want = a.float() @ b.float()
    for _ in range(2):
        y = gemmrl.mm(a, b, out=out)
        assert y is out and (y.float() - want).abs().max().item() <= 4 * 2 ** -10 * 8 ** 0.5 * want.abs().max().item()


@pytest.mark.parametrize("make, match", [
    (lambda: (h(4, 8), [[1.0] * 8] * 3), "torch.Tensor weight"),
    (lambda: (h(4, 8), None), "torch.Tensor weight"),
    (lambda: (h(4, 8), h(3, 8, dtype=torch.float32)), "float16 and bfloat16"),
    (lambda: (h(4, 8, dtype=torch.int8), h(3, 8, dtype=torch.int8)), "float16 and bfloat16"),
    (lambda: (h(4, 8), h(3, 7)), "last dim"),
    (lambda: (h(4, 8), h(8)), r"b \[K, N\] \(2-D\)"),
    (lambda: ([[1.0] * 8], h(3, 8)), "two torch.Tensors"),
])
def test_linear_bad_arguments(hot, make, match):
    x, w = make()
    with pytest.raises(dispatch.DispatchError, match=match):
        gemmrl.linear(x, w)


@pytest.mark.parametrize("kw, err, match", [
    (dict(shapes=["64_64"]), ProblemError, "cannot parse shape '64_64'"),
    (dict(shapes=["0_64_64"]), ProblemError, "M must be >= 1"),
    (dict(shapes=[(64, 64)]), dispatch.DispatchError, r"'M_N_K', \(M, N, K\) or GemmProblem; got \(64, 64\)"),
    (dict(shapes=[None]), dispatch.DispatchError, "got None"),
    (dict(shapes=[(0, 4, 4)]), dispatch.DispatchError, "empty operand"),
    (dict(shapes=["4_4_4"], dtype=torch.float32), dispatch.DispatchError, "use torch.float16 or torch.bfloat16"),
    (dict(shapes=["4_4_4"], layouts=("tt",)), dispatch.DispatchError, "layout 'tt'; use 'nn' or 'tn'"),
])
def test_warmup_bad_arguments(hot, kw, err, match):
    with pytest.raises(err, match=match):
        gemmrl.warmup(**kw)


def test_results_columns_are_what_the_out_check_compares(tmp_path):
    """bench/select --out refuse a CSV whose header is not COLUMNS; a file this version wrote must pass that check."""
    from gemmrl.cli.common import CliError, check_out

    p = tmp_path / "r.csv"
    ResultsWriter(p).write_batch([_result_row()])
    check_out(p)  # no error: resumable
    p.write_text(",".join(COLUMNS[:-1]) + "\n")
    with pytest.raises(CliError, match="not a results CSV"):
        check_out(p)


def test_tune_model_part_refuses_more_parts_than_shapes(capsys, tmp_path):
    line = _usage_error(["tune", "--model", "llama-3-8b", "--part", "1/31", "--executor", "model", "--no-progress",
                         "--trials", str(tmp_path / "t.sqlite")], capsys)
    assert "--part 1/31: 30 shape(s) cannot make 31 parts; give N <= 30" in line
