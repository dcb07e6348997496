"""``self`` attributes read from the text (``glm5_lsp.pynames.members``), checked against jedi."""

from __future__ import annotations

import os
import re
import sysconfig
import textwrap
from pathlib import Path

import pytest

from glm5_lsp.pynames.members import self_attributes
from glm5_lsp.repair.monitor import TextAttributes

SOURCE = textwrap.dedent('''\
    import collections


    class Base:
        kind = "base"

        def __init__(self, size):
            self.size = size
            self._items, self.count = [], 0

        @property
        def empty(self):
            return not self._items

    class Child(Base):
        limit: int = 10

        def add(self, item):
            self._items.append(item)
            self.last = item

            class Inner:
                def method(self):
                    self.inner_only = 1

            def helper():
                return self.from_closure

        @staticmethod
        def make(first):
            return first.

        def other(me, x):
            me.

    class Remote(collections.OrderedDict):
        def get_it(self):
            self.

    class Failure(ValueError):
        def explain(self):
            self.
''')


def _at(marker: str, receiver: str = "self") -> set[str] | None:
    """Attributes at the end of the line containing ``marker`` (``receiver.`` appended there)."""
    start = SOURCE.index(marker)
    end = SOURCE.index("\n", start)
    before = SOURCE[:end]
    if not before.endswith(receiver + "."):
        before += "\n" + " " * 12 + receiver + "."
        return self_attributes(before, SOURCE[end:], receiver)
    return self_attributes(before, SOURCE[end:], receiver)


def test_a_methods_self_has_what_its_class_and_bases_bind() -> None:
    names = _at("self.last = item")
    assert names is not None
    assert {"size", "_items", "count", "empty", "kind", "limit", "add", "last", "from_closure",
            "make", "other", "__dict__", "__class__"} <= names
    assert "inner_only" not in names  # the nested class's self is another object
    assert "Inner" not in names  # a class local to a method is no member
    assert "item" not in names


def test_receivers_the_text_cannot_vouch_for_answer_none() -> None:
    assert _at("return first.", "first") is None  # a staticmethod's first parameter is no instance
    assert _at("self.last = item", "item") is None  # not the method's first parameter
    assert _at("def get_it(self):") is None  # the base class is imported


def test_the_first_parameter_is_the_receiver_whatever_its_name() -> None:
    names = _at("def other(me, x):", "me")
    assert names is not None and {"size", "add", "other"} <= names


def test_a_builtin_base_brings_its_attributes() -> None:
    names = _at("def explain(self):")
    assert names is not None and {"args", "with_traceback", "add_note", "__notes__", "explain"} <= names


def test_text_attributes_falls_back_for_other_receivers() -> None:
    asked: list[str] = []
    provider = TextAttributes("\n", lambda text: asked.append(text) or ["fallback"])
    assert provider("x = os.path.") == ["fallback"]
    assert provider("def f():\n    value.") == ["fallback"]
    assert len(asked) == 2
    method = "class A:\n    def f(self):\n        self.x = 1\n        self."
    assert "x" in provider(method) and len(asked) == 2


STDLIB = sysconfig.get_paths()["stdlib"]


@pytest.mark.parametrize("module", ["argparse.py", "textwrap.py", "configparser.py"])
def test_every_attribute_jedi_completes_is_found(module: str) -> None:
    """At the first line of a few methods of real modules: jedi's ``self.`` completions are a
    subset of the text's answer, which is at most a few names larger."""
    jedi = pytest.importorskip("jedi")
    from glm5_lsp.pynames.jedi import in_process_environment

    path = os.path.join(STDLIB, module)
    text = Path(path).read_text(encoding="utf-8")
    methods = list(re.finditer(r"\n(    def \w+\(self[^\n]*\):\n)( +)", text))[1::3][:4]
    checked = 0
    for found in methods:
        before = text[: found.end()] + "self."
        after = "\n" + found.group(2) + text[found.end():]
        names = self_attributes(before, after, "self")
        if names is None:
            continue
        lines = before.split("\n")
        script = jedi.Script(before + after, path=path, environment=in_process_environment())
        expected = {c.name for c in script.complete(len(lines), len(lines[-1]))}
        assert expected <= names, (found.group(1), sorted(expected - names))
        assert len(names - expected) <= 12, sorted(names - expected)
        checked += 1
    assert checked >= 2
