"""The workspace's lines (``glm5_lsp.memory.lines``): how the project's other lines go on from the
typed one, kept up to date line by line as documents change."""

from __future__ import annotations

import random

from glm5_lsp.memory.lines import RESORT_AFTER, LineIndex


def test_the_most_frequent_rest_wins_and_indentation_is_ignored() -> None:
    index = LineIndex()
    index.set("a.py", "import os\nfrom .compat import text\n    from .compat import text\n")
    index.set("b.py", "def f():\n    from .compat import bytes_\n")
    guess = index.guess("        from .comp")
    assert guess is not None and guess.rest == "at import text"
    assert (guess.count, guess.total, guess.distinct) == (2, 3, 2)
    assert index.guess("from .compat import ").rest == "text"  # a typed trailing space is kept
    assert index.guess("class ") is None and index.guess("   ") is None
    assert index.guess("import os") is None  # nothing goes on past it


def test_the_line_being_written_is_not_its_own_answer() -> None:
    index = LineIndex()
    index.set("a.py", "x = compute(1)\n")
    index.set("b.py", "y = 2\nx = compute(2)\n")
    # b.py's cursor is on "x = compute(2)": its own line is not counted, a.py's is
    assert index.guess("x = comp", key="b.py", line="x = compute(2)").rest == "ute(1)"
    assert index.guess("x = comp", key="c.py", line="x = compute(2)").rest in {"ute(1)", "ute(2)"}


def test_the_documents_own_lines_come_first_and_the_workspaces_break_their_ties() -> None:
    index = LineIndex()
    index.set("lib.py", "return total(items, 0.5)\n" * 3)
    index.set("doc.py", "return total(items, 0.25)\nreturn total(items, 1)\nreturn total(items, 0.5)\nreturn to\n")
    guess = index.guess("return to", key="doc.py", line="return to")
    # the document says each once: the workspace's three lines break the tie
    assert guess.rest == "tal(items, 0.5)" and (guess.count, guess.total, guess.distinct) == (4, 6, 3)
    index.set("doc.py", "return total(items, 0.25)\nreturn total(items, 0.25)\nreturn to\n")
    guess = index.guess("return to", key="doc.py", line="return to")
    assert guess.rest == "tal(items, 0.25)" and (guess.count, guess.total) == (2, 5)  # the workspace's counts
    assert index.guess("return to").rest == "tal(items, 0.5)"  # no document: the workspace's
    index.set("doc.py", "return total(items, 0.25)\n")  # its only such line is the one being written
    assert index.guess("return to", key="doc.py", line="return total(items, 0.25)").rest == "tal(items, 0.5)"


def test_edits_renames_and_removals_keep_the_counts_exact() -> None:
    index = LineIndex()
    index.set("a.py", "return foo(1)\nreturn foo(2)\nreturn foo(2)\n")
    assert index.guess("return f").rest == "oo(2)"
    index.set("a.py", "return foo(1)\nreturn foo(1)\nreturn foo(2)\n")  # one line changed
    assert index.guess("return f").rest == "oo(1)"
    index.rename("a.py", "b.py")
    assert "b.py" in index and "a.py" not in index
    assert index.remove("b.py") and not index.remove("b.py")
    assert index.guess("return f") is None


def test_many_edits_agree_with_counting_from_scratch() -> None:
    rng = random.Random(0)
    words = ["self.value = value", "return self", "import os", "import sys", "x = 1", "x = 2", "pass"]
    index, texts = LineIndex(), {}
    for step in range(3 * RESORT_AFTER):  # enough new lines for the sorted list to be rebuilt
        key = f"f{rng.randrange(5)}.py"
        lines = [rng.choice(words) + (f" # {step}" if rng.random() < 0.5 else "") for _ in range(rng.randrange(6))]
        texts[key] = "\n".join(lines)
        index.set(key, texts[key])
        if step % 97 == 0:
            for typed in ("x = ", "import ", "self.", "return"):
                expected = {}
                for text in texts.values():
                    for line in text.split("\n"):
                        if line.startswith(typed) and line[len(typed):].rstrip():
                            rest = line[len(typed):].rstrip()
                            expected[rest] = expected.get(rest, 0) + 1
                guess = index.guess(typed)
                if not expected:
                    assert guess is None
                    continue
                best = max(expected.values())
                assert guess is not None and guess.count == best and expected[guess.rest] == best
                assert guess.total == sum(expected.values()) and guess.distinct == len(expected)
