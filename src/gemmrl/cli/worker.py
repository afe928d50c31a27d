"""`gemmrl worker`: one Dask worker that owns one GPU (or none, ``--cpu``) and runs the tuning loop's groups.

    dask scheduler --port 8786                                          # once, on any host
    gemmrl worker --gpu-device-id 0 --scheduler tcp://HOST:8786         # once per GPU, on every GPU host
    gemmrl tune --scheduler tcp://HOST:8786 --grid cuda-l2 --proposer rl   # anywhere that reaches the scheduler

The worker is a plain process (no nanny, so nothing daemonic stands between it and the sandbox's child
processes; ``distributed.worker.daemon`` is off as well), with ``CUDA_VISIBLE_DEVICES`` set to its GPU before
anything touches CUDA, one thread, and the resources ``GPU: 1`` and ``MODEL-<GPU model>: 1``. Its Dask name is
``<GPU model>|<host>|<device>``, which is how the tuner tells GPU models apart. Ctrl-C or SIGTERM stops it.

Before joining, the worker starts its sandbox and runs one small group through it (``--no-warmup`` skips that), so
its one-time start-up (torch, the CUDA context, the vendor libraries, Triton's compiler) is not paid inside a tuning
job. Groups of our own configs compile into a Triton cache shared by the host's workers (``--triton-cache``). If the
scheduler goes away the worker keeps its sandbox and rejoins when the scheduler is back (``--reconnect-s``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

from ..kernels.vendor import prebuild_for
from ..paths import cache_dir
from .common import CliError


def add_parser(sub) -> None:
    w = sub.add_parser("worker", help="a Dask worker that owns one GPU and runs tuning groups (gemmrl tune --scheduler)")
    w.add_argument("--scheduler", required=True, help="the Dask scheduler, tcp://HOST:PORT")
    g = w.add_mutually_exclusive_group()
    g.add_argument("--gpu-device-id", type=int, default=0, help="the GPU this worker owns (default 0)")
    g.add_argument("--cpu", action="store_true", help="own no GPU (Triton interpreter or the cost model: tests, dry runs)")
    w.add_argument("--host", default=None, help="address to listen on (default: what reaches the scheduler)")
    w.add_argument("--name", default=None, help="Dask worker name (default <GPU model>|<host>|<device>)")
    w.add_argument("--triton-cache", default=None,
                   help="the Triton kernel cache this host's workers share for groups of our own configs "
                        "(default: gemmrl's cache dir/triton-shared); LLM-written code never gets it")
    w.add_argument("--no-warmup", action="store_true",
                   help="join the scheduler at once instead of first starting the sandbox and running one small group")
    w.add_argument("--connect-s", type=float, default=60.0,
                   help="seconds to reach the scheduler the first time before giving up (default 60)")
    w.add_argument("--reconnect-s", type=float, default=600.0,
                   help="after losing the scheduler, keep trying to rejoin it this long (keeping the warm sandbox)")
    w.set_defaults(func=cmd_worker)


def cmd_worker(args) -> int:
    from ..search.dask_executor import gpu_name, model_resource  # start-up cost: the Dask executor

    if not str(args.scheduler).startswith(("tcp://", "tls://", "inproc://")):
        raise CliError(f"--scheduler {args.scheduler!r}: give the scheduler's address, e.g. tcp://10.0.0.5:8786")
    if not args.connect_s > 0:
        raise CliError(f"--connect-s must be > 0 seconds, got {args.connect_s}")
    if not args.reconnect_s >= 0:
        raise CliError(f"--reconnect-s must be >= 0 seconds (0: do not rejoin), got {args.reconnect_s}")
    if not args.cpu and args.gpu_device_id < 0:
        raise CliError(f"--gpu-device-id takes a GPU index >= 0 (as nvidia-smi lists them), got {args.gpu_device_id}")
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        model, dev = "cpu", "cpu"
    else:
        model = gpu_name(args.gpu_device_id)
        if model == "cpu":
            raise CliError(f"no GPU {args.gpu_device_id} here (nvidia-smi does not list it); --cpu runs a CPU worker")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu_device_id)
        dev = str(args.gpu_device_id)
    os.environ["GEMMRL_WORKER_GPU"] = model
    from ..search.dask_executor import TRITON_CACHE_ENV, warm_worker  # start-up cost: the Dask executor

    os.environ[TRITON_CACHE_ENV] = str(Path(args.triton_cache).resolve() if args.triton_cache
                                       else cache_dir("triton-shared"))
    name = args.name or f"{model}|{socket.gethostname()}|{dev}"
    if not args.cpu:   # the sandbox cannot write the build cache: vendor_blas.so is built here, before it starts
        why = prebuild_for(None)
        if why:
            print(f"gemmrl worker {name}: the cuBLAS baselines cannot be built here ({why}); groups will fail on them",
                  flush=True)
    if not args.no_warmup:
        w = warm_worker()
        print(f"gemmrl worker {name}: sandbox warm in {w['seconds']} s ({w['status']}{': ' + w['error'][:200] if w['error'] else ''})",
              flush=True)
    import dask  # optional dependency: gemmrl[distributed]

    dask.config.set({"distributed.worker.daemon": False})
    resources = {"GPU": 1, model_resource(model): 1}
    deadline, joined = time.monotonic() + args.reconnect_s, False
    while True:
        try:
            outcome = asyncio.run(_serve(args.scheduler, name, resources, args.host,
                                         args.connect_s if not joined else args.reconnect_s))
            joined = True
        except (OSError, TimeoutError) as e:
            if not joined or time.monotonic() > deadline:
                raise CliError(f"cannot reach the scheduler at {args.scheduler}: {e}") from None
            time.sleep(2.0)
            continue
        if outcome == "stopped":
            return 0
        print(f"gemmrl worker {name}: lost the scheduler; rejoining for up to {args.reconnect_s:.0f} s", flush=True)
        deadline = time.monotonic() + args.reconnect_s


async def _serve(scheduler: str, name: str, resources: dict, host: str | None, connect_s: float) -> str:
    """Serve until SIGINT/SIGTERM ("stopped") or until the worker closes, as Dask workers do when they lose the
    scheduler ("lost"). TimeoutError when the scheduler does not answer within ``connect_s`` (a Dask worker would
    wait for it forever)."""
    from distributed import Worker  # optional dependency: gemmrl[distributed]

    loop = asyncio.get_running_loop()
    w = Worker(scheduler, nthreads=1, name=name, resources=resources, host=host, validate=False)
    try:
        await asyncio.wait_for(w.start(), connect_s)
    except asyncio.TimeoutError:
        await w.close(timeout=5)
        raise TimeoutError(f"no answer in {connect_s:.0f} s (--connect-s)") from None
    async with w:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"gemmrl worker {name}: connected to {scheduler} as {w.address}", flush=True)
        done = asyncio.ensure_future(w.finished())
        halt = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, halt}, return_when=asyncio.FIRST_COMPLETED)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        return "stopped" if stop.is_set() else "lost"
