"""The one reading of Python text: headers, blanking, logical lines with their physical lines,
blocks by indentation, top-level pieces and the per-piece cache."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from glm5_lsp import pysource
from glm5_lsp.pysource import block_tree, header, innermost_block, logical_lines, read_lines, top_level_pieces

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_headers_with_parameters_annotations_and_bodies() -> None:
    found = header("    async def f(self, a=(1, 2), *, b: dict[str, int] = {}) -> Dict[str, int]: return {a: b}")
    assert found is not None and (found.kind, found.name) == ("def", "f")
    assert found.params == "self, a=(1, 2), *, b: dict[str, int] = {}"
    assert found.end == len("    async def f(self, a=(1, 2), *, b: dict[str, int] = {}) -> Dict[str, int]:")
    base = header("class C(Base, metaclass=M):")
    assert base is not None and base.params == "Base, metaclass=M" and base.end == len("class C(Base, metaclass=M):")
    assert header("define = 1") is None and header("x = 1") is None
    broken = header("def f(a, b")  # typed half-way: the rest of the line
    assert broken is not None and broken.params == "a, b" and broken.end == len("def f(a, b")


def test_blanking_keeps_code_and_drops_strings_and_comments() -> None:
    assert pysource.blank('x = f("a(b", \'c\') # call(\ny = """\n(\n"""\n') == "x = f(0, 0) \ny = 0\n"


def test_logical_lines_know_their_physical_lines() -> None:
    text = 'def f(a,\n      b):\n    s = """one\ntwo\n"""\n    return (s +\n            a)\n\n\nx = 1 \\\n    + 2\n'
    lines = logical_lines(text)
    assert [(line.indent, line.code, line.first, line.last) for line in lines] == [
        (0, "def f(a,       b):", 0, 1),
        (4, "s = 0", 2, 4),
        (4, "return (s +             a)", 5, 6),
        (0, "x = 1 \\     + 2", 9, 10),
        (0, "", 11, 11),
    ]
    assert read_lines("x = (1,\n")[1] is False and read_lines('s = """\n')[1] is False
    assert read_lines("x = 1\n")[1] is True


@pytest.mark.parametrize("module", ["argparse.py", "textwrap.py", "dataclasses.py", "json/decoder.py"])
def test_physical_spans_match_the_real_file(module: str) -> None:
    path = STDLIB / module
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    text = path.read_text(encoding="utf-8")
    physical = text.split("\n")
    previous = -1
    for line in logical_lines(text)[:-1]:
        assert previous < line.first <= line.last < len(physical)
        first = physical[line.first]
        assert first.strip() and pysource.blank(first).strip()[:1] == line.code[:1], (line, first)
        previous = line.last


def test_blocks_follow_indentation_across_strings_and_continuations() -> None:
    text = (
        "class A:\n"
        "    @property\n"
        "    def x(self):\n"
        '        """Doc\n'
        "not code: def fake():\n"
        '        """\n'
        "        return (1,\n"
        "2)\n"
        "\n"
        "    y = 2\n"
        "def g(): return 3\n"
    )
    top = block_tree(logical_lines(text))
    assert [(b.kind, b.name, b.first, b.last) for b in top] == [("class", "A", 0, 9), ("def", "g", 10, 10)]
    method = top[0].children[0]
    assert (method.name, method.decorators, method.first, method.last, method.parent) == ("x", ["property"], 2, 7, top[0])
    assert [line.code for line in top[1].lines] == [" return 3"]
    lines = logical_lines(text)

    def inner(line: int) -> str | None:
        found = innermost_block(lines, line)
        return None if found is None else found.name

    assert [inner(n) for n in range(11)] == ["A", "A", "x", "x", "x", "x", "x", "x", "A", "A", "g"]


def test_top_level_pieces_start_definitions_at_their_decorators() -> None:
    code = "import os\n@a\n@b(1)\ndef f():\n    pass\nclass C:\n    def m(self):\n        pass\n"
    pieces = top_level_pieces(code)
    assert "".join(pieces) == code
    assert [p.split("\n", 1)[0] for p in pieces] == ["import os", "@a", "class C:"]


def test_one_cache_of_facts_per_piece() -> None:
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text)

    assert pysource.piece("x = 1\n").fact(count) == 6
    assert pysource.piece("x = 1\n").fact(count) == 6
    assert calls == ["x = 1\n"]
