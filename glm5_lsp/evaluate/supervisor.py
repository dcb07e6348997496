"""The evaluation sandbox's supervisor: run as ``python -I -B supervisor.py CONFIG_JSON`` by
:func:`glm5_lsp.evaluate.sandbox.run_program`, never imported by it (standard library only).

Isolated runs (Linux, where the kernel lets this process make namespaces)::

    supervisor (P, outside)  --unshare(user?, mount, net, pid, ipc, uts)-->  fork
      init (C, pid 1 of the new pid namespace): mounts, then fork, wait, exit
        candidate (G): drops privileges, exec python runner.py program.py

- **Files**: mounts are made private, the run's work folder is bound onto ``/tmp`` (the only
  writable place, with a fresh ``/dev/shm``), every other mount is remounted read-only, and the
  homes (``/root``, ``/home``, ``/run/user``, the caller's ``$HOME``) are covered by empty read-only
  tmpfs mounts, with the interpreter's own folders bound back if they live there. ``/proc`` is a
  fresh one that shows only the sandbox's processes (the caller's environment stays unreadable).
- **Privileges**: as root, the candidate runs as an unused uid of its own (``2_000_000_000 + pid``);
  otherwise a user namespace maps it to uid 1000 inside, and its capabilities end at ``exec``. Both
  with ``no_new_privs``. The mounts it sees are locked: a nested namespace cannot uncover them.
- **Network**: an empty network namespace (no interface up): even a ``connect()`` made through
  ``ctypes`` finds no route.
- **Processes**: ``RLIMIT_NPROC`` (set by the runner) counts only the sandbox's own processes; when
  the candidate exits, init exits, and the kernel kills every process left in the namespace, a
  ``setsid`` daemon included. A timeout kills init, with the same effect. If the caller dies, the
  supervisor and init die with it (``PR_SET_PDEATHSIG``).

Unisolated runs (``--unsafe-no-sandbox``): the supervisor is a child subreaper, so every orphaned
descendant is re-parented to it, and after the candidate ends it kills its children until none are
left (a ``setsid`` grandchild included). The file system and the network are not contained there.

Reports go to a status file descriptor the candidate never holds, as JSON lines:
``{"setup": "ok"}`` or ``{"setup": "failed", "reason": ...}``, then
``{"returncode": N, "signal": S, "timeout": bool}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import signal
import socket
import sys
import time
from typing import Any

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
# Per-mount flags a less privileged namespace must keep when it remounts (else EPERM).
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
# Kernel interfaces, not storage: left as they are (their files are the kernel's, not writable by
# the candidate's uid), and unmountable from inside anyway.
_SPECIAL = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs", "securityfs", "pstore",
            "bpf", "configfs", "fusectl", "binfmt_misc", "autofs", "hugetlbfs", "efivarfs", "selinuxfs",
            "rpc_pipefs", "nsfs"}
INSIDE = "/tmp"  # where the work folder appears inside the sandbox
ROOT_UID_BASE = 2_000_000_000  # as root: the candidate's uid is this plus the supervisor's pid
USER_UID = 1000  # in a user namespace: the candidate's uid inside

_OCTAL = re.compile(rb"\\([0-7]{3})")  # mountinfo writes a space in a path as \040
_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(RuntimeError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(number)} (errno {number})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def mounts() -> list[tuple[str, set[str], str]]:
    """``(mount point, per-mount options, file system type)`` of this mount namespace, in order."""
    found = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split()
            dash = fields.index(b"-")
            point = os.fsdecode(_OCTAL.sub(lambda match: bytes([int(match.group(1), 8)]), fields[4]))
            found.append((point, set(fields[5].decode().split(",")), fields[dash + 1].decode()))
    return found


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


# ---- the isolated run: namespaces, mounts, privileges -------------------------------------------


def enter_namespaces(root: bool) -> None:
    """Unshare mount, network, pid, ipc and uts namespaces (and a user namespace unless root)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(flags if root else flags | CLONE_NEWUSER), "unshare")
    if not root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{USER_UID} {uid} 1\n")
        _write("/proc/self/gid_map", f"{USER_UID} {gid} 1\n")


def _bind_back(path: str, fd: int) -> None:
    """Bind the folder open as ``fd`` read-only at ``path`` (made if missing) over a covering mount."""
    os.makedirs(path, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _accounts(folder: str, uid: int) -> dict[str, str]:
    """``/etc/passwd`` and ``/etc/group`` files naming the candidate's uid (``getpass``, ``pwd`` and
    ``~`` then work inside, and the host's accounts are not listed)."""
    files = {"/etc/passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:{INSIDE}:/bin/sh\n"
                            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
             "/etc/group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"}
    made = {}
    for target, text in files.items():
        path = os.path.join(folder, os.path.basename(target))
        _write(path, text)
        made[target] = path
    return made


def build_file_system(work: str, hide: list[str], keep: list[str], shm_mb: int, uid: int) -> None:
    """Make this mount namespace the candidate's view (see the module docstring)."""
    kept = {os.path.realpath(path): os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep if os.path.isdir(path)}
    accounts = _accounts(os.path.dirname(work), uid)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for target, path in accounts.items():  # before /tmp is covered: the files are in the run's folder
        if os.path.isfile(target):
            _mount(path, target, None, MS_BIND)
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _mount(work, INSIDE, None, MS_BIND)  # before the read-only pass: a bind copies its source's flags
    for path, fd in kept.items():  # an interpreter under /tmp (a virtual environment there)
        if _under(path, INSIDE):
            _bind_back(path, fd)
    for point, options, fstype in mounts():
        if "ro" in options or fstype in _SPECIAL or _under(point, INSIDE) or _under(point, "/proc"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= _KEPT_FLAGS.get(option, 0)
        try:
            _mount(None, point, None, flags)
        except SetupError as error:
            if not os.path.exists(point):  # a mount point hidden under another mount
                continue
            raise SetupError(f"cannot make {point} ({fstype}) read-only: {error}") from None
    hidden: list[str] = []
    for folder in sorted({os.path.realpath(path) for path in hide if os.path.isdir(path)}, key=len):
        if any(_under(folder, done) for done in hidden) or _under(INSIDE, folder) or folder == "/":
            continue
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for path, fd in kept.items():
            if _under(path, folder):
                _bind_back(path, fd)
        _mount(None, folder, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        hidden.append(folder)
    for fd in kept.values():
        os.close(fd)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_mb}m,mode=1777")
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError:  # the kernel refuses a new proc here: hide the old one rather than show it
        _mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=555")
    with contextlib.suppress(OSError):
        socket.sethostname("sandbox")


def drop_privileges(root: bool, uid: int) -> None:
    """The candidate's own: an unused uid (root) or the namespace's mapped one; no new privileges."""
    if root:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _report(fd: int, **fields: Any) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (json.dumps(fields) + "\n").encode())


def _exec_candidate(config: dict[str, Any], argv_dir: str) -> None:
    """Replace this process with the candidate: python -I -B runner.py ... program.py."""
    runner, program = os.path.join(argv_dir, "runner.py"), os.path.join(argv_dir, "program.py")
    os.chdir(argv_dir)
    args = [config["python"], "-I", "-B", runner, *config["runner_args"], program]
    os.execve(config["python"], args, config["env"])


def _wait(pid: int, timeout: float) -> tuple[int | None, bool]:
    """``(wait status, timed_out)``; on timeout the process is killed (and reaped)."""
    deadline = time.monotonic() + timeout
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return os.waitpid(pid, 0)[1], True
            if pidfd >= 0:
                select.select([pidfd], [], [], min(left, 1.0))
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _exit_fields(status: int | None) -> dict[str, Any]:
    if status is None:
        return {"returncode": None, "signal": None}
    if os.WIFSIGNALED(status):
        return {"returncode": -os.WTERMSIG(status), "signal": os.WTERMSIG(status)}
    return {"returncode": os.WEXITSTATUS(status), "signal": None}


def run_isolated(config: dict[str, Any], status_fd: int) -> int:
    root = os.geteuid() == 0
    uid = ROOT_UID_BASE + os.getpid() if root else USER_UID
    try:
        enter_namespaces(root)
    except (SetupError, OSError) as error:
        _report(status_fd, setup="failed", reason=f"namespaces: {error}")
        return 0
    init = os.fork()
    if init == 0:  # pid 1 of the new pid namespace
        code = 1
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            code = _init(config, status_fd, root, uid)
        finally:
            os._exit(code)
    status, timed_out = _wait(init, config["timeout"])
    if timed_out:
        _report(status_fd, timeout=True, returncode=None, signal=None)
    else:  # init's own end (it reported the candidate's before, unless it failed)
        _report(status_fd, init=_exit_fields(status))
    return 0


def _init(config: dict[str, Any], status_fd: int, root: bool, uid: int) -> int:
    try:
        if root:
            os.chown(config["work"], uid, uid)
        build_file_system(config["work"], config["hide"], config["keep"], config["shm_mb"], uid)
    except (SetupError, OSError) as error:
        _report(status_fd, setup="failed", reason=f"file system: {error}")
        return 1
    _report(status_fd, setup="ok", isolated=True)
    candidate = os.fork()
    if candidate == 0:
        try:
            os.close(status_fd)
            drop_privileges(root, uid)
            _exec_candidate(config, INSIDE)
        except BaseException as error:  # noqa: BLE001 - the child must never return into init
            os.write(2, f"sandbox: could not start the candidate: {error}\n".encode())
        os._exit(127)
    status = None
    while True:  # init reaps every orphan until the candidate itself ends
        pid, wait_status = os.wait()
        if pid == candidate:
            status = wait_status
            break
    _report(status_fd, timeout=False, **_exit_fields(status))
    return 0  # init exits: the kernel kills whatever is left in the namespace


# ---- the unisolated run: a subreaper that sweeps ----------------------------------------------


def children() -> list[int]:
    """Ids of this process's children (from /proc: ``/proc/*/stat``'s parent field)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != b"Z":
            found.append(int(name))
    return found


def sweep() -> int:
    """Kill this process's children until none are left (orphans keep arriving: we are their
    subreaper); returns how many were killed."""
    killed = 0
    for _ in range(10_000):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        alive = children()
        if not alive:
            return killed
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.001)
    return killed


def run_unisolated(config: dict[str, Any], status_fd: int) -> int:
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    root = os.geteuid() == 0 and config["drop_root"]
    uid = ROOT_UID_BASE + os.getpid()
    if root:
        os.chown(config["work"], uid, uid)
    _report(status_fd, setup="ok", isolated=False)
    candidate = os.fork()
    if candidate == 0:
        try:
            os.close(status_fd)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            drop_privileges(root, uid)
            _exec_candidate(config, config["work"])
        except BaseException as error:  # noqa: BLE001 - the child must never return into the supervisor
            os.write(2, f"sandbox: could not start the candidate: {error}\n".encode())
        os._exit(127)
    status, timed_out = _wait(candidate, config["timeout"])
    killed = sweep()
    _report(status_fd, timeout=timed_out, swept=killed, **_exit_fields(None if timed_out else status))
    return 0


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    status_fd = int(config["status_fd"])
    with contextlib.suppress(OSError):
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != config["parent"]:  # the caller died before the line above
        return 1
    if config["isolate"]:
        return run_isolated(config, status_fd)
    return run_unisolated(config, status_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
