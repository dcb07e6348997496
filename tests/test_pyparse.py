"""Parsing to syntax trees from many threads at once (``glm5_lsp.pyparse``)."""

from __future__ import annotations

import ast
import gc
import re
import threading
import time
from pathlib import Path

import pytest

from glm5_lsp import pyparse

PACKAGE = Path(__file__).resolve().parent.parent / "glm5_lsp"
SOURCE = "\n".join(f"def f{i}(a, b):\n    return [x + {i} for x in (a, b) if x]" for i in range(300))


class _Cycle:
    """Garbage only the collector frees; its finalizer hands the interpreter to another thread."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def _parse_while_collecting(parse, seconds: float) -> list[str]:
    """Three threads parse while a fourth makes garbage whose collection switches threads mid-parse
    (how CPython 3.11's shared depth counter goes wrong: python/cpython#106905)."""
    errors: list[str] = []
    stop = time.monotonic() + seconds

    def churn() -> None:
        while time.monotonic() < stop and not errors:
            _Cycle()
            time.sleep(0)

    def work() -> None:
        while time.monotonic() < stop and not errors:
            try:
                parse(SOURCE)
            except SystemError as error:
                errors.append(str(error))

    thresholds = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=work) for _ in range(3)] + [threading.Thread(target=churn)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*thresholds)
    return errors


def test_parses_on_many_threads_never_fail_with_the_depth_mismatch() -> None:
    # ast.parse itself failed here within about two seconds on CPython 3.11.7, every try
    assert _parse_while_collecting(pyparse.parse, 3.0) == []


def test_parse_is_ast_parse() -> None:
    assert ast.dump(pyparse.parse(SOURCE)) == ast.dump(ast.parse(SOURCE))
    assert ast.dump(pyparse.parse("x + 1", mode="eval")) == ast.dump(ast.parse("x + 1", mode="eval"))
    with pytest.raises(SyntaxError) as caught:
        pyparse.parse("def f(:\n", filename="broken.py")
    assert caught.value.filename == "broken.py"
    assert pyparse.literal_eval(" ['a', 'b']") == ["a", "b"]
    with pytest.raises(ValueError):
        pyparse.literal_eval("f()")


def test_a_parse_that_meets_another_parsers_mismatch_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = compile

    def flaky(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=48, after=45)")
        return real(*args, **kwargs)

    monkeypatch.setattr("builtins.compile", flaky)
    assert isinstance(pyparse.parse("x = 1"), ast.Module)
    assert calls == ["x = 1", "x = 1"]


def test_the_package_parses_to_trees_only_through_pyparse() -> None:
    direct = re.compile(r"\bast\.(parse|literal_eval)\(|PyCF_ONLY_AST")
    found = [f"{path.relative_to(PACKAGE)}:{number}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "pyparse.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if direct.search(line)]
    assert found == []


def test_exclusive_holds_every_parse_of_the_package_until_it_ends() -> None:
    parsed = threading.Event()

    def parse() -> None:
        pyparse.parse("x = 1")
        parsed.set()

    with pyparse.exclusive():
        thread = threading.Thread(target=parse)
        thread.start()
        assert not parsed.wait(0.3)
    assert parsed.wait(5)
    thread.join()

