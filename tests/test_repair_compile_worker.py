"""Python's compiler in a helper process: the same answers as in-process, and a helper that hangs,
dies or fails costs one check (named in the error), never the next one."""

from __future__ import annotations

import io
import json
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

from glm5_lsp.checks.providers import DiagnosticRunner, PythonCompileProvider, default_providers
from glm5_lsp.checks.providers.compile_worker import CompileWorker, serve, worker_available

pytestmark = pytest.mark.skipif(not worker_available(), reason="the helper needs select() on pipes (POSIX)")

TEXTS = [
    "x = 1\n",
    "def f(:\n    pass\n",
    "def f():\n    await g()\n",  # the compiler proper, not the parser, rejects this
    "s = 'caf\u00e9'\nt = (\n",  # non-ASCII text, an unclosed bracket at the end
    "class A:\n    def m(self):\n        return 1\n  x = 2\n",
    "a\0b\n",
    "s = '\ud800'\n",  # a lone surrogate, as an editor's UTF-16 can send
]


@pytest.fixture
def worker() -> CompileWorker:
    made = CompileWorker(timeout_s=10.0)
    yield made
    made.close()


def test_the_helper_answers_as_the_in_process_compiler(worker: CompileWorker) -> None:
    in_process = PythonCompileProvider()
    for text in TEXTS:
        assert worker.diagnose(text, "<t.py>") == in_process.diagnose(text, "t.py", "python"), text
    assert worker.started == 1


def test_the_helper_keeps_its_incremental_state_across_requests(worker: CompileWorker) -> None:
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")
    lines = text.split("\n")
    in_process = PythonCompileProvider()
    for i in (100, 101, 250, 300):
        edited = "\n".join(lines[:i] + ["    x = (", *lines[i:]])
        assert worker.diagnose(edited, "<textwrap.py>") == in_process.diagnose(edited, "textwrap.py", "python")
    assert worker.started == 1


def test_a_hanging_helper_is_killed_and_the_next_check_starts_another() -> None:
    worker = CompileWorker(timeout_s=0.3)
    real = worker.argv
    worker.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(TimeoutError, match="no answer within 0.3s"):
        worker.diagnose("x = 1\n", "<t>")
    worker.argv = real
    worker.timeout_s = 10.0
    assert worker.diagnose("x = (\n", "<t>")[0].message == "'(' was never closed"
    assert worker.started == 2
    worker.close()


def test_a_helper_that_dies_is_named_with_its_exit_status_and_replaced() -> None:
    worker = CompileWorker(timeout_s=10.0)
    real = worker.argv
    worker.argv = [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"compile helper stopped \(exit status 3\)"):
        worker.diagnose("x = 1\n", "<t>")
    worker.argv = real
    assert worker.diagnose("x = 1\n", "<t>") == []
    worker.close()


def test_a_failure_inside_the_helper_is_answered_and_the_helper_goes_on() -> None:
    requests = io.BytesIO(b'{"text": 1, "filename": "<t>"}\nnot json\n{"text": "x = (\\n", "filename": "<t>"}\n')
    answers = io.BytesIO()
    serve(4, requests, answers)
    first, second, third = (json.loads(line) for line in answers.getvalue().splitlines())
    assert first["error"].startswith("TypeError") and second["error"].startswith("JSONDecodeError")
    assert third["diagnostics"][0][4] == "'(' was never closed"


def test_a_failure_reported_by_the_helper_is_raised_with_its_words() -> None:
    worker = CompileWorker(timeout_s=10.0)
    worker.argv = [sys.executable, "-c", "import sys\nfor _ in sys.stdin: print('{\"error\": \"MemoryError: boom\"}', flush=True)"]
    with pytest.raises(RuntimeError, match="compile helper failed: MemoryError: boom"):
        worker.diagnose("x = 1\n", "<t>")
    worker.close()


def test_the_runner_skips_a_hanging_helper_and_keeps_the_other_findings() -> None:
    provider = PythonCompileProvider(in_worker=True, timeout_s=0.3)
    assert provider.worker is not None
    provider.worker.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    others = [p for p in default_providers("python", use_external=False) if p.name != "compile"]
    report = DiagnosticRunner([provider, *others], timeout_s=5.0, recent=None).diagnose("x = undefined_name\n", "t.py", "python")
    assert report.skipped and report.skipped[0].startswith("compile: TimeoutError")
    assert any("undefined_name" in d.message for d in report.diagnostics)
    provider.worker.close()


def test_python_checks_compile_in_the_helper_by_default_started_at_once() -> None:
    (compiler,) = [p for p in default_providers("python") if p.name == "compile"]
    assert isinstance(compiler, PythonCompileProvider) and compiler.worker is not None
    assert compiler.worker.started == 1  # the helper comes up while the rest is set up
    compiler.diagnose("x = 1\n", "t.py", "python")
    assert compiler.worker.started == 1
    compiler.worker.close()


def test_a_helper_that_never_answers_leaves_the_compile_check_in_process(caplog: pytest.LogCaptureFixture) -> None:
    provider = PythonCompileProvider(in_worker=True)
    assert provider.worker is not None
    provider.worker.argv = [sys.executable, "-c", "raise SystemExit(1)"]  # as if it could not import us
    found = provider.diagnose("x = (\n", "t.py", "python")
    assert found[0].message == "'(' was never closed" and provider.worker is None
    assert "compiled in-process from now on" in caplog.text


def test_a_helper_that_answered_before_is_restarted_not_given_up() -> None:
    provider = PythonCompileProvider(in_worker=True)
    worker = provider.worker
    assert worker is not None and provider.diagnose("x = 1\n", "t.py", "python") == []
    real = worker.argv
    worker.close()
    worker.argv = [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="exit status 3"):
        provider.diagnose("x = 2\n", "t.py", "python")
    worker.argv = real
    assert provider.worker is worker and provider.diagnose("x = (\n", "t.py", "python")
    worker.close()


def test_a_submitted_check_holds_the_helper_until_its_answer_is_read(worker: CompileWorker) -> None:
    answer = worker.submit("x = (\n", "<a.py>")
    other: list[list] = []
    waiting = threading.Thread(target=lambda: other.append(worker.diagnose("y = 1\n", "<b.py>")))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # the helper's next answer is the first check's: the second waits its turn
    assert answer()[0].message == "'(' was never closed"
    waiting.join(10)
    assert other == [[]] and answer() == answer()  # read once; the answer kept
    assert worker.started == 1


def test_a_submitted_check_that_times_out_lets_go_of_the_helper() -> None:
    worker = CompileWorker(timeout_s=0.3)
    real = worker.argv
    worker.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    answer = worker.submit("x = 1\n", "<t>")
    with pytest.raises(TimeoutError, match="no answer within 0.3s"):
        answer()
    with pytest.raises(TimeoutError):  # asked again: the same failure, not a second release
        answer()
    worker.argv = real
    worker.timeout_s = 10.0
    assert worker.diagnose("x = (\n", "<t>")[0].message == "'(' was never closed"  # not locked out
    worker.close()


def test_a_changed_text_is_sent_as_its_edit_and_answered_as_the_whole(worker: CompileWorker) -> None:
    import random

    rng = random.Random(3)
    sent: list[bytes] = []
    in_process = PythonCompileProvider()
    text = "def f(x):\n    s = '\U0001F600 caf\u00e9'\n    return x + 1\n\nprint(f(2))\n"
    pieces = ["(", ")", "\n", "    y = s\n", "\U0001F600", "'", ":", "", "\ud800"]
    assert worker.diagnose(text, "<e.py>") == in_process.diagnose(text, "e.py", "python")
    real = worker._running

    def running():
        process = real()
        write = process.stdin.write
        process.stdin.write = lambda data: sent.append(data) or write(data)
        return process
    worker._running = running
    for _ in range(60):
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.choice([0, 0, 1, 3, 12]))
        text = text[:start] + rng.choice(pieces) + text[end:]
        assert worker.diagnose(text, "<e.py>") == in_process.diagnose(text, "e.py", "python"), text
    assert all(b'"edit"' in request and len(request) < 150 for request in sent)  # never the whole text again
    assert worker.started == 1


def test_after_a_failure_the_next_request_carries_the_whole_text() -> None:
    sink = io.BytesIO()
    requests = [{"edit": [0, 0, "x"], "filename": "<a>"}, {"text": "y = (\n", "filename": "<a>"},
                {"edit": [4, 5, "1"], "filename": "<a>"}]
    serve(4, io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in requests)), sink)
    first, second, third = (json.loads(line) for line in sink.getvalue().splitlines())
    assert first["error"].startswith("ValueError: an edit before any text")
    assert second["diagnostics"][0][4] == "'(' was never closed" and third == {"diagnostics": []}
