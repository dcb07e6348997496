"""How requests end when a served model, a client or candidate code misbehaves (issue 19), side by side.

1. **A served model that fails**, behind ``OpenAIHTTPBackend`` and the pipeline with the language
   server's completion budget (450 ms): a server that accepts and never answers, one that answers
   500, one that answers 429 with ``Retry-After: 5``, a closed port, and a healthy one. Per case: the
   first request's seconds and answer, then the median of the next requests (the circuit breaker
   and the Retry-After hold-off make them fail fast).
2. **``glm5-lsp serve-model``** (the embedded model, a subprocess): seconds to refuse a 1 MB prompt,
   the statuses of two malformed stream requests then a valid one under ``--max-pending 2``, and
   seconds from SIGTERM to exit in the middle of a 4,096-token streamed generation.
3. **The evaluation sandbox**: each escape the issue tried, isolated and with
   ``--unsafe-no-sandbox``, and a trivial program's seconds in each (median of 5).

    python benchmarks/failures.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from glm5_lsp.backends.base import BackendError
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend
from glm5_lsp.evaluate.sandbox import SandboxLimits, isolation_problem, run_program
from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.serve_model import serve_in_thread

BUDGET_S = 0.45
DOCUMENT = "import os\n\ndef f(x):\n    return os.path.jo"


@contextmanager
def hanging_server() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for connection in held:
            connection.close()


@contextmanager
def status_server(status: int, headers: dict[str, str] | None = None) -> Iterator[str]:
    async def completions(request: Request) -> JSONResponse:
        if status == 200:
            return JSONResponse({"choices": [{"text": "in(x, 'y')", "finish_reason": "stop"}]})
        return JSONResponse({"error": {"message": "failing on purpose"}}, status_code=status, headers=headers)

    with serve_in_thread(Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])) as url:
        yield url


def timed(call: Callable[[], object]) -> tuple[float, str]:
    begun = time.monotonic()
    try:
        result = call()
        outcome = f"text {getattr(result, 'text', '')!r}" if getattr(result, "text", "") else "empty"
    except BackendError as error:
        outcome = type(error).__name__
    return time.monotonic() - begun, outcome


def served_model_failures() -> None:
    print(f"## A served model that fails (pipeline budget {BUDGET_S * 1000:.0f} ms, backend timeout 30 s)\n")
    print("| server | first request | its answer | next 5 (median) | their answer |")
    print("| --- | ---: | --- | ---: | --- |")
    cases: list[tuple[str, Callable[[], object]]] = [
        ("accepts, never answers", hanging_server),
        ("500", lambda: status_server(500)),
        ("429, Retry-After: 5", lambda: status_server(429, {"Retry-After": "5"})),
        ("closed port", lambda: _closed_port()),
        ("healthy", lambda: status_server(200)),
    ]
    for name, make in cases:
        with make() as url:  # type: ignore[attr-defined]
            settings = PipelineSettings()
            settings.repair.time_budget_s = BUDGET_S
            pipeline = Pipeline(OpenAIHTTPBackend(url, "m", timeout=30), settings)
            warm = Pipeline(OpenAIHTTPBackend(url, "m", timeout=30), settings)
            timed(lambda w=warm: w.complete(DOCUMENT, len(DOCUMENT)))  # the checkers' first start, untimed
            first, answer = timed(lambda p=pipeline: p.complete(DOCUMENT, len(DOCUMENT)))
            rest = [timed(lambda p=pipeline: p.complete(DOCUMENT, len(DOCUMENT))) for _ in range(5)]
            print(f"| {name} | {first:.3f} s | {answer} | {statistics.median(s for s, _ in rest):.3f} s | "
                  f"{', '.join(sorted({a for _, a in rest}))} |")
    print()


@contextmanager
def _closed_port() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def serve_model() -> None:
    print("## `glm5-lsp serve-model` (the embedded model)\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "glm5_lsp.cli", "serve-model", "--port", str(port), "--max-pending", "2"]
    server = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(url + "/v1/models", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("serve-model did not start") from None
                time.sleep(0.1)
        begun = time.monotonic()
        refused = httpx.post(url + "/v1/completions", json={"prompt": "x" * 1_000_000}, timeout=120)
        print(f"- 1 MB prompt: {refused.status_code} in {time.monotonic() - begun:.3f} s")
        bad = b'{"prompt": "x", "stream": true, "stream_options": [1]}'
        statuses = [httpx.post(url + "/v1/completions", content=bad, timeout=30).status_code for _ in range(2)]
        statuses.append(httpx.post(url + "/v1/completions", json={"prompt": "def f():", "max_tokens": 4},
                                   timeout=60).status_code)
        print(f"- two malformed stream requests, then a valid one (--max-pending 2): {statuses}")
        lines: list[str] = []

        def listen() -> None:
            try:
                with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                        "prompt": "def f(x):\n", "max_tokens": 4096, "stream": True, "temperature": 1.0}) as response:
                    lines.extend(response.iter_lines())
            except httpx.HTTPError:
                pass

        threading.Thread(target=listen, daemon=True).start()
        while len(lines) < 5 and time.monotonic() < deadline + 60:
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)
        begun = time.monotonic()
        code = server.wait(timeout=60)
        print(f"- SIGTERM after {len(lines)} streamed lines of a 4,096-token generation: exited ({code}) "
              f"in {time.monotonic() - begun:.3f} s\n")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


ESCAPES: dict[str, str] = {
    "write to the repository": (f"open({str(ROOT / 'escaped-bench.txt')!r}, 'w').write('x')\nprint('escaped')\n"),
    "read the real home": ("import os\nhome = os.path.expanduser('~root')\n"
                           "print('escaped' if any(os.path.isfile(os.path.join(home, n)) for n in os.listdir(home))"
                           " else 'contained')\n"),
    "fork 200 times": ("import os, time\nmade = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
                       "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
                       "    made += 1\nprint('escaped' if made == 200 else 'contained', made)\n"),
    "ctypes connect()": ("import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                         "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
                         "a = struct.pack('=HH4s8x', socket.AF_INET, socket.htons(PORT), socket.inet_aton('127.0.0.1'))\n"
                         "print('escaped' if libc.connect(fd, ctypes.c_char_p(a), len(a)) == 0 else 'contained')\n"),
}


def sandbox() -> None:
    print("## The evaluation sandbox\n")
    problem = isolation_problem()
    print(f"isolation here: {'yes' if problem is None else 'no (' + problem + ')'}\n")
    modes = [("isolated", SandboxLimits(max_processes=32))] if problem is None else []
    modes.append(("--unsafe-no-sandbox", SandboxLimits(isolate=False, max_processes=32)))
    print("| escape | " + " | ".join(name for name, _ in modes) + " |")
    print("| --- |" + " --- |" * len(modes))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    marker = f"daemon-{uuid.uuid4().hex}"
    target = Path(tempfile.mkdtemp()) / "late.txt"
    setsid = ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import sys, time; time.sleep(2); "
              f"open(sys.argv[1], \"w\").write(\"x\")', {str(target)!r}, {marker!r}], start_new_session=True)\n")
    rows = {name: [] for name in [*ESCAPES, "setsid grandchild writes 2 s later"]}
    for _, limits in modes:
        for name, code in ESCAPES.items():
            result = run_program(code.replace("PORT", str(port)), limits)
            rows[name].append("escaped" if "escaped" in result.stdout else "contained")
            (ROOT / "escaped-bench.txt").unlink(missing_ok=True)
        run_program(setsid, limits)
        time.sleep(2.5)
        rows["setsid grandchild writes 2 s later"].append("escaped" if target.exists() else "contained")
        target.unlink(missing_ok=True)
    listener.close()
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")
    times = []
    for name, limits in modes:
        seconds = statistics.median(run_program("pass", limits).seconds for _ in range(5))
        times.append(f"{name} {seconds:.3f} s")
    print(f"\na trivial program (median of 5): {', '.join(times)}\n")


def main() -> int:
    print(json.dumps({"python": sys.version.split()[0], "cpus": os.cpu_count()}))
    served_model_failures()
    serve_model()
    sandbox()
    return 0


if __name__ == "__main__":
    sys.exit(main())
