"""Cutting an unclean candidate short: where it may end, and the loop keeping a clean prefix."""

from __future__ import annotations

import pytest

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.repair.loop import RepairLoop, RepairSettings, RepairTarget
from glm5_lsp.repair.truncate import cut_points, header_colon
from glm5_lsp.spans import Prompt
from tests.test_repair_loop import RUNNER, ScriptedBackend, request, target


@pytest.mark.parametrize("text, language, expected", [
    ("None,", "python", ["None"]),
    ("None, we'", "python", ["None, we", "None"]),  # never inside the string it opens
    ("naxes = (r'{0}\\n", "python", ["naxes"]),  # nor inside a bracket it leaves open
    ("ne): # done", "python", ["ne):", "ne)", "ne"]),  # a bracket the document opened may close
    ("x == 1: y", "python", ["x == 1:", "x == 1", "x"]),  # a block header's colon is an end
    ("x == 1: y", "javascript", ["x == 1", "x"]),
    ("f(a) // note", "javascript", ["f(a)", "f"]),
    ("a(b]", "python", ["a"]),  # mismatched: nothing after it
    ("value", "python", []),  # the whole text is not a cut
])
def test_cut_points(text: str, language: str, expected: list[str]) -> None:
    assert [text[:n] for n in cut_points(text, language)] == expected


def test_minimum_keeps_a_forced_prefix_out() -> None:
    assert [("selfish.x"[:n]) for n in cut_points("selfish.x", minimum=5)] == ["selfish"]
    assert cut_points("se.x", minimum=3) == []


def test_the_loop_returns_a_clean_prefix_instead_of_regenerating() -> None:
    backend = ScriptedBackend(["math.pi * radius ** 2 + (", "never asked"])
    loop = RepairLoop(backend, RepairSettings(max_rounds=2, max_truncations=3), RUNNER)
    result = loop.run(request(), target())
    assert result.text == "math.pi * radius ** 2" and result.clean
    assert len(backend.requests) == 1 and result.candidates[-1].truncated
    assert result.candidates[0].blocking  # the full one stays on record, unclean


def test_without_truncations_the_loop_regenerates() -> None:
    backend = ScriptedBackend(["math.pi * radius ** 2 + (", "math.pi * radius ** 2"])
    result = RepairLoop(backend, RepairSettings(max_rounds=2), RUNNER).run(request(), target())
    assert result.text == "math.pi * radius ** 2" and len(backend.requests) == 2


def test_a_prefix_no_longer_than_the_forced_word_is_not_an_answer() -> None:
    loop = RepairLoop(ScriptedBackend(["math + ("]), RepairSettings(max_rounds=1, max_truncations=3), RUNNER)
    assert loop.run(request(), target()).text == "math"  # clean: "return math"
    forced = CompletionRequest(request().prompt, forced_prefix="math")
    assert loop.run(forced, target()).text is None  # but "math" adds nothing to what the user typed


def test_the_first_word_is_always_among_the_prefixes_tried() -> None:
    # cut points: "math + nope_a + nope_b", "math + nope_a", "math": only the shortest is clean
    backend = ScriptedBackend(["math + nope_a + nope_b + nope_c"])
    loop = RepairLoop(backend, RepairSettings(max_rounds=1, max_truncations=2), RUNNER)
    result = loop.run(request(), target())
    assert result.text == "math" and result.candidates[-1].truncated


# A block header cut at the cursor: the document lacks the colon already, so a cut without it adds
# no diagnostic and would pass the checks unfinished.
HEADER_DOC = 'def parse(value):\n    if " " in va\n        return value.split()\n    return [value]\n'
HEADER_AT = HEADER_DOC.index("va\n") + 2


@pytest.mark.parametrize("document, text, expected", [
    (HEADER_DOC, "lue", "lue:"),
    (HEADER_DOC, "lue or x ", "lue or x:"),
    (HEADER_DOC, "lue(", None),  # a bracket left open: not the header's end
    (HEADER_DOC, "lue: return", None),  # it has its colon
    ("x = va\ny = 1\n", "lue", None),  # no compound statement
    ("if va\ny = 1\n", "lue", None),  # no body below: the header may go on
    ("while n := va\n    n -= 1\n", "lue", "lue:"),  # the walrus is no colon
    ("    el\n        pass\n", "se", "se:"),
    ("    return f(va\n        x)\n", "lue", None),
    ("for n, s in va\n    pass\n", "lue", "lue:"),
    ("def value_range():\n    pass\nfor n, s in va\n    pass\n", "lue_range", None),  # defined here: a call
    ("for n, s in va\n    pass\n", "lue, enumerate", None),  # a builtin function: called next
    ("def f(va\n    pass\n", "lue) -> int", "lue) -> int:"),  # an annotation's class is no call
    ("if x in va\n    pass\n", "lue in", None),  # cut mid-expression: no whole header
    ("if x == va\n    pass\n", 'lue + "a:', None),  # inside a string
    ("for va\n    pass\n", "lue", None),  # a for without its in
    ("if va\n    pass\n", "lue  # why", None),  # the colon would go into the comment
    ("    except va\n        pass\n", "lue as e", ":"),
    ("    async with va\n        pass\n", "lue() as x", ":"),
])
def test_header_colon(document: str, text: str, expected: str | None) -> None:
    at = document.index("va\n") + 2 if "va\n" in document else document.index("el\n") + 2
    expected = text + expected if expected == ":" else expected
    assert header_colon(text, document, at, at) == expected
    assert header_colon(text, document, at, at, "javascript") is None


def test_a_header_cut_short_gets_no_colon() -> None:
    # the model meant the header to go on (``lue or ...``): a colon after the cut would end it wrongly
    prefix, suffix = HEADER_DOC[:HEADER_AT], HEADER_DOC[HEADER_AT:]
    request = CompletionRequest(Prompt(prefix, suffix, []))
    where = RepairTarget(HEADER_DOC, HEADER_AT, HEADER_AT, "parse.py", "python")
    backend = ScriptedBackend(["lue or (\t"])  # unclean: the bracket it opens never closes
    result = RepairLoop(backend, RepairSettings(max_rounds=1, max_truncations=3), RUNNER).run(request, where)
    assert result.text == "lue" and result.clean and result.candidates[-1].truncated


def test_a_finished_word_that_ends_a_header_gets_its_colon() -> None:
    document = 'def parse(value):\n    if " " in va\n        return value.split()\n'
    at = document.index("va\n") + 2
    request = CompletionRequest(Prompt(document[:at], document[at:], []))
    where = RepairTarget(document, at, at, "parse.py", "python")
    loop = RepairLoop(ScriptedBackend(["(\t"]), RepairSettings(max_rounds=2, max_truncations=1), RUNNER,
                      finisher=lambda before, typed, after, language: ["value"])
    result = loop.run(request, where)
    assert result.text == "lue:" and result.finished_word


def test_a_generated_header_without_its_colon_gets_it() -> None:
    prefix, suffix = HEADER_DOC[:HEADER_AT], HEADER_DOC[HEADER_AT:]
    request = CompletionRequest(Prompt(prefix, suffix, []))
    where = RepairTarget(HEADER_DOC, HEADER_AT, HEADER_AT, "parse.py", "python")
    result = RepairLoop(ScriptedBackend(["lue"]), RepairSettings(max_rounds=1), RUNNER).run(request, where)
    assert result.text == "lue:" and result.clean
