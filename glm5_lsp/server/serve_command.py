"""``glm5-lsp serve``: run the language server on stdio (default) or TCP."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from glm5_lsp.threads import add_threads_argument, use_threads

log = logging.getLogger(__name__)

# How long a thread may hold the interpreter while another waits for it (Python's default: 5 ms).
# The model worker releases it in every torch kernel and wants it back at once, while the checkers'
# background threads and jedi run pure Python; with 5 ms slices the worker stalls behind them. 0.5 ms:
# the pipeline's mean request time fell 7% (lower in four of five paired in-process runs, BENCHMARKS.md).
SWITCH_INTERVAL_S = 0.0005
EXIT_GRACE_S = 1.0  # after exit, how long a worker thread still busy may hold the process


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    transport.add_argument("--tcp", type=_host_port, metavar="HOST:PORT", help="listen on TCP and serve the first client to connect (a second is refused: the "
                           "server's workspace and model belong to one session)")
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    from glm5_lsp.server.server import build_server  # pygls is imported only when serving

    use_threads(args.threads, "serve")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = build_server()
    if args.tcp:
        host, port = args.tcp
        code = server.serve_tcp(host, port)
    else:
        code = server.serve_stdio()
    _exit_now_if_stuck(code)
    return code


def _exit_now_if_stuck(code: int) -> None:
    """After ``exit``, work still running on a worker thread (a model call that ignores cancellation)
    must not keep the process alive: wait a moment for it, then leave without it."""
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() and not t.daemon and t is not threading.current_thread() for t in threading.enumerate()):
        log.warning("a worker thread is still busy after exit: leaving without it")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)
