"""Clean a model completion before an editor sees it.

Pure text functions, no LSP types: cut at special tokens, drop text that repeats what already
follows the cursor, balance brackets against the line being completed, and re-indent to the
file's indentation unit. :func:`clean_completion` chains them in that order.
"""

from __future__ import annotations

import math
import re

SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]+\|>|<(?:fim|FIM)_[a-z]+>")
OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}
# How much text before the cursor is scanned for brackets that are still open.
_SCAN_CHARS = 4000


def cut_special_tokens(text: str) -> str:
    """Everything before the first special token (``<|endoftext|>``, ``<|code_suffix|>``, ...)."""
    match = SPECIAL_TOKEN.search(text)
    return text[: match.start()] if match else text


def single_line(text: str) -> str:
    """The first line of a completion (a completion that starts with a newline keeps its second)."""
    if text.startswith("\n"):
        rest = text.lstrip("\n")
        return "\n" + rest.split("\n", 1)[0] if rest.strip() else ""
    return text.split("\n", 1)[0]


def drop_suffix_overlap(text: str, suffix: str) -> str:
    """Remove the end of ``text`` where it repeats what follows the cursor.

    Handles the rest of the cursor's line (``print(|)`` completed as ``"hi")`` keeps ``"hi"``)
    and whole lines (a multi-line completion that re-types the next lines of the file).
    """
    rest_of_line, _, after = suffix.partition("\n")
    stripped = rest_of_line.strip()
    if stripped:
        body = text.rstrip()
        if body.endswith(stripped) and len(body) > len(stripped):
            text = body[: -len(stripped)]
        else:
            # A run of closing punctuation at the start of the rest of the line, e.g. `)` or `"]`.
            closing = re.match(r"[\)\]\}\"'`;,:]+", rest_of_line)
            if closing:
                run = closing.group(0)
                for size in range(len(run), 0, -1):
                    if body.endswith(run[:size]) and len(body) > size:
                        text = body[:-size]
                        break
    next_lines = [line.strip() for line in after.split("\n") if line.strip()]
    if next_lines and "\n" in text:
        lines = text.rstrip().split("\n")
        for count in range(min(len(lines) - 1, len(next_lines)), 0, -1):
            tail = [line.strip() for line in lines[-count:]]
            if tail == next_lines[:count]:
                text = "\n".join(lines[:-count])
                break
    return text


def open_brackets(text: str) -> list[str]:
    """The brackets still open at the end of ``text`` (strings and ``#``/``//`` comments skipped)."""
    stack: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
            if ch == "\n" and len(quote) == 1:
                quote = ""
        elif ch in "\"'`":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            i += len(quote)
            continue
        elif ch == "#" or text.startswith("//", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
            continue
        elif ch in OPENERS:
            stack.append(ch)
        elif ch in CLOSERS:
            if stack and stack[-1] == CLOSERS[ch]:
                stack.pop()
            elif CLOSERS[ch] in stack:  # tolerate a mismatch by unwinding to the matching opener
                while stack and stack.pop() != CLOSERS[ch]:
                    pass
        i += 1
    return stack


def balance_brackets(text: str, prefix: str, suffix: str) -> str:
    """Cut ``text`` at a closer that matches nothing open, and close what it leaves open.

    A closer is allowed when it matches a bracket opened in ``text`` or still open in ``prefix``.
    Brackets the completion opened and left open get their closers appended.
    """
    stack = open_brackets(prefix[-_SCAN_CHARS:])
    own: list[str] = []  # brackets opened by the completion itself, still open
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif ch in "\"'`":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            i += len(quote)
            continue
        elif ch in OPENERS:
            stack.append(ch)
            own.append(ch)
        elif ch in CLOSERS:
            if not stack or stack[-1] != CLOSERS[ch]:
                return text[:i].rstrip(" ,")
            stack.pop()
            if own:
                own.pop()
        i += 1
    # Closers already after the cursor belong to brackets opened before it (an editor's auto-close),
    # so the completion closes everything it opened itself.
    return text + "".join(OPENERS[b] for b in reversed(own))


def indent_unit(document: str) -> str:
    """The file's indentation step: a tab, or the most common step between space indents (4 if unknown)."""
    tabs = spaces = 0
    steps: dict[int, int] = {}
    previous = 0
    for line in document.splitlines()[:2000]:
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


def clean_completion(text: str, prefix: str, suffix: str, *, multiline: bool, unit: str) -> str:
    """The whole post-processing chain; returns "" when nothing useful is left."""
    text = cut_special_tokens(text)
    line_before = prefix.rsplit("\n", 1)[-1]
    if line_before.strip() and line_before.endswith(" ") and text.startswith(" "):
        text = text.lstrip(" ")  # no double space after "x = "
    if not multiline:
        text = single_line(text)
    text = text.rstrip() if "\n" in text or not suffix.split("\n", 1)[0].strip() else text
    text = drop_suffix_overlap(text, suffix)
    text = balance_brackets(text, prefix, suffix)
    if multiline:
        text = reindent(text, unit)
    text = "\n".join(line.rstrip() for line in text.split("\n")) if "\n" in text else text
    return text if text.strip() else ""
