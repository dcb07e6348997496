"""The document's indentation unit, and multi-line text re-expressed in it.

A model writes four spaces where the file uses two, or a tab: the pipeline re-indents multi-line
text to the document's unit (``PipelineSettings.reindent``, on for the editor) before the text is
judged, so what is checked is what is inserted.
"""

from __future__ import annotations

import math

from glm5_lsp.positions import LINE_BREAK


def indent_unit(document: str) -> str:
    """The file's indentation step: a tab, or the most common step between space indents (4 if unknown)."""
    tabs = spaces = 0
    steps: dict[int, int] = {}
    previous = 0
    for line in LINE_BREAK.split(document, 2000)[:2000]:  # LSP's lines (splitlines breaks at \x0c too)
        if not line.strip():
            continue
        lead = line[: len(line) - len(line.lstrip())]
        if lead.startswith("\t"):
            tabs += 1
            continue
        width = len(lead)
        if width:
            spaces += 1
        if width > previous:
            steps[width - previous] = steps.get(width - previous, 0) + 1
        previous = width
    if tabs > spaces:
        return "\t"
    if not steps:
        return "    "
    return " " * max(steps, key=lambda k: (steps[k], -k))


def reindent(text: str, unit: str) -> str:
    """Re-express the indentation of ``text``'s lines after the first in the file's ``unit``.

    Tabs count as one level; runs of spaces are converted with the completion's own step (the
    gcd of its space indents), so a 2-space completion in a 4-space file becomes 4-space.
    """
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    widths = [
        len(line) - len(line.lstrip(" "))
        for line in lines[1:]
        if line.strip() and not line.startswith("\t")
    ]
    step = 0
    for width in widths:
        step = math.gcd(step, width)
    out = [lines[0]]
    for line in lines[1:]:
        if not line.strip():
            out.append("")
            continue
        body = line.lstrip(" \t")
        lead = line[: len(line) - len(body)]
        tabs = lead.count("\t")
        spaces = lead.count(" ")
        levels = tabs + (spaces // step if step else 0)
        extra = spaces % step if step else 0
        if unit == "\t":
            out.append("\t" * levels + " " * extra + body)
        elif step == 0 or step == len(unit):
            out.append(unit * tabs + " " * spaces + body)
        else:
            out.append(unit * levels + " " * extra + body)
    return "\n".join(out)
