"""Find and run llama.cpp's ``llama-server`` for the real-engine test and ``benchmarks/llamacpp.py``.

The binary is ``$GLM5_LLAMA_SERVER``, else ``llama-server`` on ``PATH``, else the one
``scripts/build_llama_server.sh`` builds (from the llama.cpp sources that the llama-cpp-python
sdist on PyPI vendors) into ``~/.cache/glm5-lsp/llama.cpp/<version>/bin``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp has glm-dsa
BUILT = Path.home() / ".cache" / "glm5-lsp" / "llama.cpp" / LLAMA_CPP_PYTHON / "bin" / "llama-server"


def find_llama_server() -> Path | None:
    for candidate in (os.environ.get("GLM5_LLAMA_SERVER"), shutil.which("llama-server"), str(BUILT)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, ctx: int = 1024, threads: int = 1, log: Path | None = None,
                 alias: str = "glm5-code-tiny", extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve ``gguf`` on a free loopback port; yields the base URL once ``/health`` answers 200."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx),
               "-t", str(threads), "-tb", str(threads), "-np", "1", "--no-warmup", "--alias", alias, *extra]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
                raise RuntimeError(f"llama-server exited with {process.returncode}: {tail}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become healthy in 120 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log is not None:
            out.close()  # type: ignore[union-attr]
