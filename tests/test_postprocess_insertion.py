"""Insertion text that fits the cursor (issue 21, point 2): the shared post-processing every front
end's text passes through (``glm5_lsp.postprocess.tidy``).

In the middle of a line no leading run of spaces or tabs (one space where the language wants one);
on an empty indented line the indentation is not written again; later lines of a body brought to
the block's indentation; a bracket the user opened on the cursor's line not left open.
"""

from __future__ import annotations

import pytest

from glm5_lsp.postprocess import close_line_brackets, fit_cursor, tidy, wants_space

MIDDLE = [
    # (line before the cursor, model text, expected)
    ("    x = self.", "        self", "self"),
    ("    x = self.", "\tname", "name"),
    ("    x =", "    foo", " foo"),
    ("    x =", "foo", " foo"),  # the space the user has not typed
    ("    x = ", "  foo", "foo"),
    ("    f(a,", "b)", " b)"),
    ("    f(a,", "      b)", " b)"),
    ("    f(a=", "   1)", "1)"),  # PEP 8: no spaces around a keyword argument's '='
    ("    return", "  x", " x"),
    ("    return x", "    # done", " # done"),  # one space, never a run
    ("    y = x", "   + 1", " + 1"),
    ("    y = -", " 1", "1"),
    ("    y = a[1:", " 2]", "2]"),
    ("    d = {'a':", " 1}", " 1}"),
    ("    s = foo", "   (1)", "(1)"),
    ("    s = foo", "   .bar()", ".bar()"),
    ("    s = foo", "   [0]", "[0]"),
    ("    return", "   (a, b)", " (a, b)"),
    ("import", "   os", " os"),
    ("    x +", " = 1", "= 1"),
    ("    f(*", " args)", "args)"),
    ("    f(x, *", " args)", "args)"),
]


@pytest.mark.parametrize("before, text, expected", MIDDLE)
def test_text_in_the_middle_of_a_line_never_starts_with_a_run_of_white_space(before: str, text: str,
                                                                             expected: str) -> None:
    prefix = "def f(a):\n" + before
    got = tidy(text, prefix, "\n", multiline=False, language="python")
    assert got == expected
    assert not got[:2].isspace() and not got.startswith("\t")
    assert tidy(got, prefix, "\n", multiline=False, language="python") == got  # idempotent


def test_the_issue_examples() -> None:
    """``self.`` -> ``        self``; ``formatter.add_arguments(`` -> ``        # Application``;
    ``end = _w(`` -> ``        # type`` (which Tab inserted, leaving the paren open)."""
    assert tidy("        self", "    def f(self):\n        self.", "\n", multiline=False, language="python") == "self"
    assert tidy("        # Application", "        formatter.add_arguments(", "\n", multiline=False,
                language="python") == ""
    assert tidy("        # type", "        end = _w(", "\n", multiline=False, language="python") == ""
    # an auto-closed paren after the cursor: the comment would swallow it, so it goes too
    assert tidy("  # type", "        end = _w(", ")\n", multiline=False, language="python") == ""


@pytest.mark.parametrize("prefix, text, expected", [
    ("def f():\n    ", "    return 1", "return 1"),
    ("def f():\n\t", "\treturn 1", "return 1"),
    ("def f():\n    x = 1\n    ", "    return x", "return x"),
    ("class A:\n    def f(self):\n        ", "        return self", "return self"),
    # the previous line is a comment ending in ':': no block opens
    ("def f():\n    # note:\n    ", "    return 1", "return 1"),
    # the cursor is short of the block the line above opens: the model's indentation is the line's
    ("def f(x):\n    if x:\n    ", "    return 1", "    return 1"),
])
def test_on_an_empty_indented_line_the_indent_is_not_repeated(prefix: str, text: str, expected: str) -> None:
    got = tidy(text, prefix, "\n", multiline=False, language="python")
    assert got == expected
    assert tidy(got, prefix, "\n", multiline=False, language="python") == got


def test_at_column_zero_the_text_keeps_its_own_indentation() -> None:
    assert fit_cursor("    return 1", "def f():\n", "python") == "    return 1"


@pytest.mark.parametrize("text, expected", [
    # first line at the cursor, later lines over-indented though nothing opens a block: brought back
    ("        # comment\n        return x", "# comment\n    return x"),
    ("    x = 1\n        return x", "x = 1\n    return x"),
    # a block the first line opens keeps its body deeper
    ("for i in x:\n        print(i)", "for i in x:\n        print(i)"),
    # a bracket the first line leaves open: the continuation lines are the model's to place
    ("y = f(a,\n          b)", "y = f(a,\n          b)"),
    # lines already at the block's indentation stay
    ("x = 1\n    return x", "x = 1\n    return x"),
])
def test_a_generated_body_takes_the_blocks_indentation(text: str, expected: str) -> None:
    prefix = "def f(x):\n    "
    got = tidy(text, prefix, "\n", multiline=True, language="python")
    assert got == expected
    assert tidy(got, prefix, "\n", multiline=True, language="python") == got
    compile(prefix + got + "\n", "body.py", "exec")


@pytest.mark.parametrize("before, text, rest, expected", [
    ("    end = _w(", "s, end", "", "s, end)"),  # nothing after the cursor: closed
    ("    end = _w(", "s, end", ")", "s, end"),  # the editor closed it already
    ("    end = _w(", "s, end  # why", "", "s, end)"),  # the comment would swallow the closer
    ("    x = [f(", "a", "", "a)]"),
    ("    x = f(", "a) + g(b)", "", "a) + g(b)"),  # the text closes it
    ("    if f(x", " and g(y)", "", " and g(y))"),
    ("    x = 1", "  # fine", "", "  # fine"),  # nothing open: a comment is fine
    ("    x = f(", "# only a comment", "", ""),
    ("    end = _w(", "s, end +", "", "s, end)"),  # the dangling operator is cut before the closer
    ("    end = _w(", "s, ", "", "s)"),
    ("    end = _w(", "s.", "", "s)"),
])
def test_a_bracket_the_user_opened_on_the_line_is_not_left_open(before: str, text: str, rest: str,
                                                                 expected: str) -> None:
    prefix = "def g(s, y):\n" + before
    assert close_line_brackets(text, prefix, rest + "\n", "python") == expected
    got = tidy(text, prefix, rest + "\n", multiline=False, language="python")
    assert got.lstrip() == expected.lstrip()
    assert tidy(got, prefix, rest + "\n", multiline=False, language="python") == got


def test_a_multi_line_text_may_close_the_users_bracket_on_a_later_line() -> None:
    prefix = "def g(a):\n    return f(\n"
    text = "        a,\n        b,\n    )"
    assert close_line_brackets(text, "def g(a):\n    return f(", "\n", "python") == text
    assert tidy(text, prefix, "\n", multiline=True, language="python") == text


@pytest.mark.parametrize("before, text, expected", [
    ("x = y.", "z", False), ("f(", "a", False), ("x = a", "b", True), ("x =", "1", True),
    ("f(k=", "1", False), ("a[1:", "2", False), ("{'a':", "1", True), ("x = -", "1", False),
    ("x = a -", "1", True), ("f", "(1)", False), ("return", "(1)", True), ("x", ".y", False),
    ("x", ",", False), ("x +", "=", False), ("@", "decorator", False),
])
def test_wants_space(before: str, text: str, expected: bool) -> None:
    assert wants_space(before, text, "python") is expected


def test_a_long_file_whose_scanned_end_starts_inside_a_docstring_keeps_its_brackets() -> None:
    """The open-bracket scan reads the prefix's last few thousand characters; where that window
    began inside a docstring, its closing quotes opened a string and the ``(`` the user typed on the
    cursor's line looked quoted, so ``self):`` lost its ``)`` and ``:`` (found in sortedcontainers)."""
    docstring = '    def first(self):\n        """' + "Return the first item, in words.\n        " * 150 + '"""\n'
    prefix = "class Bag:\n" + docstring + "        return 1\n\n    def __reversed__("
    suffix = '\n        """Return a reverse iterator."""\n        return iter(self)\n'
    assert tidy("self):", prefix, suffix, multiline=False, language="python") == "self):"
    assert tidy("self, key):", "x = 1\n" * 900 + prefix, suffix, multiline=False, language="python") == "self, key):"


def test_no_closer_is_appended_inside_a_string_the_answer_opens() -> None:
    """``self.flakes('''`` opens a call and a triple-quoted string that goes on below: a ``)``
    appended after it would be inside the string (found on pyflakes' tests)."""
    prefix = "class Test:\n    def test(self):\n        self.fl"
    suffix = "\n        import os\n        ''')\n"
    assert tidy("akes('''", prefix, suffix, multiline=False, language="python") == "akes('''"
    assert tidy("akes(1, 2", prefix, suffix, multiline=False, language="python") == "akes(1, 2)"
    assert tidy("akes(x  # why", prefix, suffix, multiline=False, language="python") == "akes(x  # why"
