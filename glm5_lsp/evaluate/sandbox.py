"""Run untrusted candidate code in a throwaway, isolated subprocess.

Never in the caller's process. :func:`run_program` starts ``supervisor.py`` (this folder), which on
Linux puts the candidate in its own mount, network, pid, ipc and uts namespaces (and a user
namespace when not root):

- **files**: a throwaway work folder (deleted afterwards) is its ``/tmp``, ``HOME`` and working
  directory, and the only place it can write; every other mount is read-only, and the homes
  (``/root``, ``/home``, ``/run/user``, the caller's ``$HOME``) are empty, so ``~/.ssh`` cannot be
  read through the real home; ``/proc`` shows only its own processes;
- **processes**: its own unprivileged uid with ``no_new_privs``, ``RLIMIT_NPROC``
  (``max_processes``) counted over the sandbox alone, and every descendant killed when the run ends
  (the pid namespace's init exits: a ``setsid`` daemon dies too);
- **network**: an empty network namespace (a ``connect()`` made through ``ctypes`` finds no route),
  and an audit hook refusing socket calls besides;
- **resources**: ``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, no core dumps, a wall-clock
  timeout; ``python -I`` (no user site, no ``PYTHON*`` variables).

Where the kernel refuses the namespaces (another OS, a container without user namespaces), there is
no isolation to be had: :func:`run_program` raises :class:`SandboxUnavailable` rather than run the
code with less than the above, unless ``SandboxLimits(isolate=False)`` (``glm5-lsp eval
--unsafe-no-sandbox``) says to. That mode keeps the resource limits, the audit hook, the throwaway
folder and the descendant sweep (a subreaper kills every process left, a ``setsid`` grandchild
included), but not the file system or the network: for code you trust.

:func:`isolation_problem` says which applies here (checked once per process).
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import signal
import stat
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

_memory, _cpu, _fsize, _block, _nproc = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1",
                                         int(sys.argv[5]))
if _memory > 0:
    _limit(resource.RLIMIT_AS, _memory)
_limit(resource.RLIMIT_CPU, _cpu)
_limit(resource.RLIMIT_FSIZE, _fsize)
_limit(resource.RLIMIT_CORE, 0)
if _nproc > 0:
    _limit(resource.RLIMIT_NPROC, _nproc)

if _block:
    _BLOCKED = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr")

    def _no_network(event, args):
        if event in _BLOCKED:
            raise PermissionError(f"network access is disabled in the sandbox ({event})")

    sys.addaudithook(_no_network)

program = sys.argv[6]
sys.argv = [program]
import runpy
runpy.run_path(program, run_name="__main__")
'''

_SUPERVISOR = Path(__file__).with_name("supervisor.py")
_OUTPUT_LIMIT = 64_000  # characters of stdout/stderr kept in the result (the tail)
_GRACE_S = 10.0  # past the timeout, how long the supervisor itself may take before it is killed


class SandboxUnavailable(RuntimeError):
    """Candidate code cannot be isolated here, and the caller did not accept running it without."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 1024  # address space; 0 for no limit
    file_size_mb: int = 16  # largest file the candidate may write
    max_processes: int = 64  # RLIMIT_NPROC: processes (and threads) at once, the candidate's included
    block_network: bool = True  # the audit hook (the namespace blocks the network anyway)
    # Namespaces (see the module docstring). False runs the code with the resource limits and the
    # process sweep only: ``--unsafe-no-sandbox``, for trusted code on a machine without namespaces.
    isolate: bool = True


@dataclass
class SandboxResult:
    status: str  # "passed" (exit 0), "failed" (non-zero exit), "timeout"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolated: bool = True  # whether it ran in the namespaces

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _homes() -> list[str]:
    """Folders the candidate must not read: every home, the caller's first."""
    found = [os.path.expanduser("~"), os.environ.get("HOME", "")]
    try:
        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    found += ["/root", "/home", "/run/user", "/var/run/user"]
    return [path for path in dict.fromkeys(found) if path and path != "/"]


def _interpreter_folders() -> list[str]:
    """The folders the candidate's interpreter needs, kept readable even under a hidden home."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(folder for folder in folders if folder)


def _reachable_by_anyone(path: str) -> bool:
    """Whether every folder above ``path`` lets other users through (``o+x``)."""
    current = Path(path).resolve()
    for folder in [current, *current.parents]:
        try:
            if not folder.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _status(read_fd: int) -> dict[str, object]:
    """The supervisor's JSON lines, merged (later lines win)."""
    os.set_blocking(read_fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    merged: dict[str, object] = {}
    for line in b"".join(chunks).decode("utf-8", errors="replace").splitlines():
        try:
            merged.update(json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
    return merged


def _supervise(code: str, limits: SandboxLimits, isolate: bool) -> tuple[dict[str, object], str, str, float]:
    """One supervised run: the supervisor's report, the candidate's stdout and stderr, seconds."""
    with tempfile.TemporaryDirectory(prefix="glm5-sandbox-") as folder:
        root = Path(folder)
        work = root / "work"
        work.mkdir()
        (work / "runner.py").write_text(_RUNNER, encoding="utf-8")
        (work / "program.py").write_text(code, encoding="utf-8")
        inside = "/tmp" if isolate else str(work)
        drop_root = os.geteuid() == 0 and all(_reachable_by_anyone(path) for path in _interpreter_folders())
        if not isolate and drop_root:
            os.chmod(root, 0o711)  # the candidate's own uid must reach its work folder
        read_fd, write_fd = os.pipe()
        config = {
            "parent": os.getpid(), "status_fd": write_fd, "isolate": isolate, "work": str(work),
            "timeout": limits.timeout_s, "hide": _homes(), "keep": _interpreter_folders(),
            "shm_mb": max(1, limits.file_size_mb), "python": sys.executable, "drop_root": drop_root,
            "runner_args": [str(limits.memory_mb * 1024 * 1024), str(int(limits.timeout_s) + 1),
                            str(limits.file_size_mb * 1024 * 1024), "1" if limits.block_network else "0",
                            str(limits.max_processes)],
            "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": inside, "TMPDIR": inside,
                    "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"},
        }
        started = time.perf_counter()
        try:
            with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
                supervisor = subprocess.Popen(
                    [sys.executable, "-I", "-B", str(_SUPERVISOR), json.dumps(config)], cwd=folder,
                    env={"PATH": config["env"]["PATH"], "LANG": "C.UTF-8"}, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, pass_fds=(write_fd,), start_new_session=True)
                os.close(write_fd)
                write_fd = -1
                try:
                    supervisor.wait(timeout=limits.timeout_s + _GRACE_S)
                except subprocess.TimeoutExpired:  # the supervisor itself is stuck: end its whole group
                    _kill_group(supervisor)
                finally:
                    _kill_group(supervisor)
            report = _status(read_fd)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        seconds = time.perf_counter() - started
        return report, _tail(root / "stdout"), _tail(root / "stderr"), seconds


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass


@functools.lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why candidate code cannot be isolated on this machine (None: it can). Tried once per process."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox's namespaces need Linux (this is {sys.platform})"
    probe = "import os\nassert os.getcwd() == '/tmp' and os.listdir('.')\n"
    try:
        report, _, stderr, _ = _supervise(probe, SandboxLimits(timeout_s=20), isolate=True)
    except OSError as error:
        return f"the sandbox could not start: {error}"
    if report.get("setup") != "ok":
        return str(report.get("reason") or f"the sandbox's set-up failed: {stderr.strip()[-300:]}")
    if report.get("returncode") != 0:
        return f"a trivial program failed in the sandbox: {stderr.strip()[-300:]}"
    return None


def require_isolation(limits: SandboxLimits) -> None:
    """Raise :class:`SandboxUnavailable` when ``limits`` ask for isolation this machine cannot give."""
    if limits.isolate:
        problem = isolation_problem()
        if problem is not None:
            raise SandboxUnavailable(f"candidate code cannot be isolated here ({problem}); "
                                     "run it unisolated only if you trust it (--unsafe-no-sandbox)")


def run_program(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox and report how it ended.

    Raises :class:`SandboxUnavailable` when ``limits.isolate`` and the machine cannot isolate it.
    """
    limits = limits or SandboxLimits()
    require_isolation(limits)
    report, stdout, stderr, seconds = _supervise(code, limits, limits.isolate)
    if report.get("setup") != "ok":
        raise SandboxUnavailable(f"the sandbox's set-up failed: {report.get('reason') or stderr.strip()[-300:]}")
    returncode = report.get("returncode")
    if report.get("timeout"):
        return SandboxResult("timeout", None, stdout, stderr, seconds, limits.isolate)
    if not isinstance(returncode, int):
        init = report.get("init")
        detail = f" (init ended {init})" if init else ""
        return SandboxResult("failed", None, stdout, stderr + f"\nsandbox: the candidate's end was not reported{detail}",
                             seconds, limits.isolate)
    return SandboxResult("passed" if returncode == 0 else "failed", returncode, stdout, stderr, seconds, limits.isolate)


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - _OUTPUT_LIMIT))
        return handle.read().decode("utf-8", errors="replace")
