"""The LLM reward over HTTP (``gemmrl serve-reward``): :class:`RewardServer`, :func:`serve_reward` and
:func:`check_host`.

POST /score ``{"completion", "mnk", ...}`` scores one completion with ``reward.score_completion`` on the
server's executor (default ``reward.default_executor``: sandboxed workers on the local GPUs), at most the
executor's ``slots`` at a time; GET /health describes the server. It listens on the loopback interface unless
told otherwise (it builds and runs the code it is sent), with a request-size limit (413) and a time limit (504).

Tests: ``pytest tests/search/test_llm.py -k serve_reward`` (Triton interpreter on CPU). Nothing runs at import time:
no socket is opened until a server is made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping

from .reward import completion_text, default_executor, problem_from, score_completion


class RewardServerError(ValueError):
    """A server that must not start as asked (a non-loopback address without ``allow_remote``)."""


def check_host(host: str, allow_remote: bool = False) -> None:
    """Refuse a non-loopback bind unless ``allow_remote``: the server runs code anyone who reaches it sends."""
    if allow_remote or host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise RewardServerError(f"refusing to serve on {host!r}: the reward server builds and runs the code it is "
                                "sent, so it listens on 127.0.0.1 by default; pass allow_remote=True "
                                "(--allow-remote) only on a trusted network")


class RewardServer:
    """POST /score ``{"completion", "mnk", "dtype"?, "acc"?, "layout"?}`` -> ``{"reward", "verdict", "reason"}``;
    GET /health. 413 for a body over ``max_request_bytes``, 400 for bad JSON or fields, 504 past ``time_limit_s``."""

    def __init__(self, executor: Any, host: str = "127.0.0.1", port: int = 0, max_request_bytes: int = 256 * 1024,
                 time_limit_s: float = 600.0, allow_remote: bool = False, read_timeout_s: float = 30.0):
        check_host(host, allow_remote)
        self.executor, self.max_request_bytes, self.time_limit_s = executor, max_request_bytes, time_limit_s
        self.read_timeout_s = read_timeout_s  # a client that stops mid-request loses its connection after this
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(getattr(executor, "slots", 1) or 1)),
                                        thread_name_prefix="gemmrl-score")
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "RewardServer":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="gemmrl-reward-server", daemon=True)
        self._thread.start()
        return self

    def wait(self) -> None:
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "RewardServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def score(self, body: Mapping[str, Any]) -> tuple[int, dict]:
        """(HTTP status, JSON reply) for one /score request body."""
        text = body.get("completion")
        if not isinstance(text, (str, list)):
            return 400, {"error": 'missing "completion": the model\'s answer as a string'}
        try:
            problem = problem_from(body)
        except ValueError as e:
            return 400, {"error": str(e)}
        fut = self._pool.submit(score_completion, completion_text(text), problem, self.executor, self.time_limit_s)
        try:
            reward, verdict, reason = fut.result(timeout=self.time_limit_s)
        except (FutureTimeout, TimeoutError):
            return 504, {"error": f"scoring {problem.mnk} took longer than {self.time_limit_s:g} s; raise the "
                                  "server's time limit (--time-limit-s) or score smaller problems"}
        return 200, {"reward": reward, "verdict": verdict, "reason": reason, "mnk": problem.mnk}


def _handler(server: RewardServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = server.read_timeout_s  # every read of a request (line, headers, body) gives up after this

        def _reply(self, status: int, obj: dict) -> None:
            data = json.dumps(obj, allow_nan=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") == "/health":
                t = getattr(server.executor, "template", None)
                self._reply(200, {"ok": True, "executor": type(server.executor).__name__,
                                  "device": getattr(t, "device", ""), "protocols": list(getattr(t, "protocols", ())),
                                  "max_request_bytes": server.max_request_bytes, "time_limit_s": server.time_limit_s})
            else:
                self._reply(404, {"error": f"no {self.path}: POST /score or GET /health"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/score":
                self.close_connection = True
                return self._reply(404, {"error": f"no {self.path}: POST /score or GET /health"})
            try:
                size = int(self.headers.get("Content-Length", ""))
            except ValueError:
                size = -1
            if size < 0:
                self.close_connection = True
                return self._reply(411, {"error": "send a Content-Length header (chunked bodies are not read)"})
            if size > server.max_request_bytes:
                self.close_connection = True  # the body is never read
                return self._reply(413, {"error": f"request body of {size} bytes is over the server's limit of "
                                                  f"{server.max_request_bytes}"})
            try:
                raw = self.rfile.read(size)
            except (TimeoutError, ConnectionError):  # stopped mid-body: drop it, quietly (no traceback, no thread held)
                self.close_connection = True
                return None
            if len(raw) < size:  # the client closed before the whole body came
                self.close_connection = True
                return None
            try:
                body = json.loads(raw or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                return self._reply(400, {"error": f"the body is not JSON ({e}); send "
                                                  '{"completion": "...", "mnk": "M_N_K"}'})
            if not isinstance(body, dict):
                return self._reply(400, {"error": 'send a JSON object {"completion": "...", "mnk": "M_N_K"}'})
            try:
                status, reply = server.score(body)
            except Exception as e:  # noqa: BLE001 - the executor failed, not the candidate
                status, reply = 500, {"error": f"scoring failed: {type(e).__name__}: {e}"[:400]}
            self._reply(status, reply)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request only when asked
            if os.environ.get("GEMMRL_REWARD_LOG"):
                super().log_message(format, *args)

    return Handler


def serve_reward(host: str = "127.0.0.1", port: int = 0, executor: Any = None, max_request_bytes: int = 256 * 1024,
                 time_limit_s: float = 600.0, allow_remote: bool = False, read_timeout_s: float = 30.0) -> RewardServer:
    """Start the reward server in a background thread and return it (``.url``, ``.wait()``, ``.close()``).
    ``executor`` defaults to :func:`default_executor` (sandboxed workers on the local GPUs)."""
    return RewardServer(executor if executor is not None else default_executor(), host, port, max_request_bytes,
                        time_limit_s, allow_remote, read_timeout_s).start()


__all__ = ["serve_reward", "RewardServer", "RewardServerError", "check_host"]
