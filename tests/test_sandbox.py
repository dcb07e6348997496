"""The evaluation sandbox: honest code runs; loops, memory bombs, the network, writes outside its
folder, reading the real home, fork bombs, ``setsid`` daemons and a ``ctypes`` ``connect()`` are contained.

Each escape is tried for real. Where this machine cannot make the namespaces the isolated cases
skip, and the refusal to run without them (unless told ``--unsafe-no-sandbox``) is tested instead.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from glm5_lsp.evaluate import sandbox
from glm5_lsp.evaluate.sandbox import SandboxLimits, SandboxUnavailable, isolation_problem, run_program

ROOT = Path(__file__).parents[1]
isolated = pytest.mark.skipif(isolation_problem() is not None,
                              reason=f"no isolation on this machine: {isolation_problem()}")
UNSAFE = SandboxLimits(isolate=False)
BEST = SandboxLimits(isolate=isolation_problem() is None)  # for what any mode must do


def test_passing_and_failing_programs() -> None:
    assert run_program("assert sum([1, 2]) == 3\nprint('ok')\n", BEST).status == "passed"
    failed = run_program("assert 1 == 2, 'wrong'\n", BEST)
    assert failed.status == "failed" and "AssertionError: wrong" in failed.stderr


def test_infinite_loop_is_stopped() -> None:
    result = run_program("while True:\n    pass\n", replace(BEST, timeout_s=1.0))
    assert result.status == "timeout" and result.seconds < 5


def test_memory_bomb_is_stopped() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))\n"
    result = run_program(code, replace(BEST, timeout_s=10.0, memory_mb=256))
    assert result.status == "failed" and "MemoryError" in result.stderr


@pytest.fixture()
def listener() -> Iterator[tuple[int, list[bool]]]:
    """A loopback TCP server that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)
    accepted: list[bool] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(True)
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(timeout=5)
    server.close()


CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()\nprint('connected')\n"
# connect() straight from libc: no audit event is raised, only the namespace can stop it
CTYPES_CONNECT = """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
address = struct.pack("=HH4s8x", socket.AF_INET, socket.htons({port}), socket.inet_aton("127.0.0.1"))
result = libc.connect(fd, ctypes.c_char_p(address), len(address))
print("connected" if result == 0 else f"refused errno={{ctypes.get_errno()}}")
"""


@pytest.mark.parametrize("hook, isolate", [
    pytest.param(True, True, marks=isolated, id="both"),
    pytest.param(True, False, id="audit-hook-only"),
    pytest.param(False, True, marks=isolated, id="namespace-only"),
])
def test_network_call_is_blocked(listener: tuple[int, list[bool]], hook: bool, isolate: bool) -> None:
    port, accepted = listener
    result = run_program(CONNECT.format(port=port), SandboxLimits(block_network=hook, isolate=isolate))
    assert result.status == "failed" and "connected" not in result.stdout
    assert not accepted


def test_network_is_reachable_without_the_guards(listener: tuple[int, list[bool]]) -> None:
    """The control: the same program connects when both guards are off, so the test above can fail."""
    port, _ = listener
    result = run_program(CONNECT.format(port=port), SandboxLimits(block_network=False, isolate=False))
    assert result.status == "passed" and "connected" in result.stdout


@isolated
def test_a_ctypes_connect_finds_no_network(listener: tuple[int, list[bool]]) -> None:
    port, accepted = listener
    contained = run_program(CTYPES_CONNECT.format(port=port))
    assert contained.passed and "refused" in contained.stdout and not accepted, contained
    unsafe = run_program(CTYPES_CONNECT.format(port=port), UNSAFE)  # the audit hook alone lets it through
    assert unsafe.passed and "connected" in unsafe.stdout and accepted, unsafe


def test_runs_in_a_throwaway_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's runs only (others share /tmp)
    code = "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), os.environ['HOME'])\n"
    for limits in ([SandboxLimits()] if isolation_problem() is None else []) + [UNSAFE]:
        result = run_program(code, limits)
        cwd, home = result.stdout.split()
        assert result.passed and cwd == home, result
    assert list(tmp_path.iterdir()) == []  # deleted afterwards, with what was written there


@isolated
def test_writing_outside_its_folder_is_refused() -> None:
    tag = uuid.uuid4().hex[:12]
    targets = [ROOT / f"escaped-{tag}.txt", Path("/var/tmp") / f"escaped-{tag}.txt",
               Path.home() / f"escaped-{tag}.txt", Path("/dev/shm") / f"escaped-{tag}.txt",
               Path(tempfile.gettempdir()) / f"escaped-{tag}.txt"]
    code = "".join(
        f"try:\n    open({str(path)!r}, 'w').write('x')\n    print('wrote')\n"
        f"except OSError as error:\n    print('refused', type(error).__name__)\n" for path in targets)
    try:
        result = run_program(code)
        assert result.passed, result
        for path in targets:
            assert not path.exists(), f"{path} was written from inside the sandbox"
        # the repository, /var/tmp and the home are read-only; /dev/shm and /tmp are the sandbox's own
        # (a checkout under /tmp is not there at all: FileNotFoundError, refused all the same)
        refusals = [line.split()[:1] for line in result.stdout.split("\n")[:3]]
        assert refusals == [["refused"]] * 3, result.stdout
    finally:
        for path in targets:
            path.unlink(missing_ok=True)


@isolated
def test_the_real_home_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_home = Path("/var/tmp") / f"glm5-home-{uuid.uuid4().hex[:12]}"
    secret = f"secret-{uuid.uuid4().hex}"
    (fake_home / ".ssh").mkdir(parents=True)
    try:
        (fake_home / ".ssh" / "id_test").write_text(secret)
        monkeypatch.setenv("HOME", str(fake_home))  # the caller's home, as the sandbox sees it
        readable = next((p for p in sorted(Path(os.path.expanduser("~root")).iterdir()) if p.is_file()), None) \
            if os.access(os.path.expanduser("~root"), os.R_OK) else None
        probes = [fake_home / ".ssh" / "id_test"] + ([readable] if readable else [])
        code = "import os, pwd\n" + "".join(
            f"try:\n    print(open({str(path)!r}).read())\nexcept OSError as error:\n"
            f"    print('refused', type(error).__name__)\n" for path in probes) + (
            f"print('listing', os.listdir({str(fake_home)!r}), os.listdir(pwd.getpwuid(os.getuid()).pw_dir))\n")
        result = run_program(code)
        assert secret not in result.stdout and result.stdout.count("refused") == len(probes), result
        assert "listing [] " in result.stdout, result.stdout
        outside = run_program(code, UNSAFE)  # the control: without the namespaces it reads the secret
        assert secret in outside.stdout
    finally:
        for path in sorted(fake_home.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        fake_home.rmdir()


def _processes_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@isolated
def test_forking_200_times_is_refused_past_the_process_limit() -> None:
    marker = f"forked-{uuid.uuid4().hex}"
    code = f"""
import os, sys
made = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as error:
        print("refused", error.errno)
        break
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
    made += 1
print("forked", made)
"""
    result = run_program(code, SandboxLimits(max_processes=32, timeout_s=20))
    assert result.passed and "refused" in result.stdout, result
    made = int(result.stdout.split("forked")[1])
    assert made < 32 and result.seconds < 15
    assert _processes_with(marker) == []  # and the sleepers died with the run


SETSID = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c",
                  "import os, sys, time; time.sleep({delay}); open(sys.argv[1], 'w').write('escaped')",
                  {target!r}, {marker!r}], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("spawned")
"""


@pytest.mark.parametrize("limits", [pytest.param(SandboxLimits(), marks=isolated, id="isolated"),
                                    pytest.param(UNSAFE, id="unisolated-sweep")])
def test_a_setsid_grandchild_dies_with_the_run(tmp_path: Path, limits: SandboxLimits) -> None:
    marker, target = f"daemon-{uuid.uuid4().hex}", tmp_path / "late.txt"
    if limits.isolate:
        (tmp_path / "writable").mkdir()
    result = run_program(SETSID.format(delay=2, target=str(target), marker=marker), limits)
    assert result.passed and "spawned" in result.stdout, result
    assert _processes_with(marker) == []
    time.sleep(2.5)  # past the daemon's delay: had it lived, the file would be there
    assert not target.exists() and _processes_with(marker) == []


def test_the_control_a_setsid_grandchild_outlives_a_plain_subprocess(tmp_path: Path) -> None:
    """Without the sandbox's sweep the same daemon lives on and writes: the test above can fail."""
    import subprocess
    import sys

    marker, target = f"daemon-{uuid.uuid4().hex}", tmp_path / "late.txt"
    program = tmp_path / "program.py"
    program.write_text(SETSID.format(delay=1, target=str(target), marker=marker))
    subprocess.run([sys.executable, str(program)], check=True, capture_output=True, start_new_session=True)
    deadline = time.monotonic() + 10
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.read_text() == "escaped"


def test_without_isolation_it_refuses_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "user namespaces are disabled here")
    with pytest.raises(SandboxUnavailable, match="user namespaces are disabled here.*--unsafe-no-sandbox"):
        run_program("print('ran')\n")
    result = run_program("print('ran')\n", UNSAFE)
    assert result.passed and result.stdout == "ran\n" and not result.isolated
