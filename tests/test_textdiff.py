"""The edits between two versions of a text: they reproduce the new text exactly, and two edits far
apart come back as two small edits rather than one spanning everything between them."""

from __future__ import annotations

import random

from glm5_lsp.context.documents import Document
from glm5_lsp.context.engine import ContextEngine
from glm5_lsp.context.summary import summarize
from glm5_lsp.textdiff import diff_region, diff_regions


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in edits:
        text = text[:start] + new + text[end:]
    return text


def _module(lines: int) -> str:
    return "\n".join(f"def f{i}(a, b):\n    return a + b * {i}\n" for i in range(lines // 3))


def test_random_edits_are_reproduced_exactly() -> None:
    rng = random.Random(7)
    base = _module(300).split("\n")
    for _ in range(2000):
        old, new = list(base), list(base)
        for version in (old, new):
            for _ in range(rng.randint(0, 3)):
                i = rng.randrange(len(version))
                version[i] = version[i][:rng.randint(0, len(version[i]))] + rng.choice(["", "x", "\n", "(\n  ", "é"])
        a, b = "\n".join(old), "\n".join(new)
        if rng.random() < 0.1:
            b = b[:rng.randrange(len(b) + 1)]
        edits = diff_regions(a, b)
        assert _apply(a, edits) == b
        assert len(edits) <= 2 and (edits or a == b)


def test_two_far_edits_are_split_and_one_edit_is_not() -> None:
    text = _module(300)
    lines = text.split("\n")
    cut = lines[:]
    cut[10], cut[250] = "    return a +", "    return a + b * 83  # changed"
    edits = diff_regions(text, "\n".join(cut))
    assert len(edits) == 2 and all(end - start < 80 and len(new) < 80 for start, end, new in edits)
    one = lines[:]
    one[100] = "    return"
    assert diff_regions(text, "\n".join(one)) == [diff_region(text, "\n".join(one))]
    assert diff_regions(text, text) == []


def test_the_context_engine_applies_a_whole_text_change_as_two_local_edits(tmp_path) -> None:
    engine = ContextEngine(workspace_root=tmp_path, cache_dir=tmp_path / "cache")
    text = _module(600)
    path = tmp_path / "mod.py"
    engine.open_document(path, text)
    lines = text.split("\n")
    lines[4], lines[592] = "    return a - b", "    return a + helper(b)"
    new = "\n".join(lines)
    applied = []
    real_apply = Document.apply

    def apply(doc: Document, edit):
        applied.append(edit)
        return real_apply(doc, edit)

    Document.apply = apply
    try:
        doc = engine.update_document(path, [new])
    finally:
        Document.apply = real_apply
    assert doc.text == new and len(applied) == 2
    fresh = Document(doc.path, new, doc.language)
    assert str(doc.tree.root_node) == str(fresh.tree.root_node)  # the incremental parse is exact
    summary = engine.symbols.files[doc.path]
    assert not summary.stale and summary.symbols == summarize(fresh).symbols
