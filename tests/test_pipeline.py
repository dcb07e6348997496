"""The shared pipeline: post-processing, the repair loop wiring, and the three request kinds.

The backend is the scripted double of ``tests/data/batch/scripted_backend.py``: what is under test
here is what the pipeline does with the model's text, not the model.
"""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path

import pytest

from glm5_lsp import postprocess as pp
from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.pipeline import (
    UNHURRIED_LOOKUP_S,
    FixRegion,
    Pipeline,
    PipelineSettings,
    fix_region,
    keeps_enough,
    wants_multiline,
    working_lines,
)
from glm5_lsp.pipeline.core import plain_prompt
from glm5_lsp.postprocess import cut_at_block_end, strip_special_tokens, strip_suffix_overlap
from glm5_lsp.repair.loop import RepairSettings, RepairTarget
from glm5_lsp.repair.monitor import MonitorSettings
from glm5_lsp.spans import Prompt

_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)


@pytest.mark.parametrize("raw, expected", [
    ("a = 1<|endoftext|>b = 2", "a = 1"),
    ("x<|code_middle|>y", "x"),
    ("<|code_suffix|>", ""),
    ("ok<|unknown_special|> then", "ok then"),
    ("no specials", "no specials"),
    ("a<fim_middle>b", "a"),  # other tokenizers' FIM spellings end it too
    ("a<|fim_suffix|>b", "a"),
    ("done<|end_of_turn|>more", "done"),
])
def test_special_tokens_never_leak(raw: str, expected: str) -> None:
    assert strip_special_tokens(raw) == expected


@pytest.mark.parametrize("text, suffix, expected", [
    ("a, b)", ")\n", "a, b"),  # re-typed closer
    ("bar()", ")\n", "bar()"),  # balanced: its own ")" stays
    ("x]):", "]):\nfoo", "x"),
    ("b = 2\n    return a", "\n    return a\n", "b = 2"),  # runs into the next line
    ("b = 2", "\n    return a\n", "b = 2"),
    ('"all " + "done")', '"done")\n', '"all " + '),  # re-types the whole rest of the line
    ("values))", "))\n", "values"),
    ('hello"', '"\n', "hello"),  # an auto-closed quote
    ("f(x);", ";\n", "f(x)"),
    ("(a))", "))\n", "(a)"),  # never leaves a bracket of its own open
    ("x = ')'", ")\n", "x = ')'"),  # a closer inside a string is not a closer
    ("a + 1", "\n", "a + 1"),
    ("y = 1\nz = 2", "z = 2\n", "y = 1"),  # cursor at a line start: the first suffix line is a line
])
def test_suffix_repeats_are_stripped(text: str, suffix: str, expected: str) -> None:
    at_line_start = suffix.startswith("z = 2")
    assert strip_suffix_overlap(text, suffix, at_line_start) == expected


@pytest.mark.parametrize("prefix, text, expected", [
    ("def f(x):\n    ", "if x:\n        return 1\n    return 2\ndef g():\n    pass", "if x:\n        return 1\n    return 2"),
    ("def f(x):\n", "    y = x\n\n    return y\n\nprint(f(1))", "    y = x\n\n    return y"),
    ("class A:\n    def m(self):\n        ", "return 1\n    def n(self):", "return 1"),
])
def test_multiline_stops_at_the_end_of_the_block(prefix: str, text: str, expected: str) -> None:
    assert cut_at_block_end(text, prefix, "python") == expected


@pytest.mark.parametrize("language, text, expected", [
    ("javascript", "if (x) { y(); }\n  return 1;\n}\nfunction g() {}", "if (x) { y(); }\n  return 1;"),
    ("javascript", 'let s = "}";\n  return s;\n}\nfunction g() {}', 'let s = "}";\n  return s;'),  # in a string
    ("go", "x := 1 // }\n  return x\n}\nfunc g() {}", "x := 1 // }\n  return x"),  # in a comment
    ("tsx", "return <div/>;\n}\nexport const b = 1;", "return <div/>;"),
])
def test_brace_languages_stop_at_the_closing_brace(language: str, text: str, expected: str) -> None:
    assert cut_at_block_end(text, "function f() {\n  ", language) == expected


@pytest.mark.parametrize("text, language, expected", [
    ('f("(", x', "python", ["("]),
    ("f(a # (\n", "python", ["("]),  # a comment's bracket does not count
    ("x = a // (b", "python", ["("]),  # floor division, not a comment
    ("x = a // (b", "javascript", []),
    ("g(/* ( */ a", "c", ["("]),
    ('s = """ ( """ + [', "python", ["["]),
    ("it's (", "python", []),  # an unterminated one-line string ends at the line end, not after
    ("it's\n(", "python", ["("]),
    ("[1, (2]", None, []),  # a mismatched closer unwinds to its opener, closing both
])
def test_the_bracket_scanner_skips_strings_and_comments(text: str, language: str | None, expected: list[str]) -> None:
    assert pp.open_brackets(text, language) == expected
    assert pp.bracket_depth(text, language) == sum(1 if c in "([{" else -1 for _, c in pp.code_chars(text, language)
                                                   if c in "()[]{}")


@pytest.mark.parametrize("text, language, expected", [
    ("x = foo.", "python", True),
    ('x = "foo.', "python", False),  # inside a string
    ('x = "a" + b.', "python", True),  # the string closed
    ("x = 1  # see foo.", "python", False),  # inside a comment
    ('s = """doc\nmore foo.', "python", False),  # a triple-quoted string spans lines
    ("it's\nfoo.", "python", True),  # a one-quote string ends at its line's end
    ("x = a // foo.", "python", True),  # floor division, not a comment
    ("x = a // foo.", "javascript", False),
    ("/* open\nfoo.", "c", False),
    ("/* closed */ foo.", "c", True),
])
def test_the_scanner_tells_where_a_text_ends(text: str, language: str, expected: bool) -> None:
    assert pp.ends_in_code(text, language) is expected


# ---- the regex bracket scanner against the character scanner ----------------------------------


def _reference_open_brackets(text: str, language: str | None) -> list[str]:
    """open_brackets as it was, over code_chars: the reference the regex scanner must equal."""
    stack: list[str] = []
    for _, ch in pp.code_chars(text, language):
        if ch in pp.OPENERS:
            stack.append(ch)
        elif ch in pp.CLOSERS:
            if stack and stack[-1] == pp.CLOSERS[ch]:
                stack.pop()
            elif pp.CLOSERS[ch] in stack:
                while stack and stack.pop() != pp.CLOSERS[ch]:
                    pass
    return stack


def _reference_own_open(text: str, language: str | None) -> int:
    own = 0
    for _, ch in pp.code_chars(text, language):
        if ch in pp.OPENERS:
            own += 1
        elif ch in pp.CLOSERS and own:
            own -= 1
    return own


def _reference_brackets(text: str, language: str | None) -> list[tuple[int, str]]:
    return [(at, ch) for at, ch in pp.code_chars(text, language) if ch in "()[]{}"]


def _reference_ends_in_code(text: str, language: str | None) -> bool:
    scanner = pp._scan(text, language)
    while True:
        try:
            next(scanner)
        except StopIteration as done:
            return done.value == "code"


def _check_against_the_scanner(text: str, language: str | None) -> None:
    brackets = _reference_brackets(text, language)
    where = f"{text!r} ({language})"
    assert list(pp._brackets(text, language)) == brackets, where
    assert pp.open_brackets(text, language) == _reference_open_brackets(text, language), where
    assert pp.bracket_depth(text, language) == sum(1 if ch in "([{" else -1 for _, ch in brackets), where
    assert pp._own_open(text, language) == _reference_own_open(text, language), where
    assert pp.ends_in_code(text, language) is _reference_ends_in_code(text, language), where


# Every language the scanner tells apart: unknown, each "#" language, "//" languages, one not named.
_SCANNER_LANGUAGES = [None, "python", "javascript", "c", "go", "rust", "typescript", "lua",
                      *sorted(set(pp.LINE_COMMENTS) - {"python"})]
# Single characters and fragments that open, close or escape strings and comments.
_TRICKY = ['"', "'", "`", "\\", "\n", "#", "/", "*", "(", ")", "[", "]", "{", "}", " ", "a", "b", "x",
           '"""', "'''", "```", "/*", "*/", "//", 'r"', "\\\n", '\\"', "\\'", "  ", "\n    "]


@pytest.mark.parametrize("language", _SCANNER_LANGUAGES)
def test_postprocess_bracket_regex_equals_the_character_scanner(language: str | None) -> None:
    """Random texts rich in quotes, escapes, comment markers and brackets: the regex bracket
    functions and ends_in_code give exactly what the character scanner gives."""
    rng = random.Random(f"brackets-{language}")
    for _ in range(2000):
        pieces = rng.choices(_TRICKY, k=rng.randint(0, 200))
        text = "".join(pieces)[: rng.randint(0, 200)]
        _check_against_the_scanner(text, language)


@pytest.mark.parametrize("text, language, expected", [
    ('x = f(1, """ ( [', "python", ["("]),  # an unterminated triple string runs to the end
    ("s = ''' ( '' ", None, []),
    ('f("a\\', "python", ["("]),  # an escape at the very end, inside a string
    ("f(a\\", "python", ["("]),  # ... and in code
    ('f("#", (', "python", ["(", "("]),  # a "#" inside a string starts no comment
    ("f(a // (b", "python", ["(", "("]),  # "//" in Python: floor division, not a comment
    ("f(a // (b", None, ["("]),  # both markers when the language is unknown
    ("g(/* ( */ a", "c", ["("]),
    ("g(/* ( */ a", None, ["(", "("]),  # "/*" comments only in a known "//" language
    ("g(/* ( a", "c", ["("]),  # an unclosed block comment runs to the end
    ("g(/*/ ( */", "go", ["("]),  # "/*/" does not close itself
    ("`(` + [", "javascript", ["["]),
    ("f('a\\\n(', [", "python", ["(", "["]),  # an escaped line end stays in the string
    ("f('a\n(', [", "python", ["(", "("]),  # an unescaped one ends it (and the next quote opens one)
])
def test_postprocess_bracket_regex_explicit_cases(text: str, language: str | None, expected: list[str]) -> None:
    _check_against_the_scanner(text, language)
    assert pp.open_brackets(text, language) == expected


@pytest.mark.parametrize("text, prefix, language, expected", [
    ("max(len(a), len(b)", "x = ", "python", "max(len(a), len(b))"),
    ("return 1)]", "def f():\n    ", "python", "return 1"),
    ("second)", "call(first,\n     ", "python", "second)"),
    ("f(a)  # see (note", "x = ", "python", "f(a)  # see (note"),  # brackets in a comment are not closed
    ('"(" + t', "s = ", "python", '"(" + t'),
])
def test_brackets_are_balanced(text: str, prefix: str, language: str, expected: str) -> None:
    assert pp.balance_brackets(text, prefix, language) == expected


@pytest.mark.parametrize("text, prefix, suffix, expected", [
    # the call goes on below: its message on the next line, its closer on the one after
    ("raise ValueError(", "    if not m:\n        ", '\n            f"bad {m}"\n        )\n', "raise ValueError("),
    # ... an argument of an enclosing call: both closers below, the completion's first
    ("**compat_kw(", "g(\n    x,\n    ", "\n        a=1,\n    ),\n)\n", "**compat_kw("),
    # the code below closes only the enclosing call: the completion's own bracket is closed here
    ("f(1, 2", "x = [\n    1,\n    ", "\n]\n", "f(1, 2)"),
    ("raise ValueError(", "    if not m:\n        ", "\n    return m\n", "raise ValueError()"),
    # a closer of another kind below, or a bracket the code below opens and closes, proves nothing
    ("f(", "items = {\n    'a': ", "\n}\n", "f()"),
    ("f(", "    ", "\n    g(1)\n", "f()"),
    ("f([1", "    ", "\n    ])\n", "f([1"),
])
def test_brackets_the_code_below_closes_stay_open(text: str, prefix: str, suffix: str, expected: str) -> None:
    assert pp.balance_brackets(text, prefix, "python", suffix) == expected
    assert pp.tidy(text, prefix, suffix, multiline=False, language="python") == expected


@pytest.mark.parametrize("text, prefix, suffix, expected", [
    ("eps),", "def f(n, steps):\n    size = int(n / st", "\n    return size\n", "eps)"),  # not a tuple
    ("ne,", "def f(a,\n      error: Exception | No", "\n):\n", "ne,"),  # an argument list goes on below
    ("a,", "x = f(\n    ", "\n    b)\n", "a,"),
    ("lue,", "d[k] = va", " b\n", "lue,"),  # the rest of the line follows the comma
    ("# a, b,", "x = 1  ", "\n", "# a, b,"),  # in a comment
])
def test_a_python_line_does_not_end_with_a_comma_outside_brackets(text: str, prefix: str, suffix: str,
                                                                   expected: str) -> None:
    assert pp.tidy(text, prefix, suffix, multiline=False, language="python") == expected


def test_an_entry_of_a_long_literal_keeps_its_comma() -> None:
    """The literal's opening brace lies further back than the bracket scan's usual window."""
    table = "TABLE = {\n" + "".join(f"    'key{i}': {i},\n" for i in range(600)) + "    'key600': "
    assert len(table) > 2 * pp._SCAN_CHARS
    assert pp.tidy("600,", table, "\n}\n", multiline=False, language="python") == "600,"


def test_only_python_lines_lose_a_comma_outside_brackets() -> None:
    prefix, suffix = "function f(n, steps) {\n    size = Math.floor(n / st", "\n}\n"
    assert pp.tidy("eps),", prefix, suffix, multiline=False, language="javascript") == "eps),"


def test_the_pipeline_applies_the_shared_rules() -> None:
    backend = scripted.ScriptedBackend(" max(len(a), len(b)<|endoftext|>junk")
    document = "a = b = [1]\nx = \n"
    result = Pipeline(backend).complete(document, len("a = b = [1]\nx = "))
    assert result.text == "max(len(a), len(b))" and result.clean


def test_multiline_is_inferred_from_the_cursor_line() -> None:
    """One policy for every front end (``pipeline.wants_multiline``): a fresh block body is several lines."""
    assert wants_multiline("def f():\n    \n", len("def f():\n    "), "python")
    assert not wants_multiline("x = \n", len("x = "), "python")
    assert not wants_multiline("    return x\n", len("    "), "python")


def test_a_cursor_after_code_that_opens_no_block_is_one_line_without_a_parse(monkeypatch) -> None:
    """The editor asks this before every inline request: mid-line (nothing after the cursor), the
    answer is one line whether or not the cursor is in a string, so no parse is needed (it cost 0.7-1.9
    ms on the server's event loop for a 1,200-2,600-line file). Where a parse is needed, the answers
    are those of the rule read in full order (parse first), at every line end of a real module."""
    import inspect
    import textwrap as module

    from glm5_lsp.context import syntax

    source = inspect.getsource(module)
    ends = [i for i, ch in enumerate(source) if ch == "\n"]

    def full_order(text: str, offset: int) -> bool:  # the rule as written before the shortcut
        start, end = syntax._line_bounds(text, offset)
        before, after = text[start:offset], text[offset:end]
        if after.strip():
            return False
        parsed = syntax._Source(text)
        tree = syntax._TREES.parse(syntax.parser_for("python"), "python", parsed.data)
        if syntax._inside_string_or_comment(tree, parsed.byte(offset)):
            return False
        if before.strip():
            return syntax._opens_block(before, "python")
        previous = text[:start].rstrip("\n").rsplit("\n", 1)[-1] if start else ""
        return syntax._opens_block(previous, "python") or any(
            body.start <= offset <= body.end for body in syntax.empty_bodies(text, "python"))

    answers = [wants_multiline(source, end, "python") for end in ends]
    assert answers == [full_order(source, end) for end in ends] and any(answers)

    def no_parse(*args):
        raise AssertionError("parsed")
    monkeypatch.setattr(syntax._TREES, "parse", no_parse)
    in_string = 's = """\nx = f(a, \n"""\n'
    assert not wants_multiline(in_string, in_string.index(", \n") + 2, "python")
    assert not wants_multiline("    language = r.language if r is not No\n", 39, "python")


def test_plain_prompt_windows_and_marks_the_current_block() -> None:
    text = "import os\n\n" + "x = 1\n" * 50 + "def f(a):\n    b = a\n    return b\n" + "y = 2\n" * 50
    offset = text.index("    return b")
    prompt = plain_prompt(text, offset, max_prefix_chars=60, max_suffix_chars=40)
    assert prompt.prefix.endswith("def f(a):\n    b = a\n") and prompt.prefix.startswith("x = 1")
    assert prompt.suffix.startswith("    return b\n") and len(prompt.suffix) <= 40 and prompt.suffix.endswith("\n")
    block = [span for span in prompt.spans if span.role == "current_block"]
    assert len(block) == 1 and prompt.text()[block[0].start:block[0].end] == "def f(a):\n    b = a\n"


def test_single_line_completion_stops_at_the_line_end() -> None:
    backend = scripted.ScriptedBackend("len(items)\nprint('more')\n")
    result = Pipeline(backend).complete("items = [1]\nn = ", len("items = [1]\nn = "))
    assert result.text == "len(items)" and result.clean and backend.requests[0].stop == ["\n"]


def test_multiline_generation_is_cut_short_once_the_block_ends() -> None:
    body = "if x:\n        return 1\n    return 2\n" + "def unrelated():\n    pass\n" * 20
    backend = scripted.ScriptedBackend(body)
    document = "def f(x):\n    \n"
    result = Pipeline(backend).complete(document, len("def f(x):\n    "))
    assert result.text == "if x:\n        return 1\n    return 2"
    assert result.finish_reason == "stop" and result.completion_tokens < len(body) // 8  # cancelled early


def test_a_candidate_that_adds_an_error_is_regenerated() -> None:
    answers = iter(["undefined_thing + 1", "count + 1"])
    backend = scripted.ScriptedBackend(lambda request: next(answers))
    result = Pipeline(backend).complete("count = 1\ntotal = ", len("count = 1\ntotal = "))
    assert result.text == "count + 1" and result.clean and result.rounds == 2
    assert "undefined_thing" in backend.requests[1].prompt.text()  # the hint names the problem
    assert any(span.role == "error_context" for span in backend.requests[1].prompt.spans)


def test_unclean_results_are_withheld_unless_asked_for() -> None:
    settings = PipelineSettings(repair=RepairSettings(max_rounds=2))
    result = Pipeline(scripted.ScriptedBackend("nope_undefined"), settings).complete("x = ", 4)
    assert result.text == "" and not result.clean and result.rounds == 2
    settings.repair.return_unclean = True
    result = Pipeline(scripted.ScriptedBackend("nope_undefined"), settings).complete("x = ", 4)
    assert result.text == "nope_undefined" and not result.clean
    assert [d["message"] for d in result.diagnostics_after] and result.diagnostics_after[0]["line"] == 0


def test_generate_continues_a_signature_and_answers_an_instruction() -> None:
    backend = scripted.ScriptedBackend("    return a + b\n\n\ndef other():\n    pass\n")
    result = Pipeline(backend).generate('def add(a, b):\n    """Sum."""\n')
    assert result.text == "    return a + b" and result.clean
    backend = scripted.ScriptedBackend("def rev(s):\n    return s[::-1]\n")
    result = Pipeline(backend).generate("Write a function that reverses a string.")
    assert backend.requests[0].prompt.prefix == "# Write a function that reverses a string.\n"
    assert result.text == "def rev(s):\n    return s[::-1]\n"


def test_fix_rewrites_the_first_body_and_keeps_the_rest() -> None:
    code = "def half(x):\n    return x / 2 +\n\n\ndef keep():\n    return 1\n"
    backend = scripted.ScriptedBackend("    return x / 2\n")
    result = Pipeline(backend).fix(code)
    assert result.text == "def half(x):\n    return x / 2\n\n\ndef keep():\n    return 1\n"
    assert result.diagnostics_before and result.diagnostics_after == [] and result.clean
    prompt = backend.requests[0].prompt
    assert "# line 2: " in prompt.prefix and prompt.prefix.endswith("# Fixed version:\ndef half(x):\n")
    error = [prompt.text()[s.start:s.end] for s in prompt.spans if s.role == "error_context"]
    assert error == ["    return x / 2 +"]


def test_fix_returns_the_input_when_nothing_better_is_found() -> None:
    code = "def f():\n    return undefined_a\n"
    result = Pipeline(scripted.ScriptedBackend("    return undefined_b\n"),
                      PipelineSettings(repair=RepairSettings(max_rounds=1))).fix(code)
    assert result.text == code and not result.clean


def test_cancellation_and_streaming() -> None:
    pieces: list[str] = []
    result = Pipeline(scripted.ScriptedBackend("abcdefghijkl")).complete(
        "x = ", 4, on_text=pieces.append, should_cancel=lambda: len(pieces) >= 2)
    assert result.finish_reason == "cancelled" and pieces[:2] == ["abc", "def"]


def test_a_failing_context_engine_falls_back_to_the_plain_prompt() -> None:
    class Broken:
        def build_prompt(self, text: str, offset: int, **_: object) -> None:
            raise RuntimeError("index is corrupt")

    backend = scripted.ScriptedBackend("1")
    result = Pipeline(backend, context=Broken()).complete("a = 0\nx = ", 10)  # type: ignore[arg-type]
    assert result.text == "1" and backend.requests[0].prompt.prefix == "a = 0\nx = "


def test_bad_offset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="outside the document"):
        Pipeline(scripted.ScriptedBackend("1")).complete("abc", 10)


def test_settings_reach_the_backend() -> None:
    backend = scripted.ScriptedBackend("1")
    Pipeline(backend, PipelineSettings(max_tokens=7, temperature=0.5, seed=3)).complete("x = ", 4)
    request: CompletionRequest = backend.requests[0]
    assert (request.max_tokens, request.temperature, request.seed) == (7, 0.5, 3)


def test_single_line_completions_build_their_prompt_within_their_own_budget() -> None:
    budgets: list[object] = []

    class Recording:
        def build_prompt(self, text: str, offset: int, *, budget_tokens: int | None = None, **_: object) -> Prompt:
            budgets.append(budget_tokens)
            return Prompt(text[:offset], text[offset:])

    pipeline = Pipeline(scripted.ScriptedBackend("1"), PipelineSettings(line_context_tokens=128), context=Recording())  # type: ignore[arg-type]
    pipeline.complete("x = ", 4, multiline=False)
    pipeline.complete("def f():\n    ", len("def f():\n    "), multiline=True)
    assert budgets == [128, None]  # None: the context engine's own budget


def test_only_single_line_completions_stop_where_the_model_is_unsure() -> None:
    settings = PipelineSettings(min_token_prob=0.2)
    single = scripted.ScriptedBackend("1")
    Pipeline(single, settings).complete("x = ", 4, multiline=False)
    multi = scripted.ScriptedBackend("1")
    Pipeline(multi, settings).complete("def f():\n    ", len("def f():\n    "), multiline=True)
    assert single.requests[0].min_token_prob == 0.2 and multi.requests[0].min_token_prob == 0.0


def test_a_line_inserted_before_existing_code_ends_with_a_newline() -> None:
    document = "def f(xs):\n    total = 0\n    return total\n"
    cursor = document.index("    return")
    result = Pipeline(scripted.ScriptedBackend("    total += sum(xs)\n    return total\n")).complete(
        document, cursor, multiline=False)
    assert result.text == "    total += sum(xs)\n" and result.clean


def test_the_context_engine_builds_the_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from glm5_lsp.context.engine import ContextEngine
    from glm5_lsp.pipeline.session import SharedContext

    monkeypatch.setenv("GLM5_LSP_CACHE_DIR", str(tmp_path))
    backend = scripted.ScriptedBackend("x")
    document = "import os\n\ndef f(p):\n    return os.path.join(p, \n"
    cursor = document.index("\n", document.index("join("))
    context = SharedContext(ContextEngine(cache_dir=tmp_path), lambda root: ContextEngine(workspace_root=root, cache_dir=tmp_path))
    Pipeline(backend, context=context).complete(document, cursor, path="m.py")
    prompt = backend.requests[0].prompt
    assert prompt.text().endswith(document) or document[:cursor] in prompt.prefix
    assert {"current_block"} <= {span.role for span in prompt.spans}


class HealingBackend(scripted.ScriptedBackend):
    """Honours ``forced_prefix`` the way the local runtime does: the answer begins with it."""

    supports_forced_prefix = True

    def complete(self, request: CompletionRequest):
        completion = super().complete(request)
        assert completion.text.startswith(request.forced_prefix)
        return completion


def test_the_word_at_the_cursor_is_healed() -> None:
    backend = HealingBackend("values)")
    streamed: list[str] = []
    document = "def f(values):\n    return len(va\n"
    cursor = document.index("va\n") + 2
    result = Pipeline(backend).complete(document, cursor, on_text=streamed.append)
    request = backend.requests[0]
    assert request.forced_prefix == "va" and request.prompt.prefix.endswith("len(")
    assert result.text == "lues)" and result.clean
    assert "".join(streamed) == "lues)"  # the healed word is not streamed again


def test_the_space_before_the_cursor_is_healed_with_the_word_before_it() -> None:
    """``return |``: the prompt would end on a lone space, a token the model saw almost only before a
    line break; it ends before `` return`` instead, which the model writes again (forced)."""
    backend = HealingBackend(" return a + b")
    document = "def add(a, b):\n    return \n"
    cursor = document.index(" \n") + 1
    result = Pipeline(backend).complete(document, cursor, multiline=False)
    request = backend.requests[0]
    assert request.forced_prefix == " return " and request.prompt.prefix.endswith("def add(a, b):\n   ")
    assert result.text == "a + b" and result.clean


def test_a_healed_space_is_no_word_to_finish() -> None:
    """Nothing past the healed `` = ``: no answer, and no word is finished from the names around (the
    cursor is in no word)."""
    document = "values = 1\ntotal = \n"
    result = Pipeline(HealingBackend(" = ")).complete(document, document.index(" \n") + 1, multiline=False)
    assert result.text == "" and not result.finished_word


def test_a_healed_word_is_judged_against_the_document_as_typed() -> None:
    """The cursor ends an unfinished ``if me``: the document already fails with "expected ':'". The
    healed candidate ``message`` replaces the typed ``me`` and leaves that same error, moved along
    the line: nothing new, so it is clean. (Judged against the document without the word, ``if``
    alone, it would have looked like a new error.)"""
    backend = HealingBackend("message")
    document = "def f(message):\n    if me\n"
    cursor = document.index("me\n") + 2
    result = Pipeline(backend).complete(document, cursor)
    assert backend.requests[0].forced_prefix == "me"
    assert result.text == "ssage" and result.clean, result
    assert result.diagnostics_before  # the document's own error was there all along


def test_no_healing_without_backend_support_or_inside_a_word() -> None:
    document = "def f(values):\n    return len(va\n"
    cursor = document.index("va\n") + 2
    plain = scripted.ScriptedBackend("lues)")
    assert Pipeline(plain).complete(document, cursor).text == "lues)"
    assert plain.requests[0].forced_prefix == "" and plain.requests[0].prompt.prefix.endswith("len(va")
    healing = HealingBackend("va")
    settings = PipelineSettings(token_healing=False)
    Pipeline(healing, settings).complete(document, cursor)
    assert healing.requests[0].forced_prefix == ""
    inside = "x = valu + 1\n"
    Pipeline(healing).complete(inside, inside.index("lu"))  # the word goes on after the cursor
    assert healing.requests[-1].forced_prefix == ""


def test_a_candidate_that_only_retypes_the_word_is_empty() -> None:
    """The model writes nothing past the typed word: that is no answer, so the word is finished from
    the names around it instead."""
    document = "values = 1\nprint(va\n"
    result = Pipeline(HealingBackend("va")).complete(document, document.index("va\n") + 2)
    assert result.text == "lues" and result.finished_word
    nothing = Pipeline(HealingBackend("zq")).complete("print(zq\n", len("print(zq"))
    assert nothing.text == "" and not nothing.finished_word  # no name begins with ``zq``


def test_a_completion_time_budget_stops_the_repair_rounds() -> None:
    document = "count = 1\ntotal = "
    answers = iter(["undefined_thing + 1", "count + 1"])
    backend = scripted.ScriptedBackend(lambda request: next(answers), delay=0.2)
    result = Pipeline(backend).complete(document, len(document), time_budget_s=0.1)
    assert result.rounds == 1 and result.text == "" and len(backend.requests) == 1
    answers = iter(["undefined_thing + 1", "count + 1"])
    backend = scripted.ScriptedBackend(lambda request: next(answers), delay=0.2)
    assert Pipeline(backend).complete(document, len(document)).text == "count + 1"  # the loop's own budget


def test_the_time_budget_counts_from_the_request_prompt_building_included() -> None:
    """A context engine that takes 0.3 s of a 0.4 s budget leaves too little for a second round
    (each generation here takes 0.15 s): the budget is the request's, not the repair loop's alone."""
    class Slow:
        def build_prompt(self, text: str, offset: int, **_: object) -> Prompt:
            time.sleep(0.3)
            return Prompt(text[:offset], text[offset:])

    document = "count = 1\ntotal = "
    answers = iter(["undefined_thing + 1", "count + 1"])
    backend = scripted.ScriptedBackend(lambda request: next(answers), delay=0.15)
    result = Pipeline(backend, context=Slow()).complete(document, len(document), time_budget_s=0.4)  # type: ignore[arg-type]
    assert len(backend.requests) == 1 and result.text == ""
    answers = iter(["undefined_thing + 1", "count + 1"])
    backend = scripted.ScriptedBackend(lambda request: next(answers), delay=0.15)
    assert Pipeline(backend).complete(document, len(document), time_budget_s=0.4).text == "count + 1"  # fast prompt


@pytest.mark.parametrize(("text", "kept"), [
    ("e_to_to_to_to_to_to_to", "e_to"),
    ("IPPPPPPPPPPPPPPP", "IP"),
    ("x = '-' * 40", None),  # no repetition
    ("# ----------------", None),  # a rule line: no letter
    ("[0, 0, 0, 0, 0, 0, 0]", None),
    ("aaaa", None),  # too short to tell
    ("    return __name__" + " = __name__" * 6, "    return __name__ = __name__"),  # a longer piece in one line
    ("x = (\n" + "    None,\n" * 7, None),  # short lines alike: a table as often as a loop
    ("x = (\n" + "    None," * 7, "x = (\n    None,"),  # the same piece within one line
])
def test_a_degenerate_repetition_is_found_where_it_begins(text: str, kept: str | None) -> None:
    start = pp.repetition_start(text)
    assert (text[:start] if start is not None else None) == kept


def test_a_generation_caught_in_a_loop_is_stopped_and_cut() -> None:
    """The model repeats itself (``_to_to_to...``): the generation is stopped once that shows and the
    candidate is cut where the repetition began."""
    pieces = ["name", "_to"] + ["_to"] * 40
    seen: list[str] = []

    class Looping:
        name = "looping"
        supports_internals = False

        def complete(self, request: CompletionRequest) -> object:
            text = ""
            for piece in pieces:
                if request.should_cancel and request.should_cancel():
                    break
                text += piece
                seen.append(piece)
                if request.on_text:
                    request.on_text(piece)
            return scripted.Completion(text, "length", completion_tokens=len(seen))

    document = "name_to = 1\nvalue = "
    result = Pipeline(Looping()).complete(document, len(document))  # type: ignore[arg-type]
    assert len(seen) < 12  # stopped early, not after 42 pieces
    assert result.text == "name_to"


def test_unhurried_loads_what_the_monitor_needs_before_a_python_request(tiny_checkpoint: Path, monkeypatch) -> None:
    """Batch and evaluation set ``unhurried``: jedi reads the document (its imports, its parse) before
    the request, with no deadline; only where the decoding monitor will run, and a jedi failure there
    does not fail the request."""
    import glm5_lsp.pipeline.core as pipeline_module
    from glm5_lsp.backends.local import LocalBackend

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(pipeline_module, "warm_jedi", lambda text, path=None: calls.append((text, path)))
    backend = LocalBackend(tiny_checkpoint)
    document = "import os\n\ndef f(p):\n    return os.path.\n"
    offset = document.index("\n", document.index("os.path."))
    settings = PipelineSettings(max_tokens=2, unhurried=True)
    Pipeline(backend, settings).complete(document, offset)
    assert calls == [(document, "untitled.py")]
    target = RepairTarget(document, offset, offset, "untitled.py", "python")
    for unhurried, seconds in ((True, UNHURRIED_LOOKUP_S), (False, MonitorSettings().provider_seconds)):
        monitor = Pipeline(backend, PipelineSettings(unhurried=unhurried)).repair.monitor_factory(target)
        assert monitor.settings.provider_seconds == seconds
    Pipeline(backend, PipelineSettings(max_tokens=2)).complete(document, offset)  # the server's default: off
    Pipeline(backend, settings).complete("let x = ", 8, language="javascript")  # no monitor for JavaScript
    quiet = PipelineSettings(max_tokens=2, unhurried=True, repair=RepairSettings(monitor=False))
    Pipeline(backend, quiet).complete(document, offset)
    assert len(calls) == 1

    def broken(text: str, path: str | None = None) -> None:
        raise RuntimeError("jedi fell over")

    monkeypatch.setattr(pipeline_module, "warm_jedi", broken)
    result = Pipeline(backend, settings).complete(document, offset)
    assert result.rounds >= 1


def test_fix_rewrites_the_block_that_holds_the_error() -> None:
    code = "def first(x):\n    return x + 1\n\n\ndef second(y):\n    return y +\n"
    prompts: list[str] = []

    def answer(request: CompletionRequest) -> str:
        prompts.append(request.prompt.prefix)
        return "    return y + 2\n"

    result = Pipeline(scripted.ScriptedBackend(answer)).fix(code)
    assert result.text == "def first(x):\n    return x + 1\n\n\ndef second(y):\n    return y + 2\n"
    assert result.clean
    shown = prompts[0]
    assert "def first" not in shown  # only the block at fault is shown, with its error on its own line 2
    assert "# line 2: " in shown and shown.endswith("# Fixed version:\ndef second(y):\n")


def test_fix_region_picks_the_innermost_block_and_a_broken_header() -> None:
    code = ("import os\n\n\nclass A:\n    def m(self, x):\n        return x\n\n    def n(\n        self,\n"
            "    ):\n        return 2\n\n\nvalue = 1\n")
    region = fix_region(code, 5)  # inside m
    assert code[region.block_start:region.start] == "    def m(self, x):\n"
    assert code[region.start:region.end] == "        return x"
    region = fix_region(code, 8)  # n's signature, which spans three lines: header and body rewritten
    assert code[region.block_start:region.start] == "    "
    assert code[region.start:region.end] == "def n(\n        self,\n    ):\n        return 2"
    region = fix_region(code, 10)  # n's body
    assert code[region.block_start:region.start] == "    def n(\n        self,\n    ):\n"
    assert fix_region(code, 13) == FixRegion(0, 0, len(code.rstrip()), len(code))  # module level: all of it
    assert code[fix_region(code, None).start:fix_region(code, None).end].startswith("    def m")  # the first block
    assert fix_region("function f() {\n  return 1 +\n}\n", 1, "javascript").start == 0
    quoted = 'def f(a="(",  # a bracket in a string: ) and in a comment\n      b=1):\n    return a\n'
    region = fix_region(quoted, 2)
    assert quoted[region.block_start:region.start] == 'def f(a="(",  # a bracket in a string: ) and in a comment\n      b=1):\n'
    assert quoted[region.start:region.end] == "    return a"


def test_a_fix_with_a_missing_colon_rewrites_the_header() -> None:
    code = "def f(a, b)\n    return a + b\n"
    result = Pipeline(scripted.ScriptedBackend("def f(a, b):\n    return a + b\n")).fix(code)
    assert result.text == "def f(a, b):\n    return a + b\n" and result.clean


def test_a_fix_that_throws_the_code_away_is_no_fix() -> None:
    """``pass`` in place of a whole body compiles; it is still not a fix."""
    code = "def area(w, h):\n    result = w * h\n    return result +\n"
    settings = PipelineSettings()
    settings.repair.return_unclean = True
    result = Pipeline(scripted.ScriptedBackend("    pass\n"), settings).fix(code)
    assert result.text == code and not result.clean
    body = "    result = w * h\n    return result +"
    assert keeps_enough(body, "    result = w * h\n    return result")
    assert keeps_enough(body, "    return w * h")  # shorter is fine
    for gutted in ("    # done", "    pass", "    ...", "    return", "    return None", "#", ""):
        assert not keeps_enough(body, gutted)
    assert keeps_enough("    x = 1", "    pass")  # one line of code may become anything
    assert not keeps_enough("  let a = 1;\n  return a +", "  return; // later")


def test_generate_takes_no_comments_or_pass_alone_for_code() -> None:
    settings = PipelineSettings(repair=RepairSettings(max_rounds=2))
    for answer in ("#\n#\n#\n", "    pass\n", "    # TODO\n    ...\n"):
        for prompt in ('def add(a, b):\n    """Sum."""\n', "Write a function that adds two numbers."):
            result = Pipeline(scripted.ScriptedBackend(answer), settings).generate(prompt)
            assert result.text == "" and not result.clean, (answer, prompt)
    assert working_lines("#\n    pass\n    return None\n    ...\n// x\n") == 0
    assert working_lines('    """Doc."""\n    return a + b  # sum\n') == 2


def test_an_opened_document_is_checked_before_its_first_request(monkeypatch) -> None:
    """``warm_document`` runs the document's checks (starting their helper processes): the first
    request's own diagnostics of the unchanged document come from memory, not the checkers."""
    from glm5_lsp.checks.providers.runner import DiagnosticRunner

    pipeline = Pipeline(scripted.ScriptedBackend("pass"))
    document = "import os\n\n\ndef size(path):\n    return os.path.getsize(path\n"
    pipeline.warm_document(document, "/tmp/glm5_warm/checked.py")
    monkeypatch.setattr(DiagnosticRunner, "_run", lambda *a, **k: pytest.fail("checked again"))
    report = pipeline.repair.runner_for("python").diagnose(document, "/tmp/glm5_warm/checked.py", "python")
    assert report.diagnostics  # the unclosed call, remembered
    monkeypatch.undo()
    monkeypatch.setattr(DiagnosticRunner, "diagnose", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    pipeline.warm_document(document, "/tmp/glm5_warm/other.py")  # a checker's failure is logged, not raised
