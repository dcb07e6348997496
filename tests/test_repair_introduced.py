""""Introduced only": a candidate is judged spliced into its document, table-driven over
``tests/data/repair/introduced_cases.json`` (``<CURSOR>`` marks an insertion, ``<SELECT>...</SELECT>``
a replaced range)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm5_lsp.checks.introduced import LineIndex, Splice, introduced_diagnostics, judge
from glm5_lsp.checks.providers import DiagnosticRunner, default_providers
from glm5_lsp.diagnostics import Diagnostic

CASES = json.loads((Path(__file__).parent / "data" / "repair" / "introduced_cases.json").read_text())
RUNNER = DiagnosticRunner(default_providers("python", use_external=False), timeout_s=10)


def parse_case(document: str, candidate: str) -> Splice:
    if "<CURSOR>" in document:
        at = document.index("<CURSOR>")
        return Splice(document.replace("<CURSOR>", ""), at, at, candidate)
    start = document.index("<SELECT>")
    plain = document.replace("<SELECT>", "")
    end = plain.index("</SELECT>")
    return Splice(plain.replace("</SELECT>", ""), start, end, candidate)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_introduced_cases(case: dict) -> None:
    splice = parse_case(case["document"], case["candidate"])
    verdict = judge(splice, RUNNER, "case.py", "python")
    assert sorted(f"{d.source}:{d.code}" for d in verdict.introduced) == sorted(case["introduced"]), verdict


def diag(line: int, col: int, message: str = "undefined name 'z'", code: str = "UndefinedName") -> Diagnostic:
    return Diagnostic(line, col, line, col + 1, message, "error", "pyflakes", code)


def test_positions_shift_by_lines_and_columns() -> None:
    document = "a = z\nb = z\n"
    splice = Splice(document, 6, 6, "q = 1\nr = 2\n")  # two lines inserted before line 1
    before = [diag(0, 4), diag(1, 4)]
    assert introduced_diagnostics(before, [diag(0, 4), diag(3, 4)], splice) == []
    # the same key but at a position that is inside the candidate is new
    assert introduced_diagnostics(before, [diag(0, 4), diag(3, 4), diag(1, 4)], splice) == [diag(1, 4)]


def test_a_moved_problem_outside_the_candidate_matches_only_once() -> None:
    document = "x = (1,\n\nz\n"
    splice = Splice(document, 8, 8, "y = 2\n")  # the candidate is line 1 of the spliced text
    eof = "'(' was never closed"
    before = [diag(0, 4, eof, "SyntaxError")]
    outside, inside = diag(3, 0, eof, "SyntaxError"), diag(1, 0, eof, "SyntaxError")
    # the copy outside the candidate is the old problem reported elsewhere; the one inside is new
    assert introduced_diagnostics(before, [outside, inside], splice) == [inside]
    assert introduced_diagnostics(before, [inside], splice) == [inside]


def test_line_numbers_in_messages_do_not_break_matching() -> None:
    a = Diagnostic(5, 0, 5, 6, "redefinition of unused 'os' from line 1", "warning", "pyflakes", "RedefinedWhileUnused")
    b = Diagnostic(7, 0, 7, 6, "redefinition of unused 'os' from line 3", "warning", "pyflakes", "RedefinedWhileUnused")
    splice = Splice("\n" * 10, 0, 0, "\n\n")
    assert introduced_diagnostics([a], [b], splice) == []


def test_splice_validation_and_mapping() -> None:
    with pytest.raises(ValueError):
        Splice("abc", 2, 1, "x")
    splice = Splice("abcdef", 2, 4, "XYZW")
    assert splice.apply() == "abXYZWef"
    assert splice.map_offset(1) == 1 and splice.map_offset(3) is None and splice.map_offset(4) == 6
    assert splice.covers(2) and splice.covers(5) and not splice.covers(6)
    index = LineIndex("ab\ncd\n")
    assert index.position(index.offset(1, 1)) == (1, 1)
    assert index.offset(9, 0) == 6


def test_failing_provider_on_one_side_does_not_invent_diagnostics() -> None:
    class FailsOnSecondCall:
        name = "flaky"
        languages = frozenset({"python"})
        calls = 0

        def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
            self.calls += 1
            if self.calls == 1:
                return [Diagnostic(0, 0, 0, 1, "old problem", "error", "flaky", "X")]
            raise RuntimeError("broken")

    runner = DiagnosticRunner([FailsOnSecondCall()], timeout_s=5)
    verdict = judge(Splice("x = 1\n", 0, 0, "y = 2\n"), runner, "a.py", "python")
    assert verdict.introduced == [] and verdict.before == [] and verdict.skipped


def test_provider_skipped_on_the_document_is_ignored_on_the_candidate() -> None:
    class FailsFirst:
        name = "flaky"
        languages = frozenset({"python"})

        def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
            return [Diagnostic(0, 0, 0, 1, "something", "error", "flaky", "X")]

    runner = DiagnosticRunner([FailsFirst()], timeout_s=5)
    verdict = judge(Splice("x = 1\n", 0, 0, "y = 2\n"), runner, "a.py", "python", before=[],
                    before_skipped=["flaky: timed out after 5s"])
    assert verdict.introduced == [] and verdict.skipped == ["flaky: timed out after 5s"]


def test_a_problem_at_the_typed_word_that_stays_at_its_start_is_not_new() -> None:
    """The user typed ``help=he`` inside a call (the comma still to come): a candidate that rewrites
    the word (``help``) keeps the document's "forgot a comma?" where it was, which is not new; one
    that breaks the line further (``help)``) adds problems."""
    document = "def f(help, metavar):\n    return dict(\n        help=he\n        metavar=metavar)\n"
    start = document.index("he\n")
    assert judge(Splice(document, start, start + 2, "help"), RUNNER, "a.py", "python").introduced == []
    assert judge(Splice(document, start, start + 2, "help)"), RUNNER, "a.py", "python").introduced
    assert Splice(document, start, start + 2, "help").map_offset(start) == start
    assert Splice(document, start, start, "help").map_offset(start) == start + 4  # an insertion pushes it on


@pytest.mark.parametrize(("document", "candidate", "blocking"), [
    ("def f(xs):\n    for x in <CURSOR>\n", "xs:", False),  # the end of the file: the body comes next
    ("def f(xs):\n    for x in <CURSOR>\n    return 1\n", "xs:", False),  # typed above code, as deep
    ("def f(xs):\n    for x in <CURSOR>\n", "ys:", True),  # the header itself is still checked
    ("def f(xs):\n    for x in <CURSOR>\n        y = x\n", "xs:", False),  # its body is there already
    ("def f(xs):\n    x = <CURSOR>\n", "{1:", True),  # an open bracket, not a header
    ("import os\n\ndef mul(a, <CURSOR>\n", "b):", False),
    ("def f(xs):\n    for x in <CURSOR>\n", "xs:\n        pass", False),
])
def test_a_header_the_candidate_ends_may_wait_for_its_body(document: str, candidate: str, blocking: bool) -> None:
    verdict = judge(parse_case(document, candidate), RUNNER, "case.py", "python")
    assert bool(verdict.blocking()) == blocking, verdict.introduced
