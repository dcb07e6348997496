"""The sandbox stops an infinite loop, a memory bomb and a network call, and runs honest code."""

from __future__ import annotations

import socket
import threading

import pytest

from glm5_lsp.evaluate.sandbox import SandboxLimits, namespace_command, run_program


def test_passing_and_failing_programs() -> None:
    assert run_program("assert sum([1, 2]) == 3\nprint('ok')\n").status == "passed"
    failed = run_program("assert 1 == 2, 'wrong'\n")
    assert failed.status == "failed" and "AssertionError: wrong" in failed.stderr


def test_infinite_loop_is_stopped() -> None:
    result = run_program("while True:\n    pass\n", SandboxLimits(timeout_s=1.0))
    assert result.status == "timeout" and result.seconds < 5


def test_memory_bomb_is_stopped() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))\n"
    result = run_program(code, SandboxLimits(timeout_s=10.0, memory_mb=256))
    assert result.status == "failed" and "MemoryError" in result.stderr


@pytest.fixture()
def listener() -> tuple[int, list[bool]]:
    """A loopback TCP server that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
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


@pytest.mark.parametrize("hook, namespace", [(True, None), (True, False), (False, True)],
                         ids=["both", "audit-hook-only", "namespace-only"])
def test_network_call_is_blocked(listener: tuple[int, list[bool]], hook: bool, namespace: bool | None) -> None:
    if namespace and not namespace_command():
        pytest.skip("unshare cannot create a network namespace on this machine")
    port, accepted = listener
    result = run_program(CONNECT.format(port=port), SandboxLimits(block_network=hook, network_namespace=namespace))
    assert result.status == "failed" and "connected" not in result.stdout
    assert not accepted


def test_network_is_reachable_without_the_guards(listener: tuple[int, list[bool]]) -> None:
    """The control: the same program connects when both guards are off, so the test above can fail."""
    port, _ = listener
    result = run_program(CONNECT.format(port=port), SandboxLimits(block_network=False, network_namespace=False))
    assert result.status == "passed" and "connected" in result.stdout


def test_runs_in_a_throwaway_directory() -> None:
    code = "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())\n"
    result = run_program(code)
    folder = result.stdout.strip()
    assert result.passed and "glm5-sandbox-" in folder
    import os

    assert not os.path.exists(folder)
