"""The tuning loop across GPUs and hosts on Dask distributed: the second ``Executor`` beside the local pool.

Topology: one Dask scheduler (``dask scheduler``), one Dask worker per GPU (``gemmrl worker --gpu-device-id N
--scheduler tcp://HOST:PORT``: a plain process, no nanny, ``CUDA_VISIBLE_DEVICES=N``, one thread), and the tuner
(``gemmrl tune --scheduler tcp://HOST:PORT``), which holds the proposers, the trials store and the library. Each
worker advertises the resources ``GPU: 1`` and ``MODEL-<its GPU model>: 1``; a group (one shape's proposals) is a
task that asks for one unit of its GPU model's resource, so it runs on a worker with that model only, one group per
GPU at a time, and its results land under that model in the trials store (never in another model's library). In
the worker the group runs in that process's own sandbox pool (``SandboxExecutor`` + prebuild: compiled, verified,
timed beside the vendor paths in a sandboxed child process), exactly as on one machine; the rows carry the worker's
GPU, clocks, driver and software versions.

Failures: a worker that dies (killed, host lost) takes only its in-flight group with it; the scheduler re-runs it
elsewhere (Dask's ``allowed-failures``). A retried group whose first run did report is stored once: the trials
store keys outcomes by (GPU model, shape, candidate) and ignores repeats. A scheduler that goes away
or restarts: the client reconnects by itself, ``gemmrl worker`` reconnects too (keeping its warm sandbox), and
the groups that were in flight are submitted again; if none comes back in time the run ends with an error,
everything stored stays, and ``--resume`` continues.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Sequence

from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from ..sandbox import Job, SandboxPool
from ..timing import TimingConfig
from .executor import GroupResult, InlineExecutor, ModelExecutor, PrebuildExecutor, RequestTemplate, SandboxExecutor

KINDS = ("sandbox", "inline", "model")
_LOCAL: dict = {}
_POOLS: dict = {}
_LOCK = threading.Lock()


def model_resource(gpu_name: str) -> str:
    """The Dask resource name of a GPU model: ``MODEL-NVIDIA_H100_80GB_HBM3``."""
    return "MODEL-" + (re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_") or "unknown")


def gpu_name(device: int | None = None) -> str:
    """The name of GPU ``device`` (an index into what the machine has), from nvidia-smi, without creating a CUDA
    context in this process; ``cpu`` where there is none."""
    if device is None:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        if vis == "":
            return "cpu"
        device = int(vis.split(",")[0]) if vis and vis.split(",")[0].strip().isdigit() else 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", str(device)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    name = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return name or "cpu"


# -- worker side ----------------------------------------------------------------------------------------------
TRITON_CACHE_ENV = "GEMMRL_WORKER_TRITON_CACHE"   # set by `gemmrl worker`: this host's shared Triton cache


def _pool(shared_triton: bool):
    """This worker's sandbox pool: one per cache mode, made once and kept for the worker's life (a warm CUDA context,
    torch, the vendor libraries and Triton's compiler stay loaded between groups and tuning jobs). ``shared_triton``:
    the pool's Triton cache is the host's shared one (``gemmrl worker --triton-cache``), which only groups whose
    candidates are all our own configs may use; otherwise each sandbox process has a private one."""
    with _LOCK:
        if shared_triton not in _POOLS:
            cpu = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
            env = {"TRITON_INTERPRET": "1"} if cpu else {}
            writable = []
            cache = os.environ.get(TRITON_CACHE_ENV, "")
            if shared_triton and cache:
                os.makedirs(cache, exist_ok=True)
                env["TRITON_CACHE_DIR"] = cache
                writable.append(cache)
            _POOLS[shared_triton] = SandboxPool(gpus=() if cpu else (0,), env=env or None, writable=writable)
        return _POOLS[shared_triton]


def _local_executor(kind: str, template: RequestTemplate, timeout_s: float, shared_triton: bool = False):
    key = (kind, template, timeout_s, shared_triton)
    with _LOCK:
        known = _LOCAL.get(key)
    if known is not None:
        return known

    if kind == "model":
        ex = ModelExecutor(seed=template.seed)
    elif kind == "inline":
        ex = InlineExecutor(template)
    else:
        ex = PrebuildExecutor(SandboxExecutor(pool=_pool(shared_triton), template=template, timeout_s=timeout_s))
    with _LOCK:
        return _LOCAL.setdefault(key, ex)


def warm_worker(shared_triton: bool = True, timeout_s: float = 300.0) -> dict:
    """Start this worker's sandbox pool and run one small group through it (torch, the CUDA context, cuBLAS and
    cuBLASLt through our extension, Triton's compiler, the battery, graph capture and both timers), so that the
    worker's one-time start-up is paid when it starts, not inside the first tuning job it serves. Returns what the
    group reported (``status``, ``seconds``)."""
    cpu = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    problem = GemmProblem(128, 128, 128, layout="tn" if not cpu else "nn")
    spec = CandidateSpec("triton", "tiled(BM=64,BN=64,BK=32,warps=4,stages=2,group_m=1)", layout=problem.layout)
    quick = TimingConfig(warmup_s=0.0, benchmark_s=0.02)
    template = (RequestTemplate(protocols=("offline",), baselines=(), graph_check=False, device="cpu", timing=quick)
                if cpu else RequestTemplate(baselines=("cublas_tn", "cublaslt_heuristic_tn"), timing=quick))
    t0 = time.monotonic()
    res = _pool(shared_triton).submit(Job("warm", "gemmrl.measure.evaluate:evaluate_group_job",
                                          template.request(problem, [spec]), timeout_s)).result()
    ev = (res.value or {}).get("evaluations", [{}])[0] if res.status == "ok" else {}
    return {"status": res.status if res.status != "ok" else (ev.get("failure") or "ok"),
            "error": res.error or ev.get("reason", ""), "seconds": round(time.monotonic() - t0, 2)}


def run_group(problem: GemmProblem, specs: list[CandidateSpec], kind: str, template: RequestTemplate,
              timeout_s: float, shared_triton: bool = False) -> dict:
    """The Dask task: one group in this worker's executor. Plain data back."""
    res = _local_executor(kind, template, timeout_s, shared_triton).submit(problem, specs).result()
    return {"evaluations": list(res.evaluations), "rows": list(res.rows), "gpu_s": res.gpu_s,
            "worker": f"{socket.gethostname()}:{os.getpid()} {res.worker}", "isolation": res.isolation,
            "gpu": os.environ.get("GEMMRL_WORKER_GPU", "")}


# -- client side ----------------------------------------------------------------------------------------------
def scheduler_lost(e: BaseException) -> bool:
    """Whether a task's error means the client lost its scheduler (the task's result is unknown, not failed)."""
    text = f"{type(e).__name__}: {e}"
    return "scheduler-connection-lost" in text or "lost the connection to the scheduler" in text


class DaskExecutor:
    """Groups as Dask tasks on the workers of one GPU model (``gpu_model``; default the only model present).

    ``shared_triton``: the workers compile into their host's shared Triton cache (only when every candidate is one
    of our own configs). A group whose scheduler went away (restarted, say) is submitted again once the client has
    reconnected and a worker of the model is back, for up to ``reconnect_s``; then the run ends with an error, and
    what is stored stays."""

    def __init__(self, scheduler: str | None = None, kind: str = "sandbox", template: RequestTemplate = RequestTemplate(),
                 timeout_s: float = 600.0, gpu_model: str | None = None, client: Any = None, connect_s: float = 30.0,
                 shared_triton: bool = False, reconnect_s: float = 300.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        from distributed import Client  # optional dependency (the distributed extra)

        self.scheduler = scheduler
        self.client = client if client is not None else Client(scheduler, timeout=f"{connect_s}s")
        self._own_client = client is None
        self.kind, self.template, self.timeout_s = kind, template, timeout_s
        self.shared_triton, self.reconnect_s = shared_triton, reconnect_s
        self.resubmitted = 0   # groups submitted again after the scheduler went away
        models = self.models()
        if not models:
            raise RuntimeError(f"no gemmrl worker is connected to {scheduler}; start one per GPU with "
                               f"gemmrl worker --gpu-device-id N --scheduler {scheduler}")
        if gpu_model is None:
            if len(models) > 1:
                raise ValueError(f"workers of several GPU models are connected ({', '.join(models)}): tune one at a "
                                 "time with --gpu-model NAME")
            gpu_model = next(iter(models))
        if gpu_model not in models:
            raise ValueError(f"no worker with GPU model {gpu_model!r}; connected: {', '.join(models)}")
        self.gpu_model = gpu_model
        self.resource = model_resource(gpu_model)
        self.slots = models[gpu_model]
        self._pending: set = set()
        self._lock = threading.Lock()

    def models(self) -> dict[str, int]:
        """GPU model name -> workers, over the connected workers (their name is ``<model>|<host>|<gpu>``)."""
        out: dict[str, int] = {}
        for w in self.client.scheduler_info(n_workers=-1)["workers"].values():
            name = str(w.get("name", ""))
            if "|" in name and any(r.startswith("MODEL-") for r in (w.get("resources") or {})):
                model = name.split("|", 1)[0]
                out[model] = out.get(model, 0) + 1
        return out

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        out: Future = Future()
        self._submit(problem, list(specs), out)
        return out

    def _submit(self, problem: GemmProblem, specs: list[CandidateSpec], out: Future) -> None:
        df = self.client.submit(run_group, problem, specs, self.kind, self.template, self.timeout_s, self.shared_triton,
                                resources={self.resource: 1}, pure=False,
                                key=f"gemmrl-group-{problem.mnk}-{uuid.uuid4().hex[:12]}")
        with self._lock:
            self._pending.add(df)   # a Dask future without a reference is released (and its task cancelled)

        def done(d) -> None:
            with self._lock:
                self._pending.discard(d)
            try:
                v = d.result()
            except BaseException as e:  # noqa: BLE001 - the tuner sees it
                if scheduler_lost(e):
                    threading.Thread(target=self._resubmit, args=(problem, specs, out), daemon=True).start()
                else:
                    out.set_exception(e)
                return
            out.set_result(GroupResult(problem, tuple(v["evaluations"]), tuple(v["rows"]), v["gpu_s"], v["worker"],
                                       v["isolation"]))

        df.add_done_callback(done)

    def _resubmit(self, problem: GemmProblem, specs: list[CandidateSpec], out: Future) -> None:
        deadline = time.monotonic() + self.reconnect_s
        while time.monotonic() < deadline:
            try:
                if self.client.status == "running" and self.models().get(self.gpu_model, 0) > 0:
                    with self._lock:
                        self.resubmitted += 1
                    self._submit(problem, specs, out)
                    return
            except Exception:  # noqa: BLE001 - still reconnecting
                pass
            time.sleep(1.0)
        out.set_exception(RuntimeError(
            f"lost the Dask scheduler {self.scheduler or ''} and no {self.gpu_model} worker came back within "
            f"{self.reconnect_s:.0f} s; every result stored so far stays: start the scheduler and workers, then run "
            "the same gemmrl tune again with --resume"))

    def close(self) -> None:
        if self._own_client:
            self.client.close()
