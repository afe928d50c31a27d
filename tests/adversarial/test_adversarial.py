"""The adversarial suite: every planted cheat and fault in ``gemmrl.adversarial.catalogue.ATTACKS`` evaluated the way a
proposal is (``evaluate_job`` in a sandboxed worker) must come back with its own verdict and reason, and the pool
must go on. CPU tier: the Triton-source attacks under the interpreter plus CPU stand-ins for the device faults; on a
GPU (``-m gpu`` or any run where CUDA is visible) the same Triton sources compiled, plus the CUDA-only attacks (side
stream, C++ thread, GPU hang, illegal address, cudaMalloc beyond the device).

``GEMMRL_ADVERSARIAL_CSV=FILE`` writes one row per attack (the README's table is made from these files by
``benchmarks/acceptance/adversarial_table.py``).
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from gemmrl.adversarial import catalogue as adv
from gemmrl.problem import GemmProblem

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


class _Listener:
    """A loopback TCP listener the test owns; counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self._stop = True
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory):
    from gemmrl.results import collect_meta, git_sha, now
    from gemmrl.sandbox import SandboxPool

    root = tmp_path_factory.mktemp("adversarial")
    target = root / "outside" / "owned-by-the-test.txt"
    target.parent.mkdir()
    listener = _Listener()
    if HAS_CUDA:  # the parent builds what the workers load: workers cannot write the build cache
        from gemmrl.kernels.cuda_source import build_many
        from gemmrl.kernels.vendor import build_library

        build_library()
        build_many([adv.spec(a).payload for a in adv.attacks(DEVICE) if a.cuda])
    try:  # the workers read the parent's build cache (vendor library, planted CUDA); they cannot write it
        with SandboxPool(n_workers=1, scratch_root=root / "scratch") as pool:
            rows = adv.run_catalogue(DEVICE, pool, {"target": str(target), "port": listener.port})
    finally:
        listener.close()
    meta = {"gpu": collect_meta(0).gpu if HAS_CUDA else "cpu (Triton interpreter)", "git_sha": git_sha(),
            "timestamp": now()}
    rows = [{**r, **meta} for r in rows]
    out = os.environ.get("GEMMRL_ADVERSARIAL_CSV")
    if out:
        adv.write_csv(rows, out)
    return {"rows": {r["attack"]: r for r in rows}, "target": target, "accepted": listener.accepted}


def _isolated(row) -> bool:
    return row["isolation"] == "isolated"


@pytest.mark.parametrize("name", [a.name for a in adv.attacks(DEVICE)])
def test_attack_gets_its_verdict(catalogue, name):
    row = catalogue["rows"][name]
    if name in ("writes files outside its scratch directory", "connects to a loopback listener") and not _isolated(row):
        pytest.skip(f"the sandbox cannot enforce isolation here: {row['isolation']}")
    assert row["verdict"] == row["expect"] and row["check"] in row["expect_check"].split("|"), row
    if row["verdict"] == "rejected":
        assert row["reason"].startswith(f"{row['check']}:") or row["check"] == "crash", row["reason"]


def test_the_sandbox_kept_what_it_guards(catalogue):
    rows = catalogue["rows"]
    write = rows["writes files outside its scratch directory"]
    if not _isolated(write):
        pytest.skip(f"the sandbox cannot enforce isolation here: {write['isolation']}")
    assert not catalogue["target"].exists(), "a candidate wrote outside its scratch directory"
    assert "Permission" in write["reason"] or "denied" in write["reason"].lower(), write["reason"]
    assert catalogue["accepted"] == 0, "a candidate reached the test's loopback listener"


def test_no_reference_is_reachable_during_the_call(catalogue):
    row = catalogue["rows"]["reads the reference output"]
    assert "adversarial: reference found: False" in row["output"], row["output"]
    assert "adversarial: reference found: True" not in row["output"]


def test_cuda_l2_check_is_blind_where_ours_is_not(catalogue):
    rows = catalogue["rows"]
    assert rows["control: a correct kernel"]["cuda_l2"] == "passes"
    # CUDA-L2's check passes these (0/1 data: every partial sum exact; C zero-filled), ours rejects them
    for name in ("accumulates in fp16", "only works on 0/1 inputs", "relies on C being zeroed"):
        assert rows[name]["cuda_l2"] == "passes", rows[name]
        assert rows[name]["verdict"] == "rejected"


def test_the_control_earned_a_result(catalogue):
    row = catalogue["rows"]["control: a correct kernel"]
    assert row["verdict"] == "ok" and row["reason"] == "", row


def test_markdown_table_lists_every_attack(catalogue, tmp_path):
    rows = list(catalogue["rows"].values())
    path = adv.write_csv(rows, tmp_path / "adv.csv")
    back = adv.read_csv(path)
    table = adv.markdown_table({"here": back})
    for a in adv.attacks(DEVICE):
        assert f"| {a.name} |" in table
    assert "(unexpected)" not in table or any(str(r["as_expected"]) != "True" for r in back)
    with pytest.raises(ValueError, match="not an adversarial-suite CSV"):
        (tmp_path / "bad.csv").write_text("mnk,candidate\n1_1_1,x\n")
        adv.read_csv(tmp_path / "bad.csv")


MEMOS = ("caches its first result", "replays by row 0", "replays by a sampled checksum", "replays after 3 calls",
         "keeps 4 outputs", "recomputes only changed rows", "replays under capture", "replays after 50 calls")


def test_the_catalogue_holds_the_memoizing_class():
    by = {a.name: a for a in adv.ATTACKS}
    assert all(a.how for a in adv.ATTACKS)
    for name in MEMOS:
        a = by[name]
        assert a.expect == "rejected" and a.entry, a
        checks = a.check.split("|")
        if a.tier == "cpu":  # the battery names it in both tiers (the interpreter's offline protocol times no graph)
            assert "memo" in checks or name == "caches its first result", a
        else:  # only the GPU tier's timed calls (or the capture check) see it
            assert a.tier == "gpu" and "timed_output" in checks, a


# ---- the battery's per-call checks, on plain callables (no sandbox needed) -----------------------------------
def _dev():
    return "cuda" if HAS_CUDA else "cpu"


def _right(a, b, bt, c):
    torch.matmul(a, b, out=c)


def test_repointing_c_is_an_alias_failure():
    from gemmrl.verify import verify

    def repoint(a, b, bt, c):
        c.set_(torch.matmul(a, b))

    v = verify(repoint, GemmProblem(17, 24, 40), _dev(), seeds=[1])
    assert not v.passed and v.failed_check == "alias", v.reason


def test_printing_is_fine_but_timing_claims_are_not(capfd):
    from gemmrl.verify import verify

    def chatty(a, b, bt, c):
        _right(a, b, bt, c)
        print("hello from a kernel")

    def liar(a, b, bt, c):
        _right(a, b, bt, c)
        os.write(1, b"kernel time 0.002 ms\n")

    p = GemmProblem(9, 16, 32)
    assert verify(chatty, p, _dev(), seeds=[2]).passed
    assert "hello from a kernel" in capfd.readouterr().out  # captured, then passed on
    v = verify(liar, p, _dev(), seeds=[2])
    assert not v.passed and v.failed_check == "output" and "0.002 ms" in v.reason, v.reason


def test_probe_shapes_stay_inside_the_declaration():
    from gemmrl.kernels.cuda_source import ShapeRange

    for text, shape in (("any", (33, 65, 129)), ("M=1..64,N%8,K%8", (16, 64, 128)), ("M=16..16", (16, 32, 32)),
                        ("any", (1, 1, 1))):
        r = ShapeRange.parse(text)
        got = r.probes(*shape)
        assert got and all(r.admits(*s) and s != shape for s in got), (text, got)
    assert ShapeRange.parse("64_4096_64,128_4096_64").probes(64, 4096, 64) == [(128, 4096, 64)]
    assert ShapeRange.parse("64_4096_64").probes(64, 4096, 64) == []
