"""Per-file summaries for every language, and incremental re-summarising equal to a full pass.

Data: ``tests/data/context/ws/`` (one small file per language).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from glm5_lsp.context.documents import Document, Edit
from glm5_lsp.context.sources import read_source
from glm5_lsp.context.summary import FileSummary, resummarize, summarize
from glm5_lsp.languages import detect_language

WS = Path(__file__).parent / "data" / "context" / "ws"


def _summary(rel: str) -> FileSummary:
    source = read_source(WS / rel)
    return summarize(Document(rel, source.text, detect_language(rel)), "digest")


# file -> [(qualname, kind, signature)] that must be present, and the bound import names.
CASES = {
    "pkg/shapes.py": (
        [
            ("UNIT", "variable", 'UNIT = "cm"'),
            ("Shape", "class", "class Shape"),
            ("Shape.sides", "field", "sides = 0"),
            ("Shape.area", "method", "def area(self) -> float"),
            ("Shape.describe", "method", "def describe(self, precision: int = 2) -> str"),
            ("Square", "class", "class Square(Shape)"),
            ("Square.checked", "field", "self.checked = True"),
            ("Square.to_json", "method", "def to_json(self) -> str"),
            ("parse_shape", "function", "def parse_shape(text: str) -> Shape"),
            ("parse_shape.text", "parameter", "text"),
        ],
        ["json", "regex", "dataclass"],
    ),
    "web/app.js": (
        [
            ("greet", "function", 'function greet(name, punctuation = "!")'),
            ("Counter", "class", "class Counter"),
            ("Counter.increment", "method", "increment(step)"),
            ("double", "variable", "double = (x) => x * 2"),
        ],
        ["readFile", "path"],
    ),
    "web/types.ts": (
        [
            ("Point", "class", "interface Point"),
            ("Point.x", "field", "x: number"),
            ("Pair", "type", "type Pair = [number, number];"),
            ("distance", "function", "function distance(a: Point, b: Point): number"),
            ("Grid.size", "method", "size(): number"),
        ],
        ["Counter"],
    ),
    "gosrc/main.go": (
        [
            ("Server", "class", "type Server"),
            ("Server.Port", "field", "Port int"),
            ("Server.Start", "method", "func (s *Server) Start(verbose bool) error"),
            ("Handler.Serve", "method", "Serve(name string) error"),
            ("NewServer", "function", "func NewServer(name string) *Server"),
        ],
        ["fmt", "str"],
    ),
    "rustsrc/lib.rs": (
        [
            ("Stack", "class", "pub struct Stack"),
            ("Stack.push", "method", "pub fn push(&mut self, value: i32)"),
            ("Stack.peek", "method", "pub fn peek(&self) -> Option<&i32>"),
            ("count_words", "function", "pub fn count_words(text: &str) -> HashMap<String, usize>"),
        ],
        ["HashMap", "fmt", "Display"],
    ),
    "csrc/util.c": (
        [
            ("MAX_LEN", "variable", "#define MAX_LEN 64"),
            ("point", "class", "struct point"),
            ("point.x", "field", "int x;"),
            ("clamp", "function", "static int clamp(int value, int lo, int hi)"),
        ],
        [],
    ),
    "cppsrc/shape.cpp": (
        [
            ("geo", "module", "namespace geo"),
            ("geo.Circle", "class", "class Circle"),
            ("geo.Circle.area", "method", "double area() const"),
            ("geo.total", "function", "double total(const std::vector<Circle>& circles)"),
        ],
        [],
    ),
}


@pytest.mark.parametrize("rel", sorted(CASES))
def test_summary_per_language(rel):
    expected, bound = CASES[rel]
    summary = _summary(rel)
    found = {(s.qualname, s.kind, s.signature) for s in summary.symbols}
    for item in expected:
        assert item in found, (item, sorted(found))
    assert [i.bound for i in summary.imports if i.bound] == bound


def test_docstrings_comments_and_module_doc():
    shapes = _summary("pkg/shapes.py")
    by_name = {s.qualname: s for s in shapes.symbols}
    assert by_name["Shape"].doc == "Base class of every shape."
    assert by_name["Shape.area"].doc == "The area in square units."
    assert shapes.doc == "Shapes with areas and a registry."
    assert {s.qualname: s for s in _summary("gosrc/main.go").symbols}["Server.Start"].doc == "Start launches the server."
    assert shapes.usage.get("regex", 0) >= 1


def test_broken_file_yields_what_tree_sitter_recovers():
    summary = _summary("broken.py")
    assert summary.has_errors
    assert ("good", "function") in {(s.qualname, s.kind) for s in summary.symbols}


def test_plain_text_summary_is_empty():
    assert _summary("notes.txt").symbols == []


def test_summary_json_round_trip():
    summary = _summary("pkg/shapes.py")
    again = FileSummary.from_json(summary.to_json())
    assert again.symbols == summary.symbols and again.imports == summary.imports and again.usage == summary.usage


def _key(summary: FileSummary) -> list[tuple]:
    return [(s.qualname, s.kind, s.line, s.end_line, s.start_byte, s.end_byte, s.parent, s.signature)
            for s in summary.symbols]


def test_incremental_resummarize_equals_a_full_pass():
    """Random one-line edits in a real file: every non-stale incremental summary equals a full one."""
    import argparse

    doc = Document("argparse.py", Path(argparse.__file__).read_text(), "python")
    summary = summarize(doc)
    rng = random.Random(0)
    lines = [i for i in range(doc.line_count) if doc.line(i).strip()]
    checked = 0
    for k in range(30):
        line = rng.choice(lines)
        text = doc.line(line)
        indent = text[: len(text) - len(text.lstrip())]
        new = indent + rng.choice([f"value = {k}", f"self.v{k % 4} = 1", "import os", "x = f(1, 2)", f"def g{k}(a): pass"])
        summary = resummarize(doc, summary, doc.apply(Edit(line, 0, line, len(text), new)))
        full = summarize(doc)
        if summary.stale:
            summary = full
            continue
        assert _key(summary) == _key(full), (k, line, new)
        assert summary.imports == full.imports
        checked += 1
    assert checked >= 20


def test_edit_that_breaks_structure_keeps_a_stale_summary():
    text = "class A:\n    def m(self):\n        return 1\n\n    def n(self):\n        return 2\n"
    doc = Document("a.py", text, "python")
    summary = summarize(doc)
    broken = resummarize(doc, summary, doc.apply(Edit(2, 0, 2, 0, "x")))
    # Either the old symbols are kept (stale) or the region is re-read as tree-sitter recovered it.
    if broken.stale:
        assert {"A", "A.m", "A.n"} <= {s.qualname for s in broken.symbols}
    else:
        assert _key(broken) == _key(summarize(doc))
    fixed = resummarize(doc, broken, doc.apply(Edit(2, 0, 2, 1, "")))
    assert _key(fixed) == _key(summarize(doc))
