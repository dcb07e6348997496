"""Syntax errors fixed without a model: each case is broken code, the fix expected first and its title.

Every case goes through the real checkers (compile in its helper process, ruff) and the fixer's
ranking, so a case fails if the parser module proposes nothing, proposes the wrong place, or the
ranking prefers a valid but wrong candidate.
"""

from __future__ import annotations

import pytest

from glm5_lsp.checks.providers import default_runner
from glm5_lsp.quickfix import QuickFixer
from glm5_lsp.quickfix.parser import syntax_candidates

RUNNER = default_runner("python")


def best(code: str, path: str = "case.py", language: str = "python"):
    runner = RUNNER if language == "python" else default_runner(language)
    fixes = QuickFixer(runner, path, language, seconds=10.0).fixes(code)
    assert fixes, f"no fix for {code!r}"
    assert fixes[0].preferred and not any(f.preferred for f in fixes[1:])
    return fixes[0]


@pytest.mark.parametrize("broken, fixed, title", [
    # "expected ':'" after a header, and after a multi-line one
    ("def f(x)\n    return x\n", "def f(x):\n    return x\n", "Insert missing ':'"),
    ("def f(x):\n    for y in x  # each\n        print(y)\n", "def f(x):\n    for y in x:  # each\n        print(y)\n",
     "Insert missing ':'"),
    ("def f(a,\n      b)\n    return a\n", "def f(a,\n      b):\n    return a\n", "Insert missing ':'"),
    # "'(' was never closed": at the end of the statement, before a header's colon, before a comma
    ("def f(x):\n    y = g(x, 1\n    return y\n\n\ndef g(a, b):\n    return a\n",
     "def f(x):\n    y = g(x, 1)\n    return y\n\n\ndef g(a, b):\n    return a\n", "Insert missing ')'"),
    ("def f(r):\n    for _ in range(r - 1:\n        pass\n", "def f(r):\n    for _ in range(r - 1):\n        pass\n",
     "Insert missing ')'"),
    ("def f(xs):\n    return [\n        len(xs,\n        max(xs),\n    ]\n",
     "def f(xs):\n    return [\n        len(xs),\n        max(xs),\n    ]\n", "Insert missing ')'"),
    ("def f(x, g):\n    y = g(\n        x,\n    .path\n    return y\n",
     "def f(x, g):\n    y = g(\n        x,\n    ).path\n    return y\n", "Insert missing ')'"),
    ("def f(x):\n    y = [x, 1\n    return y\n", "def f(x):\n    y = [x, 1]\n    return y\n", "Insert missing ']'"),
    ("def f(x):\n    y = {x: 1\n    return y\n", "def f(x):\n    y = {x: 1}\n    return y\n", "Insert missing '}'"),
    ("def f(n):\n    x = abs(n[0]-n[1\n    return x\n", "def f(n):\n    x = abs(n[0]-n[1])\n    return x\n",
     "Insert missing '])'"),
    ("def f(x):\n    return [x)\n", "def f(x):\n    return [x]\n", "Replace ')' with ']'"),
    ("def f(x):\n    return x)\n", "def f(x):\n    return x\n", "Remove unmatched ')'"),
    # an unterminated string: closed where a string ends, not where it merely compiles
    ("def f(x):\n    return x.split('abc, 'd')\n", "def f(x):\n    return x.split('abc', 'd')\n", "Insert missing \"'\""),
    ('def f(x):\n    return x.split("1)\n', 'def f(x):\n    return x.split("1")\n', "Insert missing '\"'"),
    ('def f(a, b):\n    return f"assert {a} == {b}\n', 'def f(a, b):\n    return f"assert {a} == {b}"\n',
     "Insert missing '\"'"),
    ('def f(m):\n    return ".join(m)\n', 'def f(m):\n    return "".join(m)\n', "Insert missing '\"'"),
    ('def f(d):\n    return d["key]\n', 'def f(d):\n    return d["key"]\n', "Insert missing '\"'"),
    ("def f(res):\n    return 'res\n", "def f(res):\n    return res\n", "Remove the stray \"'\""),
    # indentation
    ("def f(x):\n    y = 1\n        return y\n", "def f(x):\n    y = 1\n    return y\n", "Dedent line 3 to column 4"),
    ("def f(x):\n    if x:\n        y = 1\n      return y\n", "def f(x):\n    if x:\n        y = 1\n    return y\n",
     "Dedent line 4 to column 4"),
    ("def f(x):\n    if x:\n    return 1\n", "def f(x):\n    if x:\n        return 1\n", "Indent line 3 to column 8"),
    ("import contextlib\n\n\ndef f(t):\n        with contextlib.suppress(Exception):\n        return t\n",
     "import contextlib\n\n\ndef f(t):\n    with contextlib.suppress(Exception):\n        return t\n",
     "Dedent line 5 to column 4"),
    ("class A:\ndef f(self):\n    return 1\n", "class A:\n    def f(self):\n        return 1\n",
     "Indent lines 2-3 to column 4"),
    ("def f(x):\n    if x:\n        a = 1\n        elif x > 2:\n        a = 2\n    return x\n",
     "def f(x):\n    if x:\n        a = 1\n    elif x > 2:\n        a = 2\n    return x\n", "Dedent line 4 to column 4"),
    ('def f(p):\n        """Doc."""\n\n    def g():\n        return p\n\n    return g\n',
     'def f(p):\n    """Doc."""\n\n    def g():\n        return p\n\n    return g\n', "Dedent line 2 to column 4"),
    # a comma, and '==' for '='
    ("def f(x):\n    return [1 2]\n", "def f(x):\n    return [1, 2]\n", "Insert missing ','"),
    ("def f(x):\n    if x = 1:\n        return 2\n", "def f(x):\n    if x == 1:\n        return 2\n", "Replace '=' with '=='"),
    ("def f(x, y):\n    if x and y = 1:\n        return 2\n", "def f(x, y):\n    if x and y == 1:\n        return 2\n",
     "Replace '=' with '=='"),
    ("def f(i, p, v):\n    if i=p: v.append(i)\n", "def f(i, p, v):\n    if i==p: v.append(i)\n", "Replace '=' with '=='"),
    ("def f(p, q):\n    if (p\n            and q() = 0):\n        return 1\n",
     "def f(p, q):\n    if (p\n            and q() == 0):\n        return 1\n", "Replace '=' with '=='"),
    # a dict's key without its ':' (a set's item gets the comma)
    ("d = {'a' 1, 'b': 2}\n", "d = {'a': 1, 'b': 2}\n", "Insert missing ':'"),
    ("s = {1 2}\n", "s = {1, 2}\n", "Insert missing ','"),
    # other languages' spellings and Python 2's statements
    ("def f(x):\n    if x > 0:\n        return 1\n    else if x < 0:\n        return -1\n    return 0\n",
     "def f(x):\n    if x > 0:\n        return 1\n    elif x < 0:\n        return -1\n    return 0\n",
     "Replace 'else if' with 'elif'"),
    ("def f(x):\n    print \"value\", x  # shown\n    return x\n",
     "def f(x):\n    print(\"value\", x)  # shown\n    return x\n", "Call print(...)"),
    ("def f(x):\n    try:\n        return int(x)\n    except ValueError, error:\n        return error\n",
     "def f(x):\n    try:\n        return int(x)\n    except ValueError as error:\n        return error\n",
     "Replace ', error' with ' as error'"),
    ("def f(x):\n    try:\n        return x[0]\n    except KeyError, IndexError:\n        return None\n",
     "def f(x):\n    try:\n        return x[0]\n    except (KeyError, IndexError):\n        return None\n",
     "Parenthesize the exception types"),
    # a misspelled keyword, and another language's word for one
    ("improt os\n\nprint(os.sep)\n", "import os\n\nprint(os.sep)\n", "Replace 'improt' with 'import'"),
    ("def f(x):\n    retrun x + 1\n", "def f(x):\n    return x + 1\n", "Replace 'retrun' with 'return'"),
    ("def f(x):\n    if x:\n        return 1\n    esle:\n        return 2\n",
     "def f(x):\n    if x:\n        return 1\n    else:\n        return 2\n", "Replace 'esle' with 'else'"),
    ("def f(xs):\n    fro x in xs:\n        print(x)\n", "def f(xs):\n    for x in xs:\n        print(x)\n",
     "Replace 'fro' with 'for'"),
    ("deff f(x):\n    return x\n", "def f(x):\n    return x\n", "Replace 'deff' with 'def'"),
    ("function f(x):\n    return x\n", "def f(x):\n    return x\n", "Replace 'function' with 'def'"),
    # other languages' operators
    ("def f(a, b):\n    if a && b:\n        return 1\n    return 0\n",
     "def f(a, b):\n    if a and b:\n        return 1\n    return 0\n", "Replace '&&' with 'and'"),
    ("def f(a, b):\n    return a || b  # '||' in a comment stays\n",
     "def f(a, b):\n    return a or b  # '||' in a comment stays\n", "Replace '||' with 'or'"),
    ("def f(a):\n    if !a:\n        return 1\n    return 0\n", "def f(a):\n    if not a:\n        return 1\n    return 0\n",
     "Replace '!' with 'not '"),
    ("def f(n):\n    i = 0\n    while i < n:\n        i++\n    return i\n",
     "def f(n):\n    i = 0\n    while i < n:\n        i += 1\n    return i\n", "Replace 'x++' with 'x += 1'"),
    ("def f(x):\n    y := x + 1\n    return y\n", "def f(x):\n    y = x + 1\n    return y\n", "Replace ':=' with '='"),
    ("def f(x):\n    let y = x + 1\n    return y\n", "def f(x):\n    y = x + 1\n    return y\n", "Remove the declaration keyword"),
    # a C-like block: its braces, not a set display after a ':'
    ("def f(xs):\n    for x in xs {\n        print(x)\n    }\n    return len(xs)\n",
     "def f(xs):\n    for x in xs:\n        print(x)\n    return len(xs)\n", "Replace the braces with ':'"),
    # an f-string's brace
    ('def f(name):\n    return f"hello {name"\n', 'def f(name):\n    return f"hello {name}"\n', "Insert missing '}'"),
])
def test_syntax_errors_are_fixed_where_they_belong(broken: str, fixed: str, title: str) -> None:
    fix = best(broken)
    assert fix.text == fixed
    assert fix.title == title
    assert fix.clean() and fix.kind == "syntax" and fix.source == "parser"


def test_a_missing_token_reported_by_tree_sitter_is_inserted_in_other_languages() -> None:
    fix = best("function f(x) {\n  return g(x;\n}\n", path="case.js", language="javascript")
    assert fix.text == "function f(x) {\n  return g(x);\n}\n" and fix.source == "tree-sitter"


def test_a_file_with_two_syntax_errors_gets_both_fixed_in_one_chain() -> None:
    fix = best("def f(x)\n    return x\n\n\ndef g(y):\n    return [y, 1\n")
    assert fix.text == "def f(x):\n    return x\n\n\ndef g(y):\n    return [y, 1]\n"
    assert fix.kind == "several" and fix.steps == ("Insert missing ':'", "Insert missing ']'")
    assert fix.title == "Insert missing ':'; Insert missing ']'"


def test_nothing_is_proposed_for_what_is_not_a_syntax_error() -> None:
    code = "def f(x):\n    return ojb\n"
    assert syntax_candidates(code, RUNNER.diagnose(code, "case.py", "python").diagnostics, "python") == []
    assert QuickFixer(RUNNER, "case.py", "python").fixes("def f(x):\n    return x\n") == []


def test_a_candidate_that_only_moves_the_error_earlier_is_not_kept() -> None:
    """``"FizzBuzz)"`` compiles no further than ``"FizzBuzz)``: the quote must go before the ``)``."""
    code = 'def f(a):\n    a.append("FizzBuzz)\n    a.append("Fizz")\n'
    fixes = QuickFixer(RUNNER, "case.py", "python").fixes(code)
    assert all('"FizzBuzz)"' not in f.text for f in fixes)
    assert fixes[0].text == 'def f(a):\n    a.append("FizzBuzz")\n    a.append("Fizz")\n'


@pytest.mark.parametrize("broken, fixed, title", [
    # two errors on one line: mending either alone stops at the other on the same line, so neither
    # got past the compile-only check and nothing was proposed
    ("def f(total):\n    print('total: \n    return total\n", "def f(total):\n    print('total: ')\n    return total\n",
     "Insert missing \"'\"; Insert missing ')'"),
    ("def f(a, b):\n    if a = 0 and b = 1:\n        return 1\n    return 0\n",
     "def f(a, b):\n    if a == 0 and b == 1:\n        return 1\n    return 0\n", "Replace '=' with '=='; Replace '=' with '=='"),
])
def test_two_errors_on_one_line_are_fixed_together(broken: str, fixed: str, title: str) -> None:
    fix = best(broken)
    assert fix.text == fixed
    assert fix.title == title
    assert fix.clean() and fix.kind == "syntax"
