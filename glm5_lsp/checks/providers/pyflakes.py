"""pyflakes: undefined names, unused and shadowed imports, misplaced ``return``/``break``, format bugs.

Severity mapping (pyflakes itself has none):

- ``error``: the code fails when it runs or cannot run at all -- undefined names/locals/exports,
  duplicate arguments, ``return``/``yield``/``break``/``continue`` outside their construct, a
  default ``except`` that is not last, starred-assignment errors, ``raise NotImplemented``, format
  strings whose arguments do not match, ``print >>``.
- ``info``: what is normal mid-edit, while the user is still typing the code that uses it -- an
  unused local variable or annotation.
- ``warning``: everything else (unused or shadowed imports, redefinitions, ``is`` with a literal,
  an f-string without placeholders, repeated dict keys, ``import *``, ...).
"""

from __future__ import annotations

import ast
import re

from pyflakes import checker, messages

from glm5_lsp import pyparse
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import clamp_position

ERRORS: frozenset[str] = frozenset({
    "UndefinedName", "UndefinedExport", "UndefinedLocal", "DuplicateArgument", "ReturnOutsideFunction",
    "YieldOutsideFunction", "ContinueOutsideLoop", "BreakOutsideLoop", "DefaultExceptNotLast",
    "TwoStarredExpressions", "TooManyExpressionsInStarredAssignment", "RaiseNotImplemented",
    "InvalidPrintSyntax", "ImportStarNotPermitted", "LateFutureImport", "FutureFeatureNotDefined",
    "ForwardAnnotationSyntaxError", "StringDotFormatExtraPositionalArguments",
    "StringDotFormatExtraNamedArguments", "StringDotFormatMissingArgument", "StringDotFormatMixingAutomatic",
    "StringDotFormatInvalidFormat", "PercentFormatInvalidFormat", "PercentFormatMixedPositionalAndNamed",
    "PercentFormatUnsupportedFormatCharacter", "PercentFormatPositionalCountMismatch",
    "PercentFormatExtraNamedArguments", "PercentFormatMissingArgument", "PercentFormatExpectedMapping",
    "PercentFormatExpectedSequence", "PercentFormatStarRequiresSequence",
})
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INFOS: frozenset[str] = frozenset({"UnusedVariable", "UnusedAnnotation", "UnusedIndirectAssignment"})


def severity_of(code: str) -> str:
    """The severity for a pyflakes message class name (see the module docstring)."""
    if code in ERRORS:
        return "error"
    if code in INFOS:
        return "info"
    return "warning"


class PyflakesProvider:
    """Runs pyflakes' checker on the parsed text.

    A text that does not parse (a file being edited often does not) is cut before the line of its
    syntax error and the head is checked instead, so a candidate above a broken line still gets its
    undefined names checked; an undefined name that appears in the cut-off tail is not reported (it
    is probably defined there). Syntax errors themselves are the compile/tree-sitter providers' job.
    """

    name = "pyflakes"
    languages = frozenset({"python"})

    def __init__(self, max_cuts: int = 3) -> None:
        self.max_cuts = max_cuts  # how many times to cut a text that does not parse before giving up

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        parsed = _parse_longest_head(text, path or "<candidate>", self.max_cuts)
        if parsed is None:
            return []
        tree, kept = parsed
        cut_off = set(_WORD.findall("\n".join(text.split("\n")[kept:]))) if kept is not None else set()
        found: list[Diagnostic] = []
        for message in checker.Checker(tree, filename=path or "<candidate>").messages:
            if type(message).__name__ == "UndefinedName" and message.message_args[0] in cut_off:
                continue  # probably defined in the part that did not parse
            found.append(self._convert(text, message))
        return found

    def _convert(self, text: str, message: messages.Message) -> Diagnostic:
        code = type(message).__name__
        line, col = clamp_position(text, message.lineno - 1, getattr(message, "col", 0) or 0)
        end_col = col + _name_length(text, line, col)
        return Diagnostic(line, col, line, end_col, message.message % message.message_args,
                          severity_of(code), self.name, code)


def _parse_longest_head(text: str, filename: str, max_cuts: int) -> tuple[ast.Module, int | None] | None:
    """The parsed text, or its longest head (lines before each syntax error) that parses, with the
    number of lines kept (None when the whole text parsed)."""
    lines = text.split("\n")
    kept: int | None = None
    for _ in range(max_cuts + 1):
        source = text if kept is None else "\n".join(lines[:kept])
        try:
            return pyparse.parse(source, filename=filename), kept
        except SyntaxError as exc:
            bad_line = (exc.lineno or 1) - 1
            if bad_line <= 0 or (kept is not None and bad_line >= kept):
                return None
            kept = bad_line
        except ValueError:
            return None
    return None


def _name_length(text: str, line: int, col: int) -> int:
    """Length of the identifier (or word) at ``line:col``, at least 1 when the line has text there."""
    row = text.split("\n")[line]
    end = col
    while end < len(row) and (row[end].isalnum() or row[end] == "_"):
        end += 1
    return max(end - col, 1 if col < len(row) else 0)
