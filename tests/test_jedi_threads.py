"""jedi is asked by one thread at a time (``pynames.jedi.exclusive``): it is not thread-safe, and the
server asks it from the model worker (the decoding monitor), the editor's requests and a file's
warm-up. Three real threads asking for completions after ``os.`` and the like at once failed 1 to 5
times in 36 with ``ValueError`` from parso's tree, and the monitor, reading a failure as "nothing to
check", let any name through (seen once in the full suite: ``os.`` followed by ``L``)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from glm5_lsp.pipeline import names as pipeline_names
from glm5_lsp.pynames import jedi as pynames_jedi
from glm5_lsp.repair.exceptions import _resolves
from glm5_lsp.repair.monitor import JediAttributes


@pytest.fixture
def overlapping_jedi(monkeypatch):
    """A stand-in jedi whose every call takes a few milliseconds and counts how many run at once."""
    state = {"now": 0, "most": 0, "calls": 0}
    guard = threading.Lock()

    def busy() -> None:
        with guard:
            state["now"] += 1
            state["calls"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.003)
        with guard:
            state["now"] -= 1

    class Script:
        def __init__(self, code=None, path=None, environment=None, project=None):
            busy()

        def complete(self, line, column):
            busy()
            return [SimpleNamespace(name="path", type="module", description="path")]

        def infer(self, line, column):
            busy()
            return []

        def get_names(self):
            busy()
            return []

    monkeypatch.setattr(pynames_jedi, "_jedi", lambda: SimpleNamespace(Script=Script))
    monkeypatch.setattr(pynames_jedi, "in_process_environment", lambda: None)
    monkeypatch.setattr(pynames_jedi, "_MEMBERS", {})
    return state


def test_lookups_from_several_threads_never_overlap(overlapping_jedi) -> None:
    code = "import os\nos."
    askers = [
        lambda i: JediAttributes()(code),  # the decoding monitor
        lambda i: pipeline_names._jedi_names(code, len(code), None),  # the editor's list
        lambda i: pynames_jedi.module_members(f"module{i}"),  # the fixer's module attributes, a warm-up
        lambda i: _resolves("import os", "os.sep"),  # the exception filler
    ]
    errors: list[BaseException] = []

    def run(k: int, asker) -> None:
        try:
            for i in range(6):
                asker(100 * k + i)  # (a module name of its own each time: module_members keeps its answers)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(k, asker)) for k, asker in enumerate(askers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert overlapping_jedi["calls"] >= 4 * 6 * 2
    assert overlapping_jedi["most"] == 1


def test_a_stopped_lookup_is_not_held_off_by_another_threads(overlapping_jedi) -> None:
    """The wait for jedi polls: a lookup under ``call_with_timeout`` is stopped on time while another
    thread holds jedi (a blocking acquire would hold the stop off until that thread let go)."""
    from glm5_lsp.deadline import call_with_timeout

    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with pynames_jedi.exclusive():
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        call_with_timeout(lambda: JediAttributes()("import os\nos."), 0.05)
    waited = time.perf_counter() - started
    release.set()
    thread.join()
    assert waited < 1.0
