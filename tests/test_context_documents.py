"""Documents: language detection, incremental parsing equal to a fresh parse, bad input.

Data: ``tests/data/context/ws/`` (fixture workspace).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from glm5_lsp.context.documents import Document, DocumentStore, Edit
from glm5_lsp.context.sources import decode, read_source, walk_files
from glm5_lsp.languages import (
    PLAIN,
    comment_prefix,
    detect_language,
    load_grammar,
    supported_languages,
)

WS = Path(__file__).parent / "data" / "context" / "ws"


@pytest.mark.parametrize(
    "path, language_id, expected",
    [
        ("a.py", None, "python"),
        ("a.pyi", None, "python"),
        ("a.ts", None, "typescript"),
        ("a.tsx", None, "tsx"),
        ("a.mjs", None, "javascript"),
        ("main.go", None, "go"),
        ("lib.rs", None, "rust"),
        ("util.h", None, "c"),
        ("shape.hpp", None, "cpp"),
        ("notes.txt", None, PLAIN),
        ("noext", "python", "python"),
        ("a.txt", "typescriptreact", "tsx"),
        ("a.py", "unknown-language", "python"),
        (None, None, PLAIN),
    ],
)
def test_detect_language(path, language_id, expected):
    assert detect_language(path, language_id) == expected


def test_every_language_loads_its_grammar_and_four_queries():
    for language in supported_languages():
        grammar = load_grammar(language)
        assert grammar is not None, language
        for kind in ("definitions", "references", "blocks", "imports"):
            assert getattr(grammar, kind) is not None, (language, kind)
    assert load_grammar(PLAIN) is None
    assert comment_prefix("python") == "# " and comment_prefix("go") == "// "


EDITS = [
    Edit(1, 11, 1, 11, " + 1"),  # insert inside a line
    Edit(0, 0, 0, 0, "import os\n"),  # insert a line at the top
    Edit(2, 0, 4, 0, ""),  # delete lines
    Edit(1, 4, 1, 10, "yield"),  # replace a keyword
    Edit(3, 0, 3, 0, "def broken(:\n"),  # introduce a syntax error
    Edit(0, 0, 0, 0, "s = 'héllo wörld ✓'\n"),  # non-ASCII text shifts bytes, not characters
    Edit(0, 17, 0, 18, "!"),  # edit after non-ASCII characters on the same line
]


def test_incremental_parse_matches_a_fresh_parse():
    text = "def f(x):\n    return x\n\n\nclass A:\n    def m(self):\n        return 1\n"
    doc = Document("a.py", text, "python")
    for edit in EDITS:
        change = doc.apply(edit)
        fresh = Document("a.py", doc.text, "python")
        assert str(doc.tree.root_node) == str(fresh.tree.root_node), edit
        assert change.changed[0] <= change.start_byte <= change.new_end_byte <= change.changed[1]
    assert doc.text.startswith("s = 'héllo wörld !'\nimport os\n")


def test_positions_round_trip_with_non_ascii_text():
    doc = Document("a.py", "a = 'é✓'\nb = 2\n", "python")
    assert not doc.ascii
    assert doc.position(doc.offset(1, 2)) == (1, 2)
    assert doc.byte_offset(doc.offset(1, 0)) == len("a = 'é✓'\n".encode())
    assert doc.char_offset(doc.byte_offset(7)) == 7
    assert doc.offset(99, 0) == len(doc.text) and doc.offset(0, 99) == len(doc.line(0))


def test_syntax_errors_still_yield_a_tree():
    source = read_source(WS / "broken.py")
    doc = Document("broken.py", source.text, "python")
    assert doc.has_errors
    assert "function_definition" in str(doc.tree.root_node)


def test_plain_text_has_no_tree_and_still_edits():
    doc = Document("notes.txt", (WS / "notes.txt").read_text(), PLAIN)
    assert doc.tree is None and doc.grammar is None
    doc.apply(Edit(2, 0, 2, 4, "bacon"))
    assert doc.line(2) == "bacon"


def test_document_store_open_update_close():
    store = DocumentStore()
    store.open("/w/a.py", "x = 1\n", version=1)
    doc = store.update("/w/a.py", [Edit(0, 4, 0, 5, "2"), "y = 3\n"], version=3)
    assert doc.text == "y = 3\n" and doc.version == 3
    store.close("/w/a.py")
    assert store.get("/w/a.py") is None
    with pytest.raises(KeyError):
        store.update("/w/a.py", ["z"])


def test_bad_inputs_are_skipped_or_decoded_with_a_log_line(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="glm5_lsp.context.sources")
    latin = read_source(WS / "latin1.py")
    assert latin is not None and latin.lossy and "\ufffd" in latin.text and "def after" in latin.text
    assert read_source(WS / "binary.py") is None
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 100)
    assert read_source(big, max_bytes=100) is None
    assert read_source(tmp_path / "missing.py") is None
    messages = caplog.text
    assert "not valid UTF-8" in messages and "binary file" in messages and "over the 100-byte limit" in messages
    assert decode(b"\xef\xbb\xbfok") == ("ok", False)


def test_walk_files_skips_vcs_and_virtualenv_folders(tmp_path):
    for rel in ("a.py", ".git/x.py", "node_modules/y.js", ".venv/z.py", "sub/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    found = [p.relative_to(tmp_path).as_posix() for p in walk_files(tmp_path, frozenset({".py", ".js"}))]
    assert found == ["a.py", "sub/b.py"]
