"""names_in_scope: the names a Python expression can read at the cursor, from the text alone."""

from __future__ import annotations

import random
import re
import sysconfig
from pathlib import Path

import pytest

from glm5_lsp.pynames import scope
from glm5_lsp.pynames.scope import ALWAYS, names_in_scope
from glm5_lsp.pysource import logical_lines


def own(before: str, after: str = "") -> set[str]:
    return names_in_scope(before, after) - ALWAYS


def test_locals_of_other_functions_are_not_in_scope() -> None:
    code = "import os\nLIMIT = 3\n\ndef f(a, *args, b=LIMIT, **kw):\n    total = a\n    "
    assert own(code) >= {"os", "LIMIT", "f", "a", "args", "b", "kw", "total"}
    later = code + "return total\n\ndef g(x):\n    y = x\n    "
    assert "total" not in own(later) and "a" not in own(later)
    assert own(later) >= {"os", "LIMIT", "f", "g", "x", "y"}


def test_a_dedented_cursor_line_leaves_the_block() -> None:
    assert "inner" not in own("def f():\n    inner = 1\n")
    assert "inner" in own("def f():\n    inner = 1\n    ")
    assert "inner" not in own("def f():\n    inner = 1\nx = ")


def test_class_bodies_are_hidden_from_their_methods() -> None:
    body = "class C:\n    size = 1\n    def m(self, n):\n        "
    assert "size" not in own(body) and {"self", "n", "C"} <= own(body)
    assert "size" in own("class C:\n    size = 1\n    other = ")  # directly in the class body
    assert "m" in own("class C:\n    def m(self):\n        pass\n    x = ")


def test_nested_functions_see_the_enclosing_functions_locals() -> None:
    code = "def outer(p):\n    shared = p\n    def inner(q):\n        return "
    assert {"outer", "p", "shared", "inner", "q"} <= own(code)


def test_strings_comments_and_attributes_bind_nothing() -> None:
    code = ('"""Module docstring about widgets.\n\ndef fake():\n"""\n# a comment naming gadgets\n'
            "x = 'def trap(): pass'\nself.attr = 1\nobj.method(arg)\n")
    names = own(code)
    assert {"x", "self", "obj", "arg"} <= names
    assert not names & {"widgets", "gadgets", "trap", "fake", "attr", "method", "docstring"}


def test_bracketed_continuation_lines_do_not_close_blocks() -> None:
    code = "def f(alpha,\nbeta):\n    value = call(\n1,\n)\n    "
    assert {"alpha", "beta", "value", "call"} <= own(code)
    assert [(line.indent, line.code) for line in logical_lines("x = (1,\n2)\ny = 3\n")[:2]] == [
        (0, "x = (1, 2)"), (0, "y = 3")]


def test_module_names_after_the_cursor_count_but_not_their_locals() -> None:
    before = "def f():\n    return "
    after = "\n\nHELPER = 1\n\nclass Later:\n    field = 2\n\ndef g(secret):\n    hidden = 3\n"
    names = own(before, after)
    assert {"HELPER", "Later", "g"} <= names
    assert not names & {"field", "secret", "hidden"}


def test_an_unterminated_string_at_the_cursor_does_not_hide_the_rest() -> None:
    assert {"name"} <= own("name = 1\nprint('open ")


STDLIB = Path(sysconfig.get_paths()["stdlib"])
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@pytest.mark.parametrize("module", ["argparse.py", "textwrap.py", "json/decoder.py"])
def test_every_name_jedi_completes_at_a_read_position_is_in_scope(module: str) -> None:
    """The oracle: at lines cut two characters into a name that follows ``=`` or ``(`` or
    ``return`` (where the name is only read), each identifier jedi completes is found here too."""
    jedi = pytest.importorskip("jedi")
    path = STDLIB / module
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    spots = [(n, m.start(1)) for n, line in enumerate(lines)
             for m in re.finditer(r"(?:= |\(|return )([A-Za-z_]\w{2,})", line)]
    rng = random.Random(7)
    checked = 0
    for number, start in rng.sample(spots, 8):
        column = start + 2
        before = "\n".join(lines[:number] + [lines[number][:column]])
        word = before[-2:]
        if not _IDENT.fullmatch(word):
            continue
        expected = {c.name for c in jedi.Script(before, path=str(path)).complete(number + 1, column)
                    if c.name.startswith(word) and _IDENT.fullmatch(c.name) and c.name != "ellipsis"}
        after = "\n" + "\n".join(lines[number + 1:])
        missing = expected - names_in_scope(before[:-2], after)
        assert not missing, (lines[number], missing)
        checked += 1
    assert checked >= 4


def _whole(before: str, after: str) -> tuple[frozenset[str], str]:
    """``scope_at`` reading the text in one go (no pieces kept): the reference for the piecewise read."""
    original = scope.top_level_pieces
    scope.top_level_pieces = lambda text: [text]
    try:
        return scope.scope_at.__wrapped__(before, after)
    finally:
        scope.top_level_pieces = original


@pytest.mark.parametrize("module", ["argparse.py", "textwrap.py", "dataclasses.py"])
def test_reading_the_file_in_kept_pieces_gives_what_one_read_gives(module: str) -> None:
    """Cursors anywhere, in the real file and in copies broken by an unclosed triple quote, bracket
    or line continuation (so pieces must be read together), give the same names and block kind."""
    path = STDLIB / module
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    text = path.read_text(encoding="utf-8")
    rng = random.Random(3)
    for case in range(24):
        damaged = text
        if case % 2:
            at = rng.randrange(len(text))
            damaged = text[:at] + rng.choice(['"""', "'''", "(", "[", "\\\n", "'''x"]) + text[at:]
        cursor = rng.randrange(len(damaged))
        before, after = damaged[:cursor], damaged[cursor:]
        assert scope.scope_at.__wrapped__(before, after) == _whole(before, after), (case, cursor)


def test_pieces_are_cut_at_top_level_definitions_only() -> None:
    code = "import os\n\n@dec\ndef f():\n    def g():\n        pass\nclass C:\n    x = 1\nasync def h():\n    pass\n"
    pieces = scope.top_level_pieces(code)
    assert "".join(pieces) == code
    # a decorated definition starts at its first decorator (as the compile provider cuts it)
    assert [p.split("\n", 1)[0] for p in pieces] == ["import os", "@dec", "class C:", "async def h():"]
    assert scope.top_level_pieces("x = 1") == ["x = 1"]
    # A piece left inside a string is read with the next one: the string's words are no names.
    names = own('X = 1\n"""\ndef fake():\n    pass\n"""\ndef real():\n    ', "")
    assert {"X", "real"} <= names and "fake" not in names
    # So is one that ends open: a bracket, or a backslash right before a top-level definition.
    for broken in ("x = 1 + \\\ndef f(a):\n    b = a\n", "x = (\ndef f(a):\n    b = a\n"):
        for cut in range(len(broken) + 1):
            before, after = broken[:cut], broken[cut:] + "y = 2\n"
            assert scope.scope_at.__wrapped__(before, after) == _whole(before, after), (broken, cut)
