"""call_with_timeout: a pure-Python call stopped in its own thread once its time is up."""

from __future__ import annotations

import time

import pytest

from glm5_lsp.deadline import call_with_timeout


def spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < end:
        count += 1
    return count


def test_a_call_within_its_time_returns_its_value() -> None:
    assert call_with_timeout(lambda: 6 * 7, 1.0) == 42


def test_a_long_call_is_stopped_near_its_limit() -> None:
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        call_with_timeout(lambda: spin(5.0), 0.05)
    assert time.perf_counter() - started < 1.0


def test_the_stop_is_not_swallowed_by_except_exception() -> None:
    def stubborn() -> str:
        while True:
            try:
                spin(0.01)
            except Exception:  # noqa: BLE001 - the point of the test
                return "swallowed"

    with pytest.raises(TimeoutError):
        call_with_timeout(stubborn, 0.05)


def test_a_timer_firing_as_the_call_returns_never_leaks_into_later_code() -> None:
    """Calls that end right at their limit: whichever wins, nothing is raised after the call."""
    outcomes = set()
    for attempt in range(200):
        limit = 0.0005 + (attempt % 10) * 0.0002
        try:
            call_with_timeout(lambda: spin(0.001), limit)
            outcomes.add("returned")
        except TimeoutError:
            outcomes.add("stopped")
        spin(0.002)  # a withdrawn exception would surface here, outside the call
    assert outcomes  # (either outcome is fine; an escaped Overrun would have failed the test)


def test_no_time_left_raises_at_once() -> None:
    with pytest.raises(TimeoutError):
        call_with_timeout(lambda: 1, 0.0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_swallowed_by_a_finalizer_is_raised_again() -> None:
    """Python swallows an exception raised inside ``__del__``; the stop comes again until it lands."""
    class SlowToDie:
        def __del__(self) -> None:
            spin(0.2)  # the first stop lands here and is only printed

    def work() -> None:
        SlowToDie()  # freed at once: its finalizer runs in this thread
        spin(5.0)

    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        call_with_timeout(work, 0.05)
    assert time.perf_counter() - started < 1.5


TRACED = """
import cProfile, sys, time
from glm5_lsp.deadline import call_with_timeout

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

profiler = cProfile.Profile()
if sys.argv[1] == "profile":
    profiler.enable()
else:
    sys.settrace(lambda *args: None)
stopped = 0
for attempt in range(5):
    try:
        call_with_timeout(lambda: spin(5.0), 0.02)
    except TimeoutError:
        stopped += 1
    spin(0.01)  # a stop left behind would surface here
print("stopped", stopped)
"""


@pytest.mark.parametrize("tracer", ["settrace", "profile"])
def test_a_stop_under_a_tracer_or_profiler_returns(tracer: str) -> None:
    """Under ``sys.settrace`` (debuggers, coverage) or ``cProfile`` the first stopped call used to
    hang the thread for good: a stop landed between a lock's acquisition and its ``with`` block, and
    withdrawing one with a NULL exception left CPython re-running a function's first instruction."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", TRACED, tracer], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["stopped", "5"]


def test_no_thread_for_the_watchdog_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """``can't start new thread`` (a process at its limit) reaches the caller; nothing waits for a
    watchdog that never ran."""
    import threading
    import types

    from glm5_lsp import deadline

    class NoThread:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(deadline, "threading", types.SimpleNamespace(Thread=NoThread, get_ident=threading.get_ident))
    outcome: list[BaseException | int] = []

    def ask() -> None:
        try:
            outcome.append(deadline.call_with_timeout(lambda: 1, 1.0))
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            outcome.append(error)

    helper = threading.Thread(target=ask, daemon=True)
    helper.start()
    helper.join(5.0)
    assert not helper.is_alive(), "call_with_timeout waited for a watchdog that never started"
    assert isinstance(outcome[0], RuntimeError)
