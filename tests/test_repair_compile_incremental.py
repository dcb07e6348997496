"""The compile provider checks a text from the recent one it differs from by one edit; its answer must be
exactly the full compile's (``glm5_lsp/checks/providers/compile.py``): random edits of
standard-library modules, the hard cases one by one, concurrency, and the speed it exists for."""

from __future__ import annotations

import random
import re
import sysconfig
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from glm5_lsp.checks.providers import PythonCompileProvider
from glm5_lsp.checks.providers.compile import RecentCompiles, compile_diagnostics
from glm5_lsp.diagnostics import Diagnostic

STDLIB = Path(sysconfig.get_paths()["stdlib"])

# What a completion or a half-typed line splices in: brackets and quotes left open, line continuations,
# statements that are only valid somewhere else, indentation changes, clauses and decorators on their
# own, and declarations that reach across statements.
SNIPPETS = [
    "(", ")", "[", "]", "{", '"""', "'''", "'", '"', "\\\n", "\\", ":", "    ", "  ", "\t", "\tpass\n", "\f",
    "return", "return 1\n", "yield", "await x", "break", "continue", "nonlocal x", "global x",
    "def f(:", "def g():\n", "    def g(self):\n", "class Q:\n", "\nclass Q:\n", "lambda", " = ", "x :=",
    "*", "**", "#", "async ", "f'{", "if x:\n", "\nx = 1\n", "\n    y = 2\n", "\n        z = 3\n",
    "\n  w = 4\n", "x = 1\n", "\n    pass\n", "else:\n", "\nelse:\n", "    else:\n", "except:\n",
    "    finally:\n", "@dec\n", "    @dec\n", "x = (\n", "])\n", '"""\n', "'\n", "\n", "\n\n",
    "from __future__ import annotations\n", "_glm5_lsp_segment_end_ = 0\n",
]


def random_edit(rng: random.Random, text: str, starts: list[int]) -> str:
    """Delete a span, insert a snippet, or replace a span with one or two; often where a definition
    begins, where the text's segments meet."""
    if starts and rng.random() < 0.4:
        position = min(len(text), max(0, rng.choice(starts) + rng.randint(-3, 6)))
    else:
        position = rng.randrange(len(text) + 1)
    if rng.random() < 0.3:
        position = text.rfind("\n", 0, position) + 1
    kind = rng.random()
    if kind < 0.25:
        return text[:position] + text[position + rng.choice([1, 2, 5, 20, 80, 300, 2000]):]
    if kind < 0.85:
        return text[:position] + rng.choice(SNIPPETS) + text[position:]
    return text[:position] + rng.choice(SNIPPETS) + rng.choice(SNIPPETS) + text[position + rng.randrange(1, 60):]


def tab_indented(text: str) -> str:
    return re.sub(r"(?m)^((?:    )+)", lambda match: "\t" * (len(match.group(1)) // 4), text)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::SyntaxWarning")  # from edited strings
@pytest.mark.parametrize(("module", "variant", "edits"), [
    ("argparse.py", "as is", 110), ("textwrap.py", "as is", 110), ("json/decoder.py", "as is", 110),
    ("textwrap.py", "tab-indented", 60),
])
def test_random_edits_give_exactly_the_full_compile_diagnostics(module: str, variant: str, edits: int) -> None:
    path = str(STDLIB / module)
    original = Path(path).read_text()
    original = tab_indented(original) if variant == "tab-indented" else original
    # The finest cuts there are: every member of every class, so every boundary gets edited.
    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    assert recent.diagnose(original, path) == compile_diagnostics(original, path) == []
    starts = [m.start() + 1 for m in re.finditer(r"\n[ \t]*(?:@|def |class |async def )", original)]
    rng = random.Random(f"{module} {variant}")
    text, errors = original, 0
    for case in range(edits):
        base = text if rng.random() < 0.6 else original
        recent.diagnose(base, path)  # as the runner checks a document before its candidates
        candidate = random_edit(rng, base, starts)
        expected = compile_diagnostics(candidate, path)
        assert recent.diagnose(candidate, path) == expected, f"case {case}"
        errors += bool(expected)
        if rng.random() < 0.35:
            text = candidate  # later edits build on this one
    assert recent.incremental >= 0.9 * edits  # checked from an earlier text, not afresh
    assert 0.3 * edits < errors < 0.95 * edits  # both outcomes are exercised


MODULE = textwrap.dedent('''\
    """Books on a shelf."""

    import os

    LIMIT = 10


    def helper(values):
        total = 0
        for value in values:
            total += value
        return total


    class Shelf:
        """Holds books."""

        def __init__(self, books):
            self.books = list(books)

        def count(self):
            return len(self.books)

        @property
        def first(self):
            return self.books[0]

        def titles(self):
            return [book.title for book in self.books]


    if os.name == "nt":
        SEPARATOR = "\\\\"
    else:
        SEPARATOR = "/"


    def last(shelf):
        return shelf.books[-1]
''')


def edited(text: str, after: str, insert: str, remove: int = 0) -> str:
    """``text`` with ``insert`` put after the first ``after`` (replacing ``remove`` characters)."""
    at = text.index(after) + len(after)
    return text[:at] + insert + text[at + remove:]


def check_in_turn(*texts: str) -> list[Diagnostic]:
    """Check :data:`MODULE`, then each text from the one before; every answer must be the full compile's,
    and every one after the first found from an earlier text (or, for edits far apart, cut afresh
    with the unchanged segments' statuses remembered). Returns the last text's diagnostics."""
    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    for text in (MODULE, *texts):
        found = recent.diagnose(text, "shelf.py")
        assert found == compile_diagnostics(text, "shelf.py"), text
    assert recent.incremental + recent.recut == len(texts)
    return found


def test_the_module_is_cut_into_statements_and_class_members() -> None:
    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    assert recent.diagnose(MODULE, "shelf.py") == []
    (entry,) = recent.entries
    assert entry.layout.lines == [1, 8, 15, 18, 21, 24, 28, 38]  # helper, Shelf, its members, last


@pytest.mark.parametrize("text", [
    edited(MODULE, "return len(self.books", " or 0"),  # inside a member
    MODULE.replace("\n\nclass Shelf", "\n\nSHELVES = 3\n\nclass Shelf"),  # whole lines before a class
])
def test_an_edit_recompiles_only_the_segment_it_touches(text: str) -> None:
    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    recent.diagnose(MODULE, "shelf.py")
    assert recent.diagnose(text, "shelf.py") == []
    before, after = (entry.layout.segments for entry in recent.entries)
    assert len(after) == len(before)
    assert sum(old is not new for old, new in zip(before, after)) == 1


@pytest.mark.parametrize(("name", "texts", "message", "line"), [
    ("an unclosed bracket inside the edited method",
     [edited(MODULE, "return len(self.books", "((")], "'(' was never closed", 21),
    ("an unterminated triple-quoted string, found at the end of the file",
     [edited(MODULE, "def count(self):\n", '        """Count\n')],
     "unterminated triple-quoted string literal (detected at line 40)", 21),
    ("an error before the edit stays the answer",
     [edited(MODULE, "total = 0", " = 0"), edited(edited(MODULE, "total = 0", " = 0"), "book.title", "s")],
     "cannot assign to literal", 8),
    ("an error after the edit stays the answer",
     [edited(MODULE, "shelf.books[-1]", ")"), edited(edited(MODULE, "shelf.books[-1]", ")"), "LIMIT = 1", "2")],
     "unmatched ')'", 38),
    ("a line dedented out of the class ends it; the next member is indented too far",
     [edited(MODULE, "return len(self.books)\n", "x = 1\n")], "unexpected indent", 24),
    ("an indentation that does not match any outer level",
     [edited(MODULE, "return len(self.books)\n", "  x = 1\n")],
     "unindent does not match any outer indentation level", 22),
    ("a tab among spaces", [edited(MODULE, "def count(self):\n", "\tx = 1\n")],
     "inconsistent use of tabs and spaces in indentation", 21),
    ("a compiler error in a member", [edited(MODULE, "def count(self):\n", "        break\n")],
     "'break' outside loop", 21),
    ("a compiler error at module level", [edited(MODULE, "LIMIT = 10\n", "return LIMIT\n")],
     "'return' outside function", 5),
    ("a symbol-table error later beats a code-generation error earlier",
     [edited(edited(MODULE, "def count(self):\n", "        break\n"), "def titles(self):\n", "        nonlocal q\n")],
     "no binding for nonlocal 'q' found", 29),
    ("a tokenizer error anywhere after a syntax error replaces it",
     [edited(edited(MODULE, "def count(self):\n", "        x = = 1\n"), "def last(shelf):\n", "    s = 'abc\n")],
     "unterminated string literal (detected at line 40)", 39),
])
def test_hard_cases_give_the_full_compile_answer(name: str, texts: list[str], message: str, line: int) -> None:
    (diagnostic,) = check_in_turn(*texts)
    assert (diagnostic.message, diagnostic.line) == (message, line)


def test_an_edit_that_fixes_the_only_error() -> None:
    broken = edited(MODULE, "return len(self.books", "(")
    assert check_in_turn(broken, edited(broken, "return len(self.books(", ")")) == []


def test_a_clause_that_continues_the_statement_before_its_segment() -> None:
    # ``else:`` where ``def last`` began belongs to the ``if`` in the segment before: the text compiles.
    without_else = MODULE.replace('else:\n    SEPARATOR = "/"\n', "")
    clause_first = without_else.replace("def last(shelf):", 'else:\n    SEPARATOR = "/"\n\n\ndef last(shelf):')
    assert check_in_turn(without_else, clause_first) == []


def test_a_decorator_typed_at_the_end_of_one_member_applies_to_the_next() -> None:
    assert check_in_turn(edited(MODULE, "return len(self.books)\n", "\n    @staticmethod")) == []


def test_declarations_that_reach_across_statements() -> None:
    # A module-level global in one segment, the assignment it comes after in another.
    (diagnostic,) = check_in_turn(MODULE + "global LIMIT\n")
    assert diagnostic.message == "name 'LIMIT' is assigned to before global declaration"
    # A future import anywhere but the top is an error; at the top, its feature applies everywhere.
    late = edited(MODULE, "def last(shelf):\n", "    from __future__ import annotations\n")
    assert check_in_turn(late)[0].message == "from __future__ imports must occur at the beginning of the file"
    future = "from __future__ import annotations\n" + MODULE
    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    annotated = future.replace("def count(self):", "def count(self) -> (size := 1):")
    for text in (future, annotated):
        assert recent.diagnose(text, "shelf.py") == compile_diagnostics(text, "shelf.py")
    assert recent.incremental == 1
    assert recent.diagnose(annotated, "shelf.py")[0].message == "'named expression' can not be used within an annotation"


def test_concurrent_checks_of_a_document_and_its_candidates_agree_with_full_compiles() -> None:
    path = str(STDLIB / "argparse.py")
    document = Path(path).read_text()
    at = re.search(r"(?m)^    def format_help\(self\):\n", document).end()
    texts = [document] + [document[:at] + f"        candidate{i} = ({i}\n" * (i % 2) + document[at:]
                          for i in range(12)]
    provider = PythonCompileProvider()
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda text: provider.diagnose(text, path, "python"), texts * 2))
    assert found == [compile_diagnostics(text, path) for text in texts * 2]


def test_a_one_line_edit_inside_a_method_is_checked_at_least_3x_faster_than_a_full_compile() -> None:
    path = str(STDLIB / "argparse.py")
    document = Path(path).read_text()
    at = re.search(r"(?m)^    def format_help\(self\):\n", document).end()
    candidates = [document[:at] + f"        probe = {i}\n" + document[at:] for i in range(9)]
    provider = PythonCompileProvider()
    assert provider.diagnose(document, path, "python") == []  # the document: seen once, cut up once
    incremental, full = [], []
    for candidate in candidates:  # interleaved, so both meet the same load
        start = time.perf_counter()
        assert provider.diagnose(candidate, path, "python") == []
        incremental.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert compile_diagnostics(candidate, path) == []
        full.append(time.perf_counter() - start)
    assert 3 * min(incremental) < min(full), (min(incremental), min(full))


def test_edits_far_apart_recompile_only_the_segments_they_touch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text one edit away from an earlier one is checked from it; a text with edits far apart (the
    editor's cursor jumped: the old line restored, a new one cut) is cut afresh, and every segment
    it shares with a recent text keeps its remembered status: only the edited ones are compiled."""
    import glm5_lsp.checks.providers.compile as module

    recent = RecentCompiles(min_lines=0, class_lines=0, segment_lines=0)
    recent.diagnose(MODULE, "shelf.py")
    computed: list[str] = []
    original = module._compute_status

    def counting(source: str, *args: object) -> object:
        computed.append(source)
        return original(source, *args)

    monkeypatch.setattr(module, "_compute_status", counting)
    far_apart = edited(edited(MODULE, "def count(self):\n", "        x = 1\n"), "def last(shelf):\n", "    s = 1\n")
    assert recent.diagnose(far_apart, "shelf.py") == compile_diagnostics(far_apart, "shelf.py") == []
    assert recent.recut == 1
    assert len(computed) == 2, computed  # the two edited segments, nothing else
