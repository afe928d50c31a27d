"""A pool of sandboxed worker processes that run untrusted jobs (build, verify, time a candidate kernel)
and survive anything a job does. It knows nothing about GEMM.

A ``Job`` names a function ``"package.module:function"`` that a worker imports and calls as
``fn(args, ctx)``; its return value (plain data: dicts, lists, str, numbers, bytes) comes back in a
``JobResult`` whose ``status`` is one of

- ``ok``          the function returned.
- ``error``       it raised a Python exception (``error`` says type and message, ``output`` holds the
                  traceback); the worker stays.
- ``oom``         it raised MemoryError, torch.OutOfMemoryError or an exception saying "out of memory";
                  the worker stays.
- ``timeout``     no reply within ``Job.timeout_s``, timed by the parent: the worker's process group is
                  SIGKILLed and the worker replaced (a hang inside C code or on the GPU is caught too).
- ``crash``       the worker died (signal, abort, os._exit) or broke the reply protocol; replaced.
- ``cuda_fault``  after the job, ``torch.cuda.synchronize()`` or a tiny allocation and copy failed (a
                  sticky error such as an illegal address); the worker exits and is replaced.

Whatever the status, a job that leaves Python threads of its own running (a candidate that hands its work to a
thread and returns) retires its worker once its reply is sent: ``JobResult.retired`` says why and ``replaced`` is
set, so the thread dies with that process instead of running into the next job (seen: such a thread's late Triton
launch raised inside the next candidate's call, which then failed as a crash).

Workers are ``python -m gemmrl.sandbox`` subprocesses (a fresh interpreter, so no CUDA context is
inherited), one per visible GPU by default, each in its own session with ``CUDA_VISIBLE_DEVICES`` set to
its GPU. Each owns a scratch dir ``scratch_root/worker-<n>-<pid>``: its cwd, TMPDIR, HOME and the
Triton/CUDA/torch caches. fd 1 and 2 go to ``output.log`` there; the part a job wrote comes back in
``JobResult.output`` (its last 8 KB), after a crash or a timeout too.

Isolation, applied by the worker at startup before any job code runs (``isolate=False`` skips it):

- network: a new, empty network namespace (``unshare(CLONE_NEWNET)``, or with ``CLONE_NEWUSER`` when not
  root). If that fails, Landlock (ABI >= 4) denies TCP bind and connect instead, which is reported as
  unisolated since UDP stays open.
- filesystem: Landlock denies every write-like access outside the scratch dir, ``/dev`` (GPU device
  nodes, /dev/shm), the worker's own ``/proc/<pid>`` and the pool's ``writable`` dirs; reads stay
  allowed. ABI >= 6 also keeps signals and abstract unix sockets inside the sandbox. CUDA writes
  beneath ``/proc/self/task`` (thread names) and fails to initialize without it (cudaErrorOperatingSystem,
  seen on an H100), so a *child process* of a job cannot use CUDA: its /proc dir is not writable, and all
  of /proc is not granted since, as root, /proc/sys and /proc/sysrq-trigger are in it.

``JobResult.isolation`` says ``"isolated"`` or ``"unisolated: <what could not be enforced and why>"``.
Not covered: CPU and memory limits, a job's process that leaves the process group with setsid, and the
truth of a reply (job code runs in the worker and can forge it). The parent unpickles replies with an
allowlist of plain types, so a job cannot run code in the parent.

Tests: ``python -m pytest -q tests/test_sandbox.py`` (CPU only, about half a minute).
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import io
import logging
import os
import pickle
import queue
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

log = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "crash", "oom", "cuda_fault")
REPLACING = frozenset({"timeout", "crash", "cuda_fault"})
OUTPUT_TAIL_BYTES = 8192
MAX_REPLY_BYTES = 256 << 20
_EXIT_GRACE_S = 2.0

# --------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Job:
    job_id: str
    fn: str  # "package.module:function", called as fn(args, ctx) in the worker
    args: Any = None
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not (self.fn.partition(":")[0] and self.fn.partition(":")[2]):
            raise ValueError(f"Job.fn must look like 'package.module:function', got {self.fn!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"Job.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class JobResult:
    job_id: str
    status: str  # one of STATUSES
    value: Any = None
    error: str = ""
    output: str = ""
    isolation: str = ""
    worker_pid: int = 0
    gpu: int | None = None
    wall_s: float = 0.0
    replaced: bool = False
    retired: str = ""        # why a worker was retired after an otherwise normal reply (threads the job left)


@dataclass(frozen=True)
class JobContext:
    scratch: Path
    gpu: int | None
    worker_index: int
    isolation: str


class WorkerStartError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ wire protocol

_SAFE_GLOBALS = frozenset({("builtins", n) for n in ("complex", "set", "frozenset", "bytearray", "range", "slice")}
                          | {("collections", "OrderedDict")})


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data only: a global outside the allowlist (os.system, say) is refused, never called."""

    def __init__(self, data: bytes, extra: frozenset[tuple[str, str]] = frozenset()) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = _SAFE_GLOBALS | extra

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data (return dicts, lists, str, int, float, "
                                     "bool, None, bytes, or name the type in SandboxPool(value_types=...))")


def _loads_plain(data: bytes, extra: frozenset[tuple[str, str]] = frozenset()) -> Any:
    return _PlainUnpickler(data, extra).load()


def _send(sock: socket.socket, obj: Any, deadline: float | None = None) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.settimeout(None if deadline is None else max(deadline - time.monotonic(), 1e-3))
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))  # raises TimeoutError
        if not chunk:
            raise EOFError("worker closed its connection")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None = None, plain: bool = True) -> Any:
    (n,) = struct.unpack("!Q", _recv_exact(sock, 8, deadline))
    if n > MAX_REPLY_BYTES:
        raise pickle.UnpicklingError(f"reply of {n} bytes is over the {MAX_REPLY_BYTES} byte limit")
    data = _recv_exact(sock, n, deadline)
    return _loads_plain(data) if plain else pickle.loads(data)


# --------------------------------------------------------------------------------------- isolation

_CLONE_NEWNET, _CLONE_NEWUSER, _PR_SET_NO_NEW_PRIVS = 0x40000000, 0x10000000, 38
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same on x86_64 and aarch64
# WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM
_LL_FS_WRITE = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
_LL_FS_REFER, _LL_FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3; IOCTL_DEV (ABI 5) stays unhandled
_LL_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP (ABI 4)
_LL_SCOPE = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL (ABI 6)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _errno_text() -> str:
    e = ctypes.get_errno()
    return f"{errno.errorcode.get(e, e)}: {os.strerror(e)}"


def _unshare_net() -> str | None:
    """A new network namespace (only a loopback, down). None when done, else why not."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNET) == 0:
        return None
    why = f"unshare(CLONE_NEWNET) {_errno_text()}"
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return f"{why}; unshare(CLONE_NEWUSER|CLONE_NEWNET) {_errno_text()}"
    try:  # map our ids onto themselves, or files we create cannot be owned (EOVERFLOW)
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as e:
        log.warning("user namespace id mapping failed (%s); file creation may fail", e)
    return None


def _landlock(writable: Sequence[Path], block_tcp: bool) -> tuple[str | None, bool]:
    """Deny writes outside ``writable`` (and TCP if ``block_tcp``). Returns (why not | None, tcp_blocked)."""
    libc = _libc()
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 0:
        return f"Landlock unavailable, {_errno_text()}", False
    fs = _LL_FS_WRITE | (_LL_FS_REFER if abi >= 2 else 0) | (_LL_FS_TRUNCATE if abi >= 3 else 0)
    net = _LL_NET_TCP if block_tcp and abi >= 4 else 0
    attr = _RulesetAttr(fs, net, _LL_SCOPE if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    rfd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        return f"landlock_create_ruleset {_errno_text()}", False
    try:
        for path in writable:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(fs, pfd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(rfd), ctypes.c_int(1), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    return f"landlock_add_rule({path}) {_errno_text()}", False
            finally:
                os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0:
            return f"prctl(PR_SET_NO_NEW_PRIVS) {_errno_text()}", False
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(rfd), ctypes.c_uint32(0)) != 0:
            return f"landlock_restrict_self {_errno_text()}", False
    finally:
        os.close(rfd)
    return None, bool(net)


def _isolate(writable: Sequence[Path]) -> str:
    """Apply what the OS allows; must run while the process is single-threaded, before any job code."""
    missing = []
    net_why = _unshare_net()
    fs_why, tcp_blocked = _landlock(writable, block_tcp=net_why is not None)
    if net_why is not None:
        missing.append(f"network ({net_why}" + ("; TCP bind/connect denied by Landlock, UDP open)" if tcp_blocked else ")"))
    if fs_why is not None:
        missing.append(f"filesystem ({fs_why})")
    return "unisolated: " + "; ".join(missing) if missing else "isolated"


# -------------------------------------------------------------------------------------- worker side


def _resolve(name: str) -> Any:
    module, _, attr = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _is_oom(e: BaseException) -> bool:
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "out of memory" in str(e).lower())


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        _libc().fflush(None)
    except Exception:
        pass


def _cuda_health() -> str | None:
    """None if CUDA was not used or still works; else what failed. Never imports torch itself."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
    except Exception:  # a half-imported torch
        return None
    try:
        torch.cuda.synchronize()
        y = (torch.ones(16, device="cuda") * 2).cpu()
        if float(y.sum()) != 32.0:
            return "CUDA health check computed a wrong result"
    except Exception as e:
        return f"CUDA context poisoned: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    return None


def _left_threads(before: set) -> str:
    """The Python threads started since ``before`` that are still alive, as a reason to retire the worker, or ''."""
    # threads started through Python; a foreign (C/C++) thread that merely called into Python shows up as a dummy,
    # which is never "alive" in a way that can be judged, so it is left out
    left = [t for t in threading.enumerate()
            if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)]
    if not left:
        return ""
    names = ", ".join(t.name for t in left[:4]) + (", ..." if len(left) > 4 else "")
    return f"the job left {len(left)} Python thread(s) running ({names}); the worker is retired so they cannot " \
           "touch the next job"


def _run_job(fn_name: str, args_pickle: bytes, ctx: JobContext) -> dict:
    status, error, value = "ok", "", None
    before = set(threading.enumerate())
    try:
        value = _resolve(fn_name)(pickle.loads(args_pickle), ctx)
    except BaseException as e:  # SystemExit and KeyboardInterrupt from job code are job errors too
        status, error = ("oom" if _is_oom(e) else "error"), f"{type(e).__name__}: {e}"
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)  # minus our frame
    fault = _cuda_health()
    if fault is not None:
        status, error = "cuda_fault", f"{error}; {fault}" if error else fault
    payload = None
    if status == "ok":
        try:
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            status, error = "error", f"return value is not picklable: {type(e).__name__}: {e}"
    _flush_all()
    os.chdir(ctx.scratch)
    return {"status": status, "error": error, "value": payload, "retire": _left_threads(before)}


def _worker_main(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    _, cfg = _recv(sock, plain=False)
    scratch = Path(cfg["scratch"])
    os.chdir(scratch)
    os.environ.update(cfg["env"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from crashing candidates
    # /proc/<pid>: CUDA writes beneath /proc/self/task (thread names); without it cudaErrorOperatingSystem
    writable = [scratch, Path(f"/proc/{os.getpid()}"), *map(Path, cfg["writable"])]
    isolation = _isolate(writable) if cfg["isolate"] else "unisolated: disabled"
    _libc().prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG, after unshare (a new user namespace clears it)
    # the parent's path (test helpers, user site) first; our sys.path[0] is the scratch root: dropped
    sys.path[:] = cfg["sys_path"] + [p for p in sys.path[1:] if p not in cfg["sys_path"]]
    ctx = JobContext(scratch=scratch, gpu=cfg["gpu"], worker_index=cfg["index"], isolation=isolation)
    _send(sock, ("ready", {"pid": os.getpid(), "isolation": isolation}))
    while True:
        try:
            msg = _recv(sock, plain=False)
        except (EOFError, OSError):
            return 0
        if msg[0] != "job":
            return 0
        reply = _run_job(msg[2], msg[3], ctx)
        _send(sock, ("result", reply))
        if reply["status"] == "cuda_fault" or reply["retire"]:
            os._exit(0)  # a poisoned context (or a job's live threads) cannot be undone; the parent starts a new worker


# -------------------------------------------------------------------------------------- parent side


def _exit_text(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def visible_gpus() -> list[int]:
    """GPU indices this process may use, found without a CUDA context: the entries of
    CUDA_VISIBLE_DEVICES when set, else the /dev/nvidia<N> device nodes."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        entries = []
        for e in (e.strip() for e in cvd.split(",")):
            if not e or e.startswith("-"):
                break  # CUDA stops at the first invalid entry
            entries.append(e)
        return list(range(len(entries)))
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    return sorted(int(n[6:]) for n in names if n.startswith("nvidia") and n[6:].isdigit())


class _Worker:
    """One worker process, driven by one dispatcher thread."""

    def __init__(self, pool: SandboxPool, index: int, gpu: int | None) -> None:
        self.index, self.gpu, self.value_types = index, gpu, pool.value_types
        root = pool.scratch_root
        log_fd, log_path = tempfile.mkstemp(prefix=f"worker-{index}-", suffix=".log", dir=root)
        self.log_fd = log_fd
        os.set_inheritable(log_fd, False)
        self.sock, child_sock = socket.socketpair()
        try:
            with open(os.open(log_path, os.O_WRONLY | os.O_APPEND), "ab", buffering=0) as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "gemmrl.sandbox", str(child_sock.fileno())],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=root, env=pool._worker_env(gpu),
                    pass_fds=(child_sock.fileno(),), start_new_session=True)
        except OSError as e:
            self.sock.close()
            os.close(log_fd)
            os.unlink(log_path)
            raise WorkerStartError(f"worker {index} could not be spawned: {e}") from e
        finally:
            child_sock.close()
        self.pid = self.proc.pid
        self.scratch = root / f"worker-{index}-{self.pid}"
        self.isolation = ""
        try:
            self.scratch.mkdir(exist_ok=True)
            os.rename(log_path, self.scratch / "output.log")  # the open fds follow the file
            deadline = time.monotonic() + pool.start_timeout_s
            _send(self.sock, ("init", pool._init_config(index, gpu, self.scratch)), deadline)
            kind, hello = _recv(self.sock, deadline)
            if kind != "ready":
                raise WorkerStartError(f"unexpected first message {kind!r}")
            self.isolation = str(hello["isolation"])
        except Exception as e:
            rc, tail = self.kill(), self.tail()
            self.stop(pool.keep_scratch)
            Path(log_path).unlink(missing_ok=True)
            why = "no reply within start_timeout_s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            raise WorkerStartError(f"worker {index} did not start ({why}; {_exit_text(rc)})\n{tail}") from e
        log.info("worker %d pid %d gpu %s started, %s", index, self.pid, gpu, self.isolation)

    def tail(self) -> str:
        size = os.fstat(self.log_fd).st_size
        start = max(0, size - OUTPUT_TAIL_BYTES)
        text = os.pread(self.log_fd, size - start, start).decode("utf-8", "replace")
        return f"[... {start} bytes cut]\n{text}" if start else text

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, grace_s: float = 0.0) -> int | None:
        """Wait up to grace_s for the worker to exit, then SIGKILL its process group; the exit status."""
        if grace_s > 0:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the pgid stays reserved while any member lives
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            return None

    def run(self, job: Job, args_pickle: bytes) -> JobResult:
        os.ftruncate(self.log_fd, 0)  # the worker writes with O_APPEND: output starts at 0 again
        t0 = time.monotonic()
        deadline = t0 + job.timeout_s
        status, value, error, retired = "crash", None, "", ""
        try:
            _send(self.sock, ("job", job.job_id, job.fn, args_pickle), deadline)
            kind, reply = _recv(self.sock, deadline)
            status, error = str(reply["status"]), str(reply["error"])
            if kind != "result" or status not in STATUSES:
                raise pickle.UnpicklingError(f"malformed reply {kind!r}/{status!r}")
            retired = str(reply.get("retire") or "")
            if status == "ok":
                try:
                    value = _loads_plain(reply["value"], self.value_types)
                except Exception as e:
                    status, error = "error", f"return value is not plain data: {e}"
        except TimeoutError:
            status, error = "timeout", f"no result after {job.timeout_s:g} s"
        except (EOFError, ConnectionError):  # the worker died
            status, error = "crash", ""
        except (OSError, pickle.UnpicklingError, struct.error, KeyError, TypeError, ValueError) as e:
            status, error = "crash", f"bad reply ({type(e).__name__}: {e}), worker killed"
        replaced = status in REPLACING or bool(retired)
        if replaced:
            dying = status == "cuda_fault" or bool(retired) or (status == "crash" and not error)
            rc = self.kill(grace_s=_EXIT_GRACE_S if dying else 0.0)
            if status == "crash" and not error:
                error = _exit_text(rc)
            self.sock.close()
        return JobResult(job_id=job.job_id, status=status, value=value, error=error, output=self.tail(),
                         isolation=self.isolation, worker_pid=self.pid, gpu=self.gpu,
                         wall_s=time.monotonic() - t0, replaced=replaced, retired=retired)

    def stop(self, keep_scratch: bool) -> None:
        if self.alive():
            try:
                _send(self.sock, ("exit",), time.monotonic() + 1.0)
            except OSError:
                pass
        self.kill(grace_s=_EXIT_GRACE_S)
        self.sock.close()
        os.close(self.log_fd)
        if not keep_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


class SandboxPool:
    """Worker processes that run ``Job``s and return ``JobResult``s; see the module docstring.

    n_workers: default one per GPU in ``gpus`` (default: every visible GPU), else 1. Workers are
    assigned GPUs round-robin; with ``gpus=()`` they see none. ``writable``: extra directories jobs may
    write to (a shared build cache, say). ``env``: variables set in every worker, over the pool's own.
    ``value_types``: classes (``"module:Name"``) a return value may hold beyond plain data; name only
    types whose unpickling runs no code of the job's choosing (a dataclass of yours, not numpy).
    """

    def __init__(self, n_workers: int | None = None, gpus: Sequence[int] | None = None,
                 scratch_root: str | os.PathLike | None = None, isolate: bool = True,
                 start_timeout_s: float = 60.0, env: dict[str, str] | None = None,
                 writable: Sequence[str | os.PathLike] = (), keep_scratch: bool = False,
                 value_types: Iterable[str] = ()) -> None:
        self.gpus: list[int] = list(visible_gpus() if gpus is None else gpus)
        self._hide_gpus = gpus is not None and not self.gpus
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd and any(not 0 <= g < len(cvd.split(",")) for g in self.gpus):
            raise ValueError(f"gpus={self.gpus} index into CUDA_VISIBLE_DEVICES={cvd!r}, which has fewer entries")
        self.n_workers = n_workers if n_workers is not None else max(1, len(self.gpus))
        if self.n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {self.n_workers}")
        self.writable = [Path(p).resolve() for p in writable]
        for p in self.writable:
            if not p.is_dir():
                raise ValueError(f"writable entry {p} is not an existing directory")
        names = list(value_types)
        if not all(":" in t for t in names):
            raise ValueError(f"value_types must look like 'module:Name', got {names}")
        self.value_types = frozenset(tuple(t.split(":", 1)) for t in names)
        self._own_root = scratch_root is None
        self.scratch_root = Path(tempfile.mkdtemp(prefix="gemmrl-sandbox-") if scratch_root is None
                                 else scratch_root).resolve()
        self.scratch_root.mkdir(parents=True, exist_ok=True)
        self.isolate, self.start_timeout_s, self.keep_scratch = isolate, start_timeout_s, keep_scratch
        self.env = dict(env or {})
        self.replaced = 0  # workers replaced after a timeout, crash or CUDA fault, or retired (threads left running)
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=self._dispatch, args=(i,), name=f"sandbox-{i}", daemon=True)
                         for i in range(self.n_workers)]
        for t in self._threads:
            t.start()

    # ---- configuration handed to workers
    def _gpu_of(self, index: int) -> int | None:
        return self.gpus[index % len(self.gpus)] if self.gpus else None

    def _worker_env(self, gpu: int | None) -> dict[str, str]:
        # unbuffered: Python's and C's stdio (CPython sets _IONBF on both), so a crash loses no output
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        src = str(Path(__file__).resolve().parent.parent)  # so that `-m gemmrl.sandbox` imports this file
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
        if gpu is not None:
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = cvd.split(",")[gpu].strip() if cvd else str(gpu)
        elif self._hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # gpus=() asked for CPU-only workers
        return env

    def _init_config(self, index: int, gpu: int | None, scratch: Path) -> dict:
        dirs = {"TMPDIR": "tmp", "HOME": "home", "XDG_CACHE_HOME": "cache", "TRITON_CACHE_DIR": "triton",
                "TRITON_HOME": "home", "CUDA_CACHE_PATH": "nv", "TORCH_EXTENSIONS_DIR": "torch_extensions",
                "TORCHINDUCTOR_CACHE_DIR": "inductor"}
        env = {}
        for var, sub in dirs.items():
            if var not in self.env:
                (scratch / sub).mkdir(exist_ok=True)
                env[var] = str(scratch / sub)
        sys_path = [os.path.abspath(p) for p in sys.path]  # '' is the parent's cwd
        return {"index": index, "gpu": gpu, "scratch": str(scratch), "env": env, "isolate": self.isolate,
                "writable": ["/dev", *map(str, self.writable)], "sys_path": sys_path}

    # ---- dispatch
    def _dispatch(self, index: int) -> None:
        gpu = self._gpu_of(index)
        worker: _Worker | None = None
        try:
            worker = _Worker(self, index, gpu)  # warm up before the first job
        except Exception as e:  # tried again, and reported, with the first job
            log.warning("%s", e)
        while True:
            item = self._queue.get()
            if item is None:
                break
            job, args_pickle, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if worker is not None and not worker.alive():
                    log.warning("worker %d pid %d died between jobs (%s); replacing it", index, worker.pid,
                                _exit_text(worker.proc.returncode))
                    worker.stop(self.keep_scratch)
                    worker = None
                if worker is None:
                    worker = _Worker(self, index, gpu)
                result = worker.run(job, args_pickle)
                if result.replaced:
                    log.warning("job %s on worker %d pid %d: %s (%s); replacing the worker",
                                job.job_id, index, result.worker_pid, result.status, result.retired or result.error)
                    worker.stop(self.keep_scratch)
                    worker = None
                    with self._lock:
                        self.replaced += 1
                fut.set_result(result)
            except WorkerStartError as e:
                fut.set_result(JobResult(job.job_id, "crash", error=str(e).split("\n", 1)[0],
                                         output=str(e).partition("\n")[2], gpu=gpu))
            except BaseException as e:  # a bug in the pool, not in the job
                log.exception("internal error on job %s", job.job_id)
                fut.set_exception(e)
                if worker is not None:
                    worker.stop(self.keep_scratch)
                    worker = None
        if worker is not None:
            worker.stop(self.keep_scratch)

    # ---- public API
    def submit(self, job: Job) -> Future:
        """Queue ``job``; the future's result is its JobResult (never an exception for job failures)."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        try:  # fails here, not in a worker
            args_pickle = pickle.dumps(job.args, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(f"job {job.job_id!r}: args are not picklable ({type(e).__name__}: {e})") from e
        fut: Future = Future()
        self._queue.put((job, args_pickle, fut))
        return fut

    def map(self, jobs: Iterable[Job]) -> Iterator[JobResult]:
        """Submit every job now; yield their results as they complete."""
        futures = [self.submit(j) for j in jobs]
        return (f.result() for f in as_completed(futures))

    def run(self, jobs: Iterable[Job]) -> list[JobResult]:
        """Run every job; results in input order."""
        return [f.result() for f in [self.submit(j) for j in jobs]]

    def close(self, cancel_pending: bool = False) -> None:
        """Finish (or with ``cancel_pending``, cancel) queued jobs, then stop the workers."""
        if self._closed:
            return
        self._closed = True
        if cancel_pending:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[2].cancel()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        if self._own_root and not self.keep_scratch:
            shutil.rmtree(self.scratch_root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel_pending=exc_type is not None)


if __name__ == "__main__":
    from gemmrl.sandbox import _worker_main  # the classes jobs see then live in gemmrl.sandbox, not __main__

    sys.exit(_worker_main(int(sys.argv[1])))
