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
store keys outcomes by (GPU model, shape, candidate) and ignores repeats. A scheduler that goes away ends the run
with an error; everything stored stays, and ``--resume`` continues.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import uuid
from concurrent.futures import Future
from typing import Any, Sequence

from ..evaluate import CandidateSpec
from ..problem import GemmProblem
from .executor import GroupResult, RequestTemplate

KINDS = ("sandbox", "inline", "model")
_LOCAL: dict = {}
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
def _local_executor(kind: str, template: RequestTemplate, timeout_s: float):
    key = (kind, template, timeout_s)
    with _LOCK:
        if key not in _LOCAL:
            from .executor import InlineExecutor, ModelExecutor, PrebuildExecutor, SandboxExecutor

            if kind == "model":
                _LOCAL[key] = ModelExecutor(seed=template.seed)
            elif kind == "inline":
                _LOCAL[key] = InlineExecutor(template)
            else:
                cpu = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
                _LOCAL[key] = PrebuildExecutor(SandboxExecutor(
                    template=template, timeout_s=timeout_s, gpus=() if cpu else (0,),
                    env={"TRITON_INTERPRET": "1"} if cpu else None))
        return _LOCAL[key]


def run_group(problem: GemmProblem, specs: list[CandidateSpec], kind: str, template: RequestTemplate,
              timeout_s: float) -> dict:
    """The Dask task: one group in this worker's executor. Plain data back."""
    res = _local_executor(kind, template, timeout_s).submit(problem, specs).result()
    return {"evaluations": list(res.evaluations), "rows": list(res.rows), "gpu_s": res.gpu_s,
            "worker": f"{socket.gethostname()}:{os.getpid()} {res.worker}", "isolation": res.isolation,
            "gpu": os.environ.get("GEMMRL_WORKER_GPU", "")}


# -- client side ----------------------------------------------------------------------------------------------
class DaskExecutor:
    """Groups as Dask tasks on the workers of one GPU model (``gpu_model``; default the only model present)."""

    def __init__(self, scheduler: str | None = None, kind: str = "sandbox", template: RequestTemplate = RequestTemplate(),
                 timeout_s: float = 600.0, gpu_model: str | None = None, client: Any = None, connect_s: float = 30.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        from distributed import Client

        self.client = client if client is not None else Client(scheduler, timeout=f"{connect_s}s")
        self._own_client = client is None
        self.kind, self.template, self.timeout_s = kind, template, timeout_s
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
        df = self.client.submit(run_group, problem, list(specs), self.kind, self.template, self.timeout_s,
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
                out.set_exception(e)
                return
            out.set_result(GroupResult(problem, tuple(v["evaluations"]), tuple(v["rows"]), v["gpu_s"], v["worker"],
                                       v["isolation"]))

        df.add_done_callback(done)
        return out

    def close(self) -> None:
        if self._own_client:
            self.client.close()
