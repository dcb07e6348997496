"""The prompt for a repair round: the original prompt plus the checkers' hints, marked ``error_context``.

Where the hints go: a comment block (``#`` or ``//`` by language) inserted at the start of the line
the cursor is on, indented like that line (on a blank line: like the next line of code, else the
previous one), so it is the last thing the model reads before the code
it writes and comments cannot change the program. Placing it there rather than at the top of the
prompt keeps everything before the cursor line unchanged, so the runtime's KV cache still covers
the context header and the code above (prefix reuse). The block reads::

    # The previous completion here failed these checks; write it again without them:
    # error (pyflakes) line 12: undefined name 'fo': `return fo(x)`

Spans: the block is one ``error_context`` span (forced full attention in the runtime); so is each
document line the prompt shows that a diagnostic points at (a candidate that breaks the code after
the cursor gets that code marked). Existing spans keep covering the same text (they shift past the
block; one that straddles the insertion point grows to include it, and the later error span wins).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.spans import Prompt, Span

LINE_COMMENT: dict[str, str] = {"python": "#", "ruby": "#", "shell": "#", "r": "#"}
HEADER = "The previous completion here failed these checks; write it again without them:"


@dataclass(frozen=True)
class RepairContext:
    """Where the failed candidate sat: ``document[start:end]`` was replaced by ``candidate``."""

    document: str
    start: int
    end: int
    candidate: str
    language: str


def comment_marker(language: str) -> str:
    return LINE_COMMENT.get(language, "//")


def hint_lines(diagnostics: Sequence[Diagnostic], spliced: str, max_hints: int) -> list[str]:
    """One line per distinct problem (same line and message once), at most ``max_hints``."""
    seen: set[tuple[int, str]] = set()
    lines: list[str] = []
    for diag in diagnostics:
        if (diag.line, diag.message) in seen:
            continue
        seen.add((diag.line, diag.message))
        lines.append(diag.hint(spliced))
        if len(lines) == max_hints:
            break
    return lines


def build_repair_prompt(prompt: Prompt, hints: Sequence[str], diagnostics: Sequence[Diagnostic],
                        where: RepairContext) -> Prompt:
    """``prompt`` with the hint block before the cursor line and ``error_context`` spans (see above)."""
    marker = comment_marker(where.language)
    insert_at = prompt.prefix.rfind("\n") + 1
    indent = _block_indent(prompt, insert_at)
    block = "".join(f"{indent}{marker} {line}\n" for line in [HEADER, *hints])
    size = len(block)
    prefix = prompt.prefix[:insert_at] + block + prompt.prefix[insert_at:]
    spans = [_shift(span, insert_at, size) for span in prompt.spans]
    spans.append(Span(insert_at, insert_at + size, "error_context"))
    new_prompt = Prompt(prefix=prefix, suffix=prompt.suffix, spans=spans)
    for lo, hi in _document_lines_in_prompt(prompt, diagnostics, where):
        lo, hi = (lo + size if lo >= insert_at else lo), (hi + size if hi > insert_at else hi)
        if hi > lo:
            new_prompt.spans.append(Span(lo, hi, "error_context"))
    return new_prompt


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _block_indent(prompt: Prompt, insert_at: int) -> str:
    """The cursor line's indentation; on a blank line, the next code line's (or else the previous one's)."""
    head = prompt.prefix[insert_at:]
    if head.strip():
        return _indent_of(head)
    for line in prompt.suffix.split("\n"):
        if line.strip():
            return _indent_of(line)
    for line in reversed(prompt.prefix[:insert_at].split("\n")):
        if line.strip():
            return _indent_of(line)
    return _indent_of(head)


def _shift(span: Span, at: int, size: int) -> Span:
    start = span.start + size if span.start >= at else span.start
    end = span.end + size if span.end > at or span.start >= at else span.end  # an empty span at ``at`` moves whole
    return Span(start, end, span.role)


def _document_lines_in_prompt(prompt: Prompt, diagnostics: Sequence[Diagnostic],
                              where: RepairContext) -> list[tuple[int, int]]:
    """Character ranges of ``prompt.text()`` (before the block is inserted) holding the document
    lines that diagnostics point at, for the lines outside the candidate that the prompt shows."""
    spliced = where.document[: where.start] + where.candidate + where.document[where.end:]
    line_starts = [0] + [i + 1 for i, ch in enumerate(spliced) if ch == "\n"]
    cand_end = where.start + len(where.candidate)
    ranges: list[tuple[int, int]] = []
    for diag in diagnostics:
        if diag.line >= len(line_starts):
            continue
        lo = line_starts[diag.line]
        hi = line_starts[diag.line + 1] - 1 if diag.line + 1 < len(line_starts) else len(spliced)
        if hi <= where.start:  # a line wholly before the candidate: it ends the prompt's prefix region
            tail = where.document[lo:where.start]
            if prompt.prefix.endswith(tail):
                base = len(prompt.prefix) - len(tail)
                ranges.append((base, base + (hi - lo)))
        elif lo >= cand_end:  # a line wholly after the candidate: it is in the prompt's suffix
            doc_lo = lo - cand_end + where.end
            doc_hi = hi - cand_end + where.end
            head = where.document[where.end:doc_hi]
            if prompt.suffix.startswith(head):
                base = len(prompt.prefix)
                ranges.append((base + doc_lo - where.end, base + doc_hi - where.end))
    return sorted(set(ranges))
