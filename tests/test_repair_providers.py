"""Diagnostic providers, table-driven over ``tests/data/repair/provider_cases.json``, and the runner's
handling of providers that crash or hang (acceptance 3)."""

from __future__ import annotations

import json
import logging
import shutil
import textwrap
import threading
import time
from pathlib import Path

import pytest

from glm5_lsp.checks.providers import (
    DiagnosticRunner,
    GccProvider,
    GoVetProvider,
    NodeCheckProvider,
    PyflakesProvider,
    PythonCompileProvider,
    RuffProvider,
    TreeSitterProvider,
    default_providers,
)
from glm5_lsp.checks.providers.compile_worker import worker_available
from glm5_lsp.checks.providers.pyflakes import severity_of
from glm5_lsp.diagnostics import Diagnostic

CASES = json.loads((Path(__file__).parent / "data" / "repair" / "provider_cases.json").read_text())
TOOLS = {"ruff": "ruff", "gcc": "gcc", "g++": "g++", "node": "node", "go vet": "go"}


def make_provider(name: str, language: str):
    if name in TOOLS and shutil.which(TOOLS[name]) is None:
        pytest.skip(f"{TOOLS[name]} is not installed")
    return {
        "compile": PythonCompileProvider, "tree-sitter": TreeSitterProvider, "pyflakes": PyflakesProvider,
        "ruff": RuffProvider, "gcc": lambda: GccProvider("c"), "g++": lambda: GccProvider("cpp"),
        "node": NodeCheckProvider, "go vet": GoVetProvider,
    }[name]()


@pytest.mark.parametrize("case", CASES, ids=[f"{c['provider']}-{c['language']}-{i}" for i, c in enumerate(CASES)])
def test_provider_reports_expected_lines_codes_and_severities(case: dict) -> None:
    provider = make_provider(case["provider"], case["language"])
    found = sorted(provider.diagnose(case["text"], "", case["language"]), key=lambda d: (d.line, d.col))
    assert len(found) == len(case["expect"]), found
    for diag, (line, code, severity) in zip(found, case["expect"]):
        assert diag.line == line, diag
        assert code == "*" or diag.code == code, diag
        assert diag.severity == severity, diag
        assert diag.source == provider.name
        assert diag.message
        lines = case["text"].split("\n")
        assert 0 <= diag.col <= len(lines[diag.line])


def test_positions_are_character_columns_not_bytes() -> None:
    text = 's = "ééé" + \n'
    (diag,) = PythonCompileProvider().diagnose(text, "", "python")
    assert diag.line == 0 and diag.col <= len(text.split("\n")[0])
    (ts_diag, *_) = TreeSitterProvider().diagnose('s = "ééé" + )\n', "", "python")
    assert ts_diag.col == len('s = "ééé" + ') or ts_diag.col < len('s = "ééé" + )')


def test_pyflakes_checks_the_head_of_a_file_that_does_not_parse() -> None:
    text = "def f():\n    return nope\n\nvalues = [1,\n"
    found = PyflakesProvider().diagnose(text, "", "python")
    assert [(d.line, d.code) for d in found] == [(1, "UndefinedName")]
    # a name used above the broken line and defined below it is not reported
    text = "def f():\n    return later()\n\nvalues = [1,\ndef later(): pass\n"
    assert PyflakesProvider().diagnose(text, "", "python") == []


def test_pyflakes_severity_mapping() -> None:
    assert severity_of("UndefinedName") == "error"
    assert severity_of("UnusedImport") == "warning"
    assert severity_of("UnusedVariable") == "info"
    assert severity_of("SomethingNewInPyflakes") == "warning"


def test_hint_names_line_message_and_offending_text() -> None:
    text = "def f():\n    return nope\n"
    (diag,) = PyflakesProvider().diagnose(text, "", "python")
    assert diag.hint(text) == "error (pyflakes) line 2: undefined name 'nope': `return nope`"


def test_diagnostic_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        Diagnostic(0, 0, 0, 0, "m", severity="fatal")
    with pytest.raises(ValueError):
        Diagnostic(3, 0, 2, 0, "m")


def test_default_providers_by_language() -> None:
    names = {p.name for p in default_providers("python", use_external=False)}
    assert names == {"compile", "pyflakes", "tree-sitter"}
    with_external = {p.name for p in default_providers("python")}
    if shutil.which("ruff") is not None:  # ruff's F rules stand in for pyflakes, its parser for tree-sitter
        assert with_external == {"compile", "ruff"}
    else:
        assert with_external == names
    assert {p.name for p in default_providers("rust")} == {"tree-sitter"}
    assert default_providers("cobol") == []


class Crashing:
    name = "crashing"
    languages = frozenset({"python"})

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        raise RuntimeError("checker exploded")


class Hanging:
    name = "hanging"
    languages = frozenset({"python"})

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        time.sleep(5)
        return [Diagnostic(0, 0, 0, 0, "too late")]


def test_runner_skips_crashing_and_hanging_providers_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    runner = DiagnosticRunner([Crashing(), Hanging(), PyflakesProvider()], timeout_s=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        report = runner.diagnose("x = nope\n", "a.py", "python")
    assert time.monotonic() - started < 2.0
    assert [d.code for d in report.diagnostics] == ["UndefinedName"]
    assert report.skipped[0].startswith("crashing: RuntimeError: checker exploded")
    assert report.skipped[1].startswith("hanging: timed out")
    assert "crashing skipped" in caplog.text and "hanging skipped" in caplog.text


def test_subprocess_provider_timeout_is_a_skip() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed")
    runner = DiagnosticRunner([RuffProvider(timeout_s=0.000001)], timeout_s=5)
    report = runner.diagnose("x = 1\n", "a.py", "python")
    assert report.diagnostics == [] and "TimeoutExpired" in report.skipped[0]


def test_runner_ignores_providers_for_other_languages() -> None:
    runner = DiagnosticRunner([Crashing()], timeout_s=1)
    assert runner.diagnose("x", "a.rs", "rust").skipped == []


class Sleeping:
    languages = frozenset({"python"})

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        time.sleep(self.seconds)
        return [Diagnostic(0, 0, 0, 1, self.name)]


def test_providers_run_at_once_and_report_in_order() -> None:
    runner = DiagnosticRunner([Sleeping("first", 0.4), Sleeping("second", 0.4), Sleeping("third", 0.4)], timeout_s=5)
    started = time.monotonic()
    report = runner.diagnose("x = 1\n", "a.py", "python")
    assert time.monotonic() - started < 1.0  # one after another would take 1.2 s
    assert [d.message for d in report.diagnostics] == ["first", "second", "third"]


class Bounded(Sleeping):
    """A checker that stops itself within ``bounded_s`` (as one asking a helper process does)."""

    def __init__(self, name: str, seconds: float, bounded_s: float | None, fails: bool = False) -> None:
        super().__init__(name, seconds)
        self.bounded_s, self.fails, self.threads = bounded_s, fails, []

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        self.threads.append(threading.get_ident())
        if self.fails:
            raise OSError("the helper went away")
        return super().diagnose(text, path, language)


def test_a_checker_that_stops_itself_in_time_runs_in_the_calling_thread() -> None:
    here, hung, late, failing = (Bounded("here", 0.0, 0.2), Bounded("hung", 5.0, None), Bounded("late", 0.0, 9.0),
                                 Bounded("failing", 0.0, 0.5, fails=True))
    runner = DiagnosticRunner([hung, here, late, failing], timeout_s=0.5)
    started = time.monotonic()
    report = runner.diagnose("x = 1\n", "a.py", "python")
    assert time.monotonic() - started < 2.0  # the unbounded one still runs on a thread it abandons
    me = threading.get_ident()
    assert here.threads == [me] and failing.threads == [me]
    assert hung.threads != [me] and late.threads != [me]  # no bound, or one past the runner's limit
    assert [d.message for d in report.diagnostics] == ["here", "late"]
    assert report.skipped[0].startswith("hung: timed out") and report.skipped[1] == "failing: OSError: the helper went away"


class Submitting(Bounded):
    """A bounded checker that can send its check off (``submit``) before anyone waits for the answer."""

    def __init__(self, name: str, events: list[str], fails_at: str = "") -> None:
        super().__init__(name, 0.0, 1.0)
        self.events, self.fails_at = events, fails_at

    def submit(self, text: str, path: str, language: str):
        self.events.append(f"send {self.name}")
        if self.fails_at == "send":
            raise RuntimeError("the helper is gone")

        def answer() -> list[Diagnostic]:
            self.events.append(f"answer {self.name}")
            if self.fails_at == "answer":
                raise TimeoutError("no answer")
            return [Diagnostic(0, 0, 0, 1, self.name)]
        return answer


def test_helpers_get_every_check_before_any_answer_is_read() -> None:
    events: list[str] = []
    plain = Bounded("plain", 0.0, 1.0)
    runner = DiagnosticRunner([Submitting("compile", events), plain, Submitting("ruff", events)], timeout_s=5)
    plain.diagnose = lambda *args: events.append("plain here") or [Diagnostic(0, 0, 0, 1, "plain")]
    report = runner.diagnose("x = 1\n", "a.py", "python")
    # both helpers work at once (each in its own process) while the calling thread runs the rest
    assert events == ["send compile", "send ruff", "plain here", "answer compile", "answer ruff"]
    assert [d.message for d in report.diagnostics] == ["compile", "plain", "ruff"] and not report.skipped


def test_a_helper_failing_to_take_or_answer_a_check_is_skipped_alone() -> None:
    events: list[str] = []
    runner = DiagnosticRunner([Submitting("a", events, fails_at="send"), Submitting("b", events),
                               Submitting("c", events, fails_at="answer")], timeout_s=5, recent=None)
    report = runner.diagnose("x = 1\n", "a.py", "python")
    assert [d.message for d in report.diagnostics] == ["b"]
    assert report.skipped == ["a: RuntimeError: the helper is gone", "c: TimeoutError: no answer"]
    assert events == ["send a", "send b", "send c", "answer b", "answer c"]  # a sent nothing to wait for


def test_the_shipped_python_helpers_answer_submitted_checks_as_they_diagnose() -> None:
    from glm5_lsp.checks.providers import default_runner

    providers = default_runner("python").providers
    assert [p.name for p in providers if hasattr(p, "submit")] == ["compile", "ruff"]
    texts = ["import os\nx = undefined_name\n", "def f(:\n    pass\n", "y = 1\n"]
    for text in texts:
        answers = [p.submit(text, "s.py", "python") for p in providers]  # both sent, then both read
        assert [a() for a in answers] == [p.diagnose(text, "s.py", "python") for p in providers]
    assert any(p.diagnose(texts[0], "s.py", "python") for p in providers)


def test_the_shipped_python_checkers_stop_themselves() -> None:
    from glm5_lsp.checks.providers import default_runner

    runner = default_runner("python")
    bounded = {p.name: runner.bounded(p) for p in runner.providers}
    assert bounded["compile"] is (worker_available())  # the helper process; in-process there is no bound
    if "ruff" in bounded:
        assert bounded["ruff"]


@pytest.mark.parametrize("language, source", [
    ("python", Path(textwrap.__file__).read_text()),  # a real module, valid
    ("python", Path(textwrap.__file__).read_text().replace("def dedent(text):", "def dedent(text:", 1)),  # broken
    ("javascript", (Path(__file__).parent / "data" / "context" / "ws" / "web" / "app.js").read_text() * 3),
], ids=["python", "python-broken", "javascript"])
def test_tree_sitter_reparses_incrementally_with_the_same_findings(language: str, source: str) -> None:
    """The provider re-parses a text from a recent tree; its findings equal a fresh parse's on random edits."""
    import random

    warm, fresh = TreeSitterProvider(), TreeSitterProvider(recent_trees=0)
    assert warm.diagnose(source, "", language) == fresh.diagnose(source, "", language)
    rng = random.Random(7)
    pieces = ["(", ")", "x = ", "def f(:\n", "\n    return 1\n", "'''", "if x", "]", "a.b(", "\n", "'", "{", "}", "é"]
    for _ in range(60):
        i = rng.randrange(len(source))
        j = min(len(source), i + rng.choice([0, 0, 1, 7, 40]))
        edited = source[:i] + rng.choice(pieces) * rng.choice([1, 2]) + source[j:]
        assert warm.diagnose(edited, "", language) == fresh.diagnose(edited, "", language), (i, j)
    assert warm.trees.incremental >= 55  # nearly every check started from an earlier tree


def test_tree_sitter_reparses_two_far_edits_exactly() -> None:
    """With one tree kept, each text is two edits from the last (one restored, one made far away):
    the tree parsed from the last one through both edits equals a fresh parse."""
    import random

    from tree_sitter import Parser

    from glm5_lsp.context.trees import RecentTrees
    from glm5_lsp.languages import tree_sitter_language

    source = Path(textwrap.__file__).read_text()
    parser = Parser(tree_sitter_language("python"))
    trees = RecentTrees(1)
    rng = random.Random(3)
    pieces = ["(", "x = ", "def f(:\n", '"""', "if x", "a.b(", "\n", "é"]
    for _ in range(40):
        i = rng.randrange(len(source))
        edited = (source[:i] + rng.choice(pieces) + source[i + rng.choice([0, 1, 7]):]).encode("utf-8")
        assert str(trees.parse(parser, "python", edited).root_node) == str(parser.parse(edited).root_node), i
    assert trees.incremental >= 35


def test_common_prefix_and_suffix() -> None:
    from glm5_lsp.textdiff import common_prefix, common_suffix

    assert common_prefix(b"abcdef", b"abcxef") == 3
    assert common_prefix(b"", b"abc") == 0
    assert common_prefix(b"abc", b"abc") == 3
    assert common_suffix(b"abcdef", b"abcxef", 6 - 3) == 2
    assert common_suffix(b"aaa", b"aaaa", 3 - 3) == 0  # bounded: never overlaps the common prefix
    assert common_suffix(b"xab", b"yab", 3) == 2
    assert common_suffix("héllo", "jéllo", 9) == 4  # str too


class _Counting:
    """A provider that counts its calls and may be told to fail."""

    name = "counting"
    languages = frozenset({"python"})

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("broken")
        return [Diagnostic(0, 0, 0, 1, f"len {len(text)}", "warning", self.name, "C")]


def test_a_text_checked_again_by_the_same_providers_is_answered_from_memory() -> None:
    from glm5_lsp.lru import LRUCache

    provider = _Counting()
    recent: LRUCache[tuple[Diagnostic, ...]] = LRUCache(2)
    first = DiagnosticRunner([provider], timeout_s=5, recent=recent)
    second = DiagnosticRunner([provider], timeout_s=1, recent=recent)  # other settings, same providers
    assert first.diagnose("a = 1\n", "a.py", "python").diagnostics[0].message == "len 6"
    assert second.diagnose("a = 1\n", "a.py", "python").diagnostics[0].message == "len 6"
    assert provider.calls == 1 and recent.hits == 1
    first.diagnose("a = 1\n", "b.py", "python")  # another path is another check
    first.diagnose("a = 22\n", "a.py", "python")
    assert provider.calls == 3
    first.diagnose("a = 1\n", "a.py", "python")  # pushed out of a memory of two
    assert provider.calls == 4
    other = _Counting()
    DiagnosticRunner([other], recent=recent).diagnose("a = 22\n", "a.py", "python")
    assert other.calls == 1  # other providers: their own check


def test_a_report_with_a_skipped_provider_is_not_remembered() -> None:
    from glm5_lsp.lru import LRUCache

    provider = _Counting()
    provider.fail = True
    runner = DiagnosticRunner([provider], timeout_s=5, recent=LRUCache(16))
    assert runner.diagnose("x\n", "a.py", "python").skipped
    provider.fail = False
    assert not runner.diagnose("x\n", "a.py", "python").skipped
    assert provider.calls == 2


def test_default_runners_share_their_providers() -> None:
    from glm5_lsp.checks.providers import default_runner

    loop_runner, server_runner = default_runner("python", 10.0), default_runner("python", 5.0)
    assert all(a is b for a, b in zip(loop_runner.providers, server_runner.providers, strict=True))


def test_compile_positions_come_from_the_text_not_the_file_on_disk(tmp_path: Path) -> None:
    """CPython reads a syntax error's line from the named file when it exists; the checked text
    (unsaved edits, a spliced candidate) differs from it, and the column must be the text's."""
    saved = tmp_path / "mod.py"
    saved.write_text("try:\n    pass\nexcept IndexError:\n    raise\n", encoding="utf-8")
    edited = "try:\n    pass\nexcept InterruptedError\n    raise\n"
    found = PythonCompileProvider().diagnose(edited, str(saved), "python")
    assert [(d.line, d.col, d.message) for d in found] == [(2, len("except InterruptedError"), "expected ':'")]
