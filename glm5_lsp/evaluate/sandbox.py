"""Run untrusted candidate code in a throwaway subprocess: time limit, memory limit, no network.

Never in the caller's process. Layers, each enough on its own for an honest candidate that
misbehaves (this is not a defence against a determined attacker):

- a fresh temporary directory as the working directory and ``HOME``, deleted afterwards;
- ``python -I`` (no user site, no ``PYTHON*`` variables, no script directory on ``sys.path``);
- inside the child, before the candidate runs: ``resource.setrlimit`` on address space, CPU time,
  file size and core dumps, and an audit hook that refuses every socket connect, bind, send and
  name lookup (audit hooks cannot be removed once installed);
- a new network namespace (``unshare -n``, or ``unshare -rn`` without root) when the machine
  allows one, so even a C extension finds no network;
- a wall-clock timeout that kills the child's whole process group.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The child's bootstrap: limits, the network guard, then the candidate as __main__.
_RUNNER = r'''
import resource, sys

def _limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass

_memory, _cpu, _fsize, _block = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if _memory > 0:
    _limit(resource.RLIMIT_AS, _memory)
_limit(resource.RLIMIT_CPU, _cpu)
_limit(resource.RLIMIT_FSIZE, _fsize)
_limit(resource.RLIMIT_CORE, 0)

if _block:
    _BLOCKED = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr")

    def _no_network(event, args):
        if event in _BLOCKED:
            raise PermissionError(f"network access is disabled in the sandbox ({event})")

    sys.addaudithook(_no_network)

program = sys.argv[5]
sys.argv = [program]
import runpy
runpy.run_path(program, run_name="__main__")
'''

_OUTPUT_LIMIT = 64_000  # characters of stdout/stderr kept in the result (the tail)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space; 0 for no limit
    file_size_mb: int = 16  # largest file the candidate may write
    block_network: bool = True  # the audit hook
    network_namespace: bool | None = None  # None: use one when the machine allows it


@dataclass
class SandboxResult:
    status: str  # "passed" (exit 0), "failed" (non-zero exit), "timeout"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.lru_cache(maxsize=1)
def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix that gives a child its own (empty) network namespace here, or ``()``."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    candidates = [(unshare, "-n"), (unshare, "-rn")] if os.geteuid() == 0 else [(unshare, "-rn")]
    for prefix in candidates:
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return ()


def run_program(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox and report how it ended."""
    limits = limits or SandboxLimits()
    namespace: tuple[str, ...] = ()
    if limits.network_namespace is not False:
        namespace = namespace_command()
        if limits.network_namespace and not namespace:
            raise RuntimeError("a network namespace was required but unshare is not usable here")
    with tempfile.TemporaryDirectory(prefix="glm5-sandbox-") as folder:
        work = Path(folder)
        (work / "runner.py").write_text(_RUNNER, encoding="utf-8")
        (work / "program.py").write_text(code, encoding="utf-8")
        command = [
            *namespace, sys.executable, "-I", "-B", str(work / "runner.py"),
            str(limits.memory_mb * 1024 * 1024), str(int(limits.timeout_s) + 1),
            str(limits.file_size_mb * 1024 * 1024), "1" if limits.block_network else "0", str(work / "program.py"),
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": folder, "TMPDIR": folder,
               "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
            child = subprocess.Popen(command, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=err, start_new_session=True)
            try:
                returncode: int | None = child.wait(timeout=limits.timeout_s)
                status = "passed" if returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                _kill_group(child)
                returncode, status = None, "timeout"
            finally:
                _kill_group(child)  # grandchildren left behind by a finished candidate
        seconds = time.perf_counter() - started
        return SandboxResult(status, returncode, _tail(work / "stdout"), _tail(work / "stderr"), seconds)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - _OUTPUT_LIMIT))
        return handle.read().decode("utf-8", errors="replace")
