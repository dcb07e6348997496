"""Labels without people and the rows they go in: a candidate against the real rest of the line, the
block case for the length head, and one cursor collected end to end through the server's engine on a
tiny checkpoint (``glm5_lsp.gate.labels``, ``glm5_lsp.gate.collect``)."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import pytest

from glm5_lsp.gate.collect import Collector, block_case, length_options, read_rows, recompute
from glm5_lsp.gate.features import kept_text
from glm5_lsp.gate.labels import edit_similarity, label
from glm5_lsp.memory.heldout import cursor_cases


@pytest.mark.parametrize(("text", "rest", "exact", "similar", "right"), [
    ("lue)", "lue)", True, True, True),
    ("lue)  \nmore", "lue)", True, True, True),  # the first line, trailing spaces aside
    ("lue + 1", "lue + 1)", False, True, True),
    ("lue", "lue)", False, False, True),  # 0.75 alike
    ("lid)", "lue)", False, False, False),
    ("", "lue)", False, False, False),
    ("  ", "", False, False, False),  # nothing shown is never exact
])
def test_labels(text: str, rest: str, exact: bool, similar: bool, right: bool) -> None:
    mark = label(text, rest, word="value", typed="va")
    assert (mark.exact, mark.similar, mark.right_word) == (exact, similar, right)


def test_labels_after_a_space() -> None:
    assert label("= {}", "= {}", word="=").right_word and not label("== 1", "= {}", word="=").right_word
    assert label("self.x", "self.y", word="self").right_word and not label("selfie", "self", word="self").right_word


def test_cursors_after_a_space(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f(a, b):\n    # not here\n    total = a + b\n    return  total\n")
    cases = [c for seed in range(40) for c in cursor_cases(path, 10, random.Random(seed), at="space")]
    cut = {(c.document[:c.offset].rsplit("\n", 1)[-1], c.rest, c.word, c.typed) for c in cases}
    assert cut == {("def ", "f(a, b):", "f", 0), ("def f(a, ", "b):", "b", 0), ("    total ", "= a + b", "=", 0),
                   ("    total = ", "a + b", "a", 0), ("    total = a ", "+ b", "+", 0),
                   ("    total = a + ", "b", "b", 0)}, "code lines only (one cursor per line), one space before the cursor"
    assert all(c.document[c.offset:].startswith("\n") for c in cases), "the rest of the line is cut"
    with pytest.raises(ValueError, match="unknown cursor kind"):
        cursor_cases(path, 1, random.Random(0), at="middle")


def test_cursors_at_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f(a, b):\n    # not here\n    total = a + b\n    return  total\n")
    cases = [c for seed in range(40) for c in cursor_cases(path, 10, random.Random(seed), at="line")]
    cut = {(c.document[:c.offset].rsplit("\n", 1)[-1], c.rest, c.word, c.typed) for c in cases}
    assert cut == {("", "def f(a, b):", "def", 0), ("    ", "total = a + b", "total", 0),
                   ("    ", "return  total", "return", 0)}, "code lines only, the cursor at the indentation's end"
    assert all(c.document[c.offset:].startswith("\n") for c in cases), "the whole line's code is cut"


def test_edit_similarity() -> None:
    assert edit_similarity("", "") == 1.0 and edit_similarity("abc", "") == 0.0
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert edit_similarity("sitting", "kitten") == edit_similarity("kitten", "sitting")


DOCUMENT = """def f(items):
    total = 0
    for item in it
    if total:
        return total
    return None
"""


def test_the_block_case_removes_the_rest_of_the_block() -> None:
    offset = DOCUMENT.index("in it") + 5
    doc = DOCUMENT.replace("for item in it\n", "for item in it\n        total += item\n\n")
    new, truth = block_case(doc, offset, 2, "ems:")
    assert truth == "ems:\n        total += item\n\n    if total:\n        return total\n    return None"
    assert new == doc[:offset] + "\n"  # to the end of the function (at most MAX_BLOCK_LINES lines)
    top = "x = 1\ny = fo\nz = 3\n"
    new, truth = block_case(top, top.index("fo") + 2, 1, "o")
    assert truth == "o\nz = 3" and new == "x = 1\ny = fo\n"
    inner = "def g():\n    \n    c = d\n\ne = 1\n"  # the cursor's line cut (the case's document)
    new, truth = block_case(inner, len("def g():\n    "), 1, "a = b")
    assert truth == "a = b\n    c = d" and new == "def g():\n    \n\ne = 1\n"


def test_length_options_and_kept_text() -> None:
    text = "ems:\n        total += item\n    raise SystemExit('there is no way out of here')"
    truth = "ems:\n        total += item\n    if total:"
    options = length_options(text, truth)
    assert options["lines2"] > options["line"] and options["lines2"] > options["block"]
    assert options["lines3"] == options["block"]  # three lines are all of it
    assert kept_text(text, "lines2") == "ems:\n        total += item" and kept_text(text, "block") == text
    assert length_options("", truth) == dict.fromkeys(("line", "lines2", "lines3", "block"), 0.0)


def test_one_cursor_collected_end_to_end(tiny_checkpoint: Path, tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "m.py").write_text(DOCUMENT.replace("in it\n", "in items:\n        total += item\n"))
    case = cursor_cases(root / "m.py", 1, random.Random(1))[0]
    collector = Collector(root, budget_ms=3000, model_path=str(tiny_checkpoint))
    row = collector.row(case, "pkg", root)
    assert row["rest"] == case.rest and row["path"] == "m.py" and row["offset"] == case.offset
    single = row["single"]
    assert set(single) >= {"text", "features", "exact", "similarity", "shown", "raw", "feature_ms"}
    assert single["features"]["cursor_column"] == len(row["typed_line"])
    assert single["raw"]["stats"]["entropies"], "the observer saw the generation"
    assert "text" in row["regen"] and "word" in row["finish"] and "options" in row["block"]
    # the workspace memory is built and wired as the server's is (the regenerating pipeline beside it
    # once unwired it from the loop they share, so rows had no memory)
    assert collector.pipeline.repair.recall is not None and collector.pipeline.memory.indexed
    assert "recalled" in single["raw"]["result"]
    out = tmp_path / "rows.jsonl"
    out.write_text(json.dumps(row) + "\n")
    again = read_rows([out])
    before = copy.deepcopy(again)
    assert recompute(again, {"pkg": root}) == 2 + ("memory" in row)
    for key in ("single", "block", *(["memory"] if "memory" in row else [])):
        for name, value in before[0][key]["features"].items():
            other = again[0][key]["features"][name]
            assert (value is None) == (other is None) and (value is None or other == pytest.approx(value, abs=1e-3))


def test_the_memorys_continuation_is_collected_as_the_candidate_that_stands_in(tiny_checkpoint: Path,
                                                                               tmp_path: Path) -> None:
    from glm5_lsp.healing import partial_word
    from glm5_lsp.pipeline import PipelineResult
    from glm5_lsp.pipeline.memory import Recollection

    root = tmp_path / "pkg"
    root.mkdir()
    (root / "m.py").write_text(DOCUMENT.replace("in it\n", "in items:\n        total += item\n"))
    case = cursor_cases(root / "m.py", 1, random.Random(1))[0]
    collector = Collector(root, budget_ms=3000, model_path=str(tiny_checkpoint))
    heal = partial_word(case.document[: case.offset], case.document[case.offset:])
    assert heal  # the cursor is inside a word: the memory's views begin with it
    recalled = Recollection(heal + case.rest, "")
    stand = collector._stand_in(PipelineResult("zzz", True, rounds=1, recalled=recalled), case, str(case.path))
    assert stand.text == case.rest and stand.remembered and stand.finish_reason == "memory"
    assert stand.completion_tokens == 0 and stand.recalled is recalled
    same = PipelineResult(case.rest, True, recalled=recalled)  # what the model wrote already: nothing to add
    assert collector._stand_in(same, case, str(case.path)) is None
    # post-processed as a candidate is (the brackets nothing opened dropped) ...
    extra = Recollection(heal + case.rest + ")))", "")
    assert collector._stand_in(PipelineResult("zzz", True, recalled=extra), case, str(case.path)).text == case.rest
    broken = Recollection(heal + case.rest + " = = 1", "")  # ... and checked: a syntax error never stands in
    assert collector._stand_in(PipelineResult("zzz", True, recalled=broken), case, str(case.path)) is None
    # the same continuation where the model's answer spells its last word on ("tal = 0" against
    # "tal = 05"): cut short inside it, never what the line holds
    longer = PipelineResult(case.rest + "5", True, recalled=recalled)
    assert re.search(r"\w$", case.rest) and collector._stand_in(longer, case, str(case.path)) is None


def test_a_finished_word_is_right_by_the_identifier_it_finishes() -> None:
    from glm5_lsp.gate.collect import finish_row
    from glm5_lsp.memory.heldout import Case

    case = Case(Path("m.py"), "if x:\n    pass\nel\n    pass\n", 17, 2, "se:", "else")
    assert finish_row("else:", case, "el") == {"word": "else:", "right": True}  # the colon it needs
    assert finish_row("elif", case, "el")["right"] is False
    assert finish_row("", case, "el")["right"] is False
