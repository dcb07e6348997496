"""Cutting an unclean candidate short: where it may end, and the loop keeping a clean prefix."""

from __future__ import annotations

import pytest

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.repair.loop import RepairLoop, RepairSettings
from glm5_lsp.repair.truncate import cut_points
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
