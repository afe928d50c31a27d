"""`gemmrl serve-reward`: the LLM reward (extract, build, verify, time a completion) served over HTTP: POST /score,
GET /health (search/reward_server.py does the work).

    gemmrl serve-reward --port 8787
    gemmrl serve-reward --device cpu --no-sandbox --port 0      # Triton interpreter, no baselines: for tests
"""

from __future__ import annotations

import argparse

from ..timing import PROTOCOLS, TimingConfig
from .common import CliError, parse_protocols


def add_parser(sub) -> None:
    sr = sub.add_parser("serve-reward", help="serve the LLM reward (extract, build, verify, time a completion) over "
                                             "HTTP: POST /score, GET /health")
    sr.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback unless --allow-remote)")
    sr.add_argument("--port", type=int, default=8787, help="port (default 8787; 0 picks a free one)")
    sr.add_argument("--allow-remote", action="store_true",
                    help="allow a non-loopback --host: anyone who reaches it can make this machine run their code")
    sr.add_argument("--max-request-kb", type=int, default=256, help="largest request body accepted (413 beyond)")
    sr.add_argument("--time-limit-s", type=float, default=600.0, help="seconds per request before a 504")
    sr.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: Triton interpreter, no baselines (reward 0.0 for a verified kernel); for tests")
    sr.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=True,
                    help="evaluate in sandboxed worker processes (default); --no-sandbox runs them in-process")
    sr.add_argument("--protocol", help=f"comma list of {','.join(PROTOCOLS)} (default graph,cold; offline on cpu)")
    sr.set_defaults(func=cmd_serve_reward)


def cmd_serve_reward(args) -> int:
    """`gemmrl serve-reward`: the LLM reward (extract, build, verify, time) over HTTP; see search/reward_server.py."""
    from ..search.reward_server import RewardServerError, check_host, serve_reward  # start-up cost: the server

    try:
        check_host(args.host, args.allow_remote)  # before any worker starts
    except RewardServerError as e:
        raise CliError(str(e)) from None
    if args.max_request_kb <= 0 or args.time_limit_s <= 0:
        raise CliError("--max-request-kb and --time-limit-s must be positive")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port takes 0..65535 (0 picks a free one), got {args.port}")
    from ..search.executor import InlineExecutor, RequestTemplate, SandboxExecutor  # start-up cost: the executors

    cpu = args.device == "cpu"
    if not cpu:
        import torch  # start-up cost: torch, asked only to check for a GPU before anything starts

        if not torch.cuda.is_available():
            raise CliError("serve-reward --device cuda needs a CUDA GPU (torch.cuda.is_available() is False here): every "
                           "kernel would score -1.0; --device cpu serves the Triton interpreter's reward, for tests")
    template = RequestTemplate(protocols=parse_protocols(args.protocol or ("offline" if cpu else "graph,cold")),
                               baselines=() if cpu else None, graph_check=not cpu, device=args.device,
                               timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05) if cpu else None)
    if not args.sandbox:
        executor = InlineExecutor(template)
    elif cpu:
        executor = SandboxExecutor(template=template, timeout_s=args.time_limit_s, gpus=(),
                                   env={"TRITON_INTERPRET": "1"})
    else:
        executor = SandboxExecutor(template=template, timeout_s=args.time_limit_s)
    try:
        try:
            srv = serve_reward(args.host, args.port, executor, args.max_request_kb * 1024, args.time_limit_s,
                               args.allow_remote)
        except OSError as e:
            raise CliError(f"cannot listen on {args.host}:{args.port} ({e}); pick another --port (0 picks a free "
                           "one)") from None
        print(f"gemmrl serve-reward: POST {srv.url}/score, GET {srv.url}/health ({args.device}, "
              f"{'sandboxed' if args.sandbox else 'in-process, unisolated'}); Ctrl-C stops", flush=True)
        try:
            srv.wait()
        finally:
            srv.close()
    finally:
        executor.close()
    return 0
