"""`gemmrl worker`: one Dask worker that owns one GPU (or none, ``--cpu``) and runs the tuning loop's groups.

    dask scheduler --port 8786                                          # once, on any host
    gemmrl worker --gpu-device-id 0 --scheduler tcp://HOST:8786         # once per GPU, on every GPU host
    gemmrl tune --scheduler tcp://HOST:8786 --grid cuda-l2 --proposer rl   # anywhere that reaches the scheduler

The worker is a plain process (no nanny, so nothing daemonic stands between it and the sandbox's child
processes; ``distributed.worker.daemon`` is off as well), with ``CUDA_VISIBLE_DEVICES`` set to its GPU before
anything touches CUDA, one thread, and the resources ``GPU: 1`` and ``MODEL-<GPU model>: 1``. Its Dask name is
``<GPU model>|<host>|<device>``, which is how the tuner tells GPU models apart. Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket


def add_parser(sub) -> None:
    w = sub.add_parser("worker", help="a Dask worker that owns one GPU and runs tuning groups (gemmrl tune --scheduler)")
    w.add_argument("--scheduler", required=True, help="the Dask scheduler, tcp://HOST:PORT")
    g = w.add_mutually_exclusive_group()
    g.add_argument("--gpu-device-id", type=int, default=0, help="the GPU this worker owns (default 0)")
    g.add_argument("--cpu", action="store_true", help="own no GPU (Triton interpreter or the cost model: tests, dry runs)")
    w.add_argument("--host", default=None, help="address to listen on (default: what reaches the scheduler)")
    w.add_argument("--name", default=None, help="Dask worker name (default <GPU model>|<host>|<device>)")
    w.set_defaults(func=cmd_worker)


def cmd_worker(args) -> int:
    from .cli import CliError
    from .search.dask_executor import gpu_name, model_resource

    if not str(args.scheduler).startswith(("tcp://", "tls://", "inproc://")):
        raise CliError(f"--scheduler {args.scheduler!r}: give the scheduler's address, e.g. tcp://10.0.0.5:8786")
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
    name = args.name or f"{model}|{socket.gethostname()}|{dev}"
    import dask

    dask.config.set({"distributed.worker.daemon": False})
    try:
        asyncio.run(_serve(args.scheduler, name, {"GPU": 1, model_resource(model): 1}, args.host))
    except (OSError, TimeoutError) as e:
        raise CliError(f"cannot reach the scheduler at {args.scheduler}: {e}") from None
    return 0


async def _serve(scheduler: str, name: str, resources: dict, host: str | None) -> None:
    from distributed import Worker

    loop = asyncio.get_running_loop()
    async with Worker(scheduler, nthreads=1, name=name, resources=resources, host=host, validate=False) as w:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"gemmrl worker {name}: connected to {scheduler} as {w.address}", flush=True)
        done = asyncio.ensure_future(w.finished())
        halt = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, halt}, return_when=asyncio.FIRST_COMPLETED)
