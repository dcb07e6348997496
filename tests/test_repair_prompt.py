"""The repair prompt: where the hint block goes, how spans move, which document lines get
``error_context`` (before the cursor, after it, and not when the prompt does not show them)."""

from __future__ import annotations

from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.repair.repair_prompt import HEADER, RepairContext, build_repair_prompt, hint_lines
from glm5_lsp.spans import Prompt, Span

DOCUMENT = "import os\n\nclass A:\n    def f(self):\n        return \n\nx = A()\n"
CURSOR = DOCUMENT.index("return ") + len("return ")


def diag(line: int, message: str = "problem") -> Diagnostic:
    return Diagnostic(line, 0, line, 1, message, "error", "pyflakes", "X")


def where(candidate: str = "1") -> RepairContext:
    return RepairContext(DOCUMENT, CURSOR, CURSOR, candidate, "python")


def marked(prompt: Prompt) -> list[str]:
    return [prompt.text()[s.start:s.end] for s in prompt.spans if s.role == "error_context"]


def test_block_is_indented_like_the_cursor_line_and_placed_before_it() -> None:
    prompt = Prompt(DOCUMENT[:CURSOR], DOCUMENT[CURSOR:])
    new = build_repair_prompt(prompt, ["error (x) line 5: bad"], [], where())
    block = f"        # {HEADER}\n        # error (x) line 5: bad\n"
    assert new.prefix == DOCUMENT[:DOCUMENT.index("        return")] + block + "        return "
    assert new.suffix == prompt.suffix
    assert marked(new) == [block]


def test_lines_before_and_after_the_candidate_are_marked() -> None:
    prompt = Prompt(DOCUMENT[:CURSOR], DOCUMENT[CURSOR:])
    new = build_repair_prompt(prompt, ["h"], [diag(0), diag(6)], where())
    texts = marked(new)
    assert "import os" in texts and "x = A()" in texts


def test_lines_the_prompt_does_not_show_are_not_marked() -> None:
    shown_from = DOCUMENT.index("class A")
    prompt = Prompt(DOCUMENT[shown_from:CURSOR], "\n")  # prefix cut above, suffix cut short
    new = build_repair_prompt(prompt, ["h"], [diag(0), diag(6)], where())
    assert len(marked(new)) == 1  # only the hint block


def test_a_multi_line_candidate_maps_suffix_lines_back() -> None:
    prompt = Prompt(DOCUMENT[:CURSOR], DOCUMENT[CURSOR:])
    candidate = "1\n        y = 2\n        z = 3"  # two extra lines: x = A() is line 8 of the spliced text
    new = build_repair_prompt(prompt, ["h"], [diag(8)], where(candidate))
    assert "x = A()" in marked(new)


def test_spans_keep_covering_their_text() -> None:
    start = DOCUMENT.index("class A")
    spans = [Span(0, 9, "api_doc"), Span(start, CURSOR, "current_block"), Span(CURSOR, CURSOR + 3, "code")]
    prompt = Prompt(DOCUMENT[:CURSOR], DOCUMENT[CURSOR:], spans)
    new = build_repair_prompt(prompt, ["h"], [], where())
    api, block, after, _error = new.spans
    assert new.text()[api.start:api.end] == "import os"
    assert new.text()[block.start:block.end].startswith("class A:") and new.text()[:block.end].endswith("return ")
    assert new.text()[after.start:after.end] == prompt.text()[CURSOR:CURSOR + 3]


def test_hint_lines_dedupe_and_cap() -> None:
    text = "a = b\nc = d\n"
    diagnostics = [diag(0, "undefined b"), diag(0, "undefined b"), diag(1, "undefined d"), diag(1, "other")]
    assert hint_lines(diagnostics, text, 2) == ["error (pyflakes) line 1: undefined b: `a = b`",
                                                "error (pyflakes) line 2: undefined d: `c = d`"]


def test_brace_languages_use_double_slash() -> None:
    code = "int f() {\n  return \n}\n"
    at = code.index("return ") + 7
    new = build_repair_prompt(Prompt(code[:at], code[at:]), ["h"], [],
                              RepairContext(code, at, at, "x", "c"))
    assert "  // h\n" in new.prefix


def test_blank_cursor_line_takes_the_indentation_of_the_code_around() -> None:
    code = "def f(x):\n    y = 1\n\n    return y\n"
    at = code.index("\n\n") + 1  # the blank line
    new = build_repair_prompt(Prompt(code[:at], code[at:]), ["h"], [], RepairContext(code, at, at, "", "python"))
    assert new.prefix.endswith("    # h\n")
    tail = "def f(x):\n    '''Doc.'''\n"  # no suffix: the previous line's indentation
    new = build_repair_prompt(Prompt(tail), ["h"], [], RepairContext(tail, len(tail), len(tail), "", "python"))
    assert new.prefix.endswith("    # h\n")
