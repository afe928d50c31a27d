"""Job functions for tests/test_sandbox.py, imported by name inside sandbox workers (tests/ is on the
parent's sys.path under pytest, and the pool hands its sys.path to the workers). Each is ``fn(args, ctx)``."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types


def echo(args, ctx):
    print("python stdout")
    print("python stderr", file=sys.stderr)
    os.write(1, b"fd1 from C level\n")
    os.write(2, b"fd2 from C level\n")
    ctypes.CDLL(None).puts(b"libc puts")  # C stdio, buffered unless the worker flushes it
    return {"value": args, "pid": os.getpid()}


def double(args, ctx):
    return {"value": args * 2, "pid": os.getpid()}


def where(args, ctx):
    return {"cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "scratch": str(ctx.scratch),
            "env": {k: os.environ.get(k) for k in ("TMPDIR", "HOME", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")},
            "worker_index": ctx.worker_index, "isolation": ctx.isolation}


def raise_value_error(args, ctx):
    raise ValueError("planted failure")


def raise_memory_error(args, ctx):
    raise MemoryError("planted")


def raise_cuda_oom_message(args, ctx):
    raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")


def raise_torch_oom(args, ctx):
    import torch

    raise torch.OutOfMemoryError("planted torch OOM")


def segfault(args, ctx):
    print("about to segfault")
    ctypes.string_at(0)


def kill_self_segv(args, ctx):
    os.kill(os.getpid(), signal.SIGSEGV)


def abort(args, ctx):
    os.abort()


def exit3(args, ctx):
    os._exit(3)


def hang_in_c(args, ctx):
    print("hanging")
    ctypes.CDLL(None).sleep(60)  # a C call: no Python signal handler would interrupt it


def spawn_and_hang(args, ctx):
    child = subprocess.Popen(["sleep", "60"])
    print(f"child {child.pid}")
    time.sleep(60)


def poison_cuda(args, ctx):
    """Plant a stand-in for a torch whose CUDA context is poisoned (a sticky illegal-address error)."""

    def synchronize():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True,
                                                                           synchronize=synchronize))
    return {"pid": os.getpid()}


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # would run in whoever unpickles it
        return (os.system, (f"touch {self.marker}",))


def return_evil_pickle(args, ctx):
    return {"payload": _Evil(args)}


def return_timedelta(args, ctx):
    import datetime

    return {"t": datetime.timedelta(seconds=args)}


def return_unpicklable(args, ctx):
    return {"f": lambda: None}


def write_files(args, ctx):
    """Try to write and delete outside the scratch dir, then write inside it."""
    out = {}
    try:
        with open(args["outside"], "w") as f:
            f.write("escaped")
        out["outside"] = "written"
    except OSError as e:
        out["outside"] = type(e).__name__
    try:
        os.remove(args["victim"])
        out["remove"] = "removed"
    except OSError as e:
        out["remove"] = type(e).__name__
    inside = ctx.scratch / "inside.txt"
    inside.write_text("hello")
    out["inside"] = inside.read_text()
    with tempfile.NamedTemporaryFile(dir=None) as f:  # TMPDIR points inside the scratch dir
        f.write(b"tmp")
        out["tmpfile"] = f.name
    return out


def connect(args, ctx):
    try:
        with socket.create_connection(("127.0.0.1", args), timeout=2):
            return {"connect": "connected"}
    except OSError as e:
        return {"connect": type(e).__name__, "errno": e.errno}


def spam(args, ctx):
    for i in range(args):
        print(f"line {i:05d} " + "x" * 40)
    return None


def rendezvous(args, ctx):
    """Leave a mark in a shared dir; wait (up to args["wait"] s) for another job's mark; linger."""
    from pathlib import Path

    shared = Path(args["dir"])
    (shared / args["me"]).write_text(str(os.getpid()))
    saw = None
    if args.get("other"):
        deadline = time.monotonic() + args.get("wait", 10.0)
        while not (shared / args["other"]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        saw = (shared / args["other"]).exists()
    time.sleep(args.get("linger", 0.0))
    return {"saw_other": saw, "pid": os.getpid(), "gpu": ctx.gpu, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}


def name_thread(args, ctx):
    """Name another thread through /proc, as pthread_setname_np does (and CUDA does at initialization)."""
    import threading

    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        path = f"/proc/self/task/{t.native_id}/comm"
        with open(path, "w") as f:
            f.write("cuda-like")
        with open(path) as f:
            return f.read().strip()
    finally:
        done.set()
        t.join()


def leave_thread(args, ctx):
    """Hands work to a thread that outlives the job (a candidate that returns before its work is done)."""
    import threading

    threading.Thread(target=time.sleep, args=(args,), name="late-work", daemon=True).start()
    return {"pid": os.getpid()}


def join_thread(args, ctx):
    """Uses a thread and waits for it: nothing is left running."""
    import threading

    t = threading.Thread(target=time.sleep, args=(args,), name="joined")
    t.start()
    t.join()
    return {"pid": os.getpid()}
