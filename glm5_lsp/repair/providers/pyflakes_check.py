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

from pyflakes import checker, messages

from glm5_lsp.repair.diagnostics import Diagnostic
from glm5_lsp.repair.providers.positions import clamp_position

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
INFOS: frozenset[str] = frozenset({"UnusedVariable", "UnusedAnnotation", "UnusedIndirectAssignment"})


def severity_of(code: str) -> str:
    """The severity for a pyflakes message class name (see the module docstring)."""
    if code in ERRORS:
        return "error"
    if code in INFOS:
        return "info"
    return "warning"


class PyflakesProvider:
    """Runs pyflakes' checker on the parsed text; a text that does not parse gives nothing here (the
    compile and tree-sitter providers report syntax errors)."""

    name = "pyflakes"
    languages = frozenset({"python"})

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        try:
            tree = ast.parse(text, filename=path or "<candidate>")
        except (SyntaxError, ValueError):
            return []
        found: list[Diagnostic] = []
        for message in checker.Checker(tree, filename=path or "<candidate>").messages:
            found.append(self._convert(text, message))
        return found

    def _convert(self, text: str, message: messages.Message) -> Diagnostic:
        code = type(message).__name__
        line, col = clamp_position(text, message.lineno - 1, getattr(message, "col", 0) or 0)
        end_col = col + _name_length(text, line, col)
        return Diagnostic(line, col, line, end_col, message.message % message.message_args,
                          severity_of(code), self.name, code)


def _name_length(text: str, line: int, col: int) -> int:
    """Length of the identifier (or word) at ``line:col``, at least 1 when the line has text there."""
    row = text.split("\n")[line]
    end = col
    while end < len(row) and (row[end].isalnum() or row[end] == "_"):
        end += 1
    return max(end - col, 1 if col < len(row) else 0)
