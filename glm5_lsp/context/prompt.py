"""Prompt assembly: one function turns a cursor into a :class:`~glm5_lsp.spans.Prompt` inside a budget.

Layout (what changes least comes first, so the runtime's cached prefix survives keystrokes)::

    <comment> other files           snippets most similar to the code at the cursor   (role snippet)
    <comment> symbols               the symbol summary                                (role symbol)
    <comment> api                   API-doc chunks, best one last (nearest the code)  (role api_doc)
    <comment> flagged lines         error lines outside the code window               (role error_context)
    code before the cursor          | prefix
    code after the cursor           | suffix (fill-in-the-middle)

The snippets are the workspace memory's (``remembered``: windows of recently edited files and the
text around the memory's longest match of the cursor's context, when the engine has a memory), then
windows of the other open files; at most ``SHARES["others"]`` of the budget and ``limits["others"]``
(``budgets.snippetTokens``), none where that leaves less than ``MIN_SNIPPET_TOKENS``.

Every header line is a line comment of the document's language. Budget priorities: the code window
is sized first with at least ``CODE_SHARE`` of the budget (the code around the cursor is never
starved), header parts take at most their share each (``SHARES``), flagged lines outside the window
come next (cut, not dropped, when long), and whatever is left goes back to the code.

Roles inside the code window (later spans override earlier ones, see ``Prompt.role_at``):

- ``current_block``: the innermost syntax block (``grammars/<lang>/blocks.scm``) around the
  cursor; for plain text, the paragraph around it.
- ``indent``: the leading whitespace of every line from ``INDENT_ABOVE`` lines above the cursor to
  ``INDENT_BELOW`` lines below it, inside the window (the cursor line's own indentation included).
- ``error_context``: the full text of each line the caller flags (a compiler's error lines).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glm5_lsp.context.cursor_query import build_query
from glm5_lsp.context.tokens import TokenCounter
from glm5_lsp.languages import comment_prefix
from glm5_lsp.spans import Prompt, Span

if TYPE_CHECKING:
    from glm5_lsp.context.apidocs import ApiDocIndex
    from glm5_lsp.context.documents import Document
    from glm5_lsp.context.symbols import SymbolTable

CODE_SHARE = 0.5
SHARES = {"others": 0.20, "symbols": 0.15, "api": 0.15, "errors": 0.25}
BEFORE_SHARE = 0.75  # of the code budget, for the text before the cursor
INDENT_ABOVE, INDENT_BELOW = 24, 8
SNIPPET_LINES = 12
# Less room than this for snippets: none. A snippet is a header line and a window of several code
# lines (the memory's are 8 lines): in less room none fits, and looking for them costs tens of
# milliseconds (a single-line completion's 64-token prompt would give them 12).
MIN_SNIPPET_TOKENS = 48
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


@dataclass
class _Window:
    """Lines ``[first, last]`` of the document shown verbatim (``last`` inclusive)."""

    first: int
    last: int
    cost: int


def build_prompt(
    doc: Document,
    offset: int,
    budget_tokens: int,
    *,
    symbols: SymbolTable | None = None,
    apidocs: ApiDocIndex | None = None,
    other_docs: Sequence[Document] = (),
    error_lines: Iterable[int] = (),
    count_tokens: Callable[[str], int] | TokenCounter | None = None,
    limits: dict[str, int | None] | None = None,
    remembered: Sequence[tuple[str, str]] = (),
) -> Prompt:
    """The prompt for a cursor at string ``offset`` of ``doc``, within ``budget_tokens``.

    ``limits`` caps header parts in tokens (``{"api": 256, "symbols": 256}``) below their shares.
    """
    count = count_tokens if isinstance(count_tokens, TokenCounter) else TokenCounter(count_tokens)
    offset = min(max(offset, 0), len(doc.text))
    line = doc.position(offset)[0]
    errors = sorted({e for e in error_lines if 0 <= e < doc.line_count})
    marker = comment_prefix(doc.language)
    caps = {part: int(budget_tokens * share) for part, share in SHARES.items()}
    for part, cap in (limits or {}).items():
        if cap is not None and part in caps:
            caps[part] = min(caps[part], cap)

    # 1. The code window, sized first with the guaranteed share.
    window = _Window(line, line, count(doc.line(line)))
    _grow(doc, window, line, int(budget_tokens * CODE_SHARE) - window.cost, count)

    # 2. Header parts, each within its share.
    sections: list[tuple[str, list[str]]] = []
    others = _snippets(doc, line, other_docs, snippet_room(budget_tokens, limits), count, marker, remembered)
    if others:
        sections.append(("snippet", others))
    if symbols is not None:
        lines = symbols.render(doc.path, line, caps["symbols"], count,
                               skip_lines=(window.first, window.last))
        if lines:
            sections.append(("symbol", [marker + "symbols"] + [marker + t for t in lines]))
    if apidocs is not None:
        api = _api_lines(doc, offset, symbols, apidocs, caps["api"], count, marker)
        if api:
            sections.append(("api_doc", api))
    header_cost = sum(count.cached(t) + 1 for _, lines in sections for t in lines)

    # 3. Whatever the header left goes back to the code; flagged lines outside it get the header too.
    error_reserve = min(caps["errors"], max(budget_tokens - header_cost - window.cost, 0),
                        sum(count.cached(doc.line(e)) + 4 for e in errors if not window.first <= e <= window.last))
    _grow(doc, window, line, budget_tokens - header_cost - error_reserve - window.cost, count)
    outside = [e for e in errors if not window.first <= e <= window.last]
    if outside:
        flagged, left = [marker + "flagged lines"], error_reserve - count(marker) - 4
        for e in outside:
            text = f"{marker}{e + 1}: {doc.line(e).strip()}"
            cost = count(text) + 1
            while cost > left and len(text) > len(marker) + 8:  # a long flagged line is cut, not dropped
                text = text[: max(len(marker) + 8, len(text) * left // cost - 1)]
                cost = count(text) + 1
            if cost <= left:
                flagged.append(text)
                left -= cost
        if len(flagged) > 1:
            sections.append(("error_context", flagged))

    # 4. Text and spans.
    header = ""
    spans: list[Span] = []
    for role, lines in sections:
        text = "\n".join(lines) + "\n"
        if role != "code":
            spans.append(Span(len(header), len(header) + len(text), role))
        header += text
    start = doc.line_starts[window.first]
    end = doc.line_starts[window.last + 1] if window.last + 1 < doc.line_count else len(doc.text)
    prefix = header + doc.text[start:offset]
    suffix = doc.text[offset:end]
    shift = len(header) - start  # document offset -> prompt offset
    spans += _code_spans(doc, offset, line, window, errors, shift)
    return Prompt(prefix, suffix, spans)


def _grow(doc: Document, window: _Window, line: int, budget: int, count: TokenCounter) -> None:
    """Widen the window line by line (before the cursor first, by ``BEFORE_SHARE``) within ``budget``."""
    if budget <= 0:
        return
    before_budget = int(budget * BEFORE_SHARE)
    after_budget = budget - before_budget
    spent_before = spent_after = 0
    while window.first > 0:
        cost = count.cached(doc.line(window.first - 1)) + 1
        if spent_before + cost > before_budget:
            break
        window.first -= 1
        spent_before += cost
    after_budget += before_budget - spent_before
    while window.last + 1 < doc.line_count:
        cost = count.cached(doc.line(window.last + 1)) + 1
        if spent_after + cost > after_budget:
            break
        window.last += 1
        spent_after += cost
    left = after_budget - spent_after
    while window.first > 0 and left > 0:  # text after the cursor ran out: give the rest to before
        cost = count.cached(doc.line(window.first - 1)) + 1
        if cost > left:
            break
        window.first -= 1
        left -= cost
        spent_before += cost
    window.cost += spent_before + spent_after


def _code_spans(doc: Document, offset: int, line: int, window: _Window, errors: list[int], shift: int) -> list[Span]:
    spans: list[Span] = []
    lo_line, hi_line = _current_block(doc, offset, line)
    lo_line, hi_line = max(lo_line, window.first), min(hi_line, window.last)
    if lo_line <= hi_line:
        spans.append(Span(doc.line_starts[lo_line] + shift, _line_end(doc, hi_line) + shift, "current_block"))
    for ln in range(max(window.first, line - INDENT_ABOVE), min(window.last, line + INDENT_BELOW) + 1):
        text = doc.line(ln)
        width = len(text) - len(text.lstrip(" \t"))
        if width:
            start = doc.line_starts[ln] + shift
            spans.append(Span(start, start + width, "indent"))
    for e in errors:
        if window.first <= e <= window.last:
            spans.append(Span(doc.line_starts[e] + shift, _line_end(doc, e) + shift, "error_context"))
    return spans


def _line_end(doc: Document, line: int) -> int:
    """Offset just past ``line``'s newline (or the end of the text)."""
    return doc.line_starts[line + 1] if line + 1 < doc.line_count else len(doc.text)


def _current_block(doc: Document, offset: int, line: int) -> tuple[int, int]:
    """First and last line of the innermost block around the cursor."""
    grammar = doc.grammar
    if grammar is not None and grammar.blocks is not None and doc.tree is not None:
        import tree_sitter

        # Anchor on the last non-space character before the cursor: a cursor on a fresh indented
        # line sits past the end of the block it is typing into.
        anchor = len(doc.text[:offset].rstrip()) if offset else 0
        anchor = max(anchor - 1, 0)
        byte = doc.byte_offset(anchor)
        cursor = tree_sitter.QueryCursor(grammar.blocks)
        cursor.set_byte_range(byte, byte + 1)
        best = None
        for nodes in cursor.captures(doc.tree.root_node).values():
            for node in nodes:
                if node.start_byte <= byte < node.end_byte and (best is None or node.end_byte - node.start_byte < best.end_byte - best.start_byte):
                    best = node
        if best is not None:
            return best.start_point[0], max(best.end_point[0], line)
        return line, line
    # Plain text: the paragraph (run of non-blank lines) around the cursor.
    lo = hi = line
    while lo > 0 and doc.line(lo - 1).strip():
        lo -= 1
    while hi + 1 < doc.line_count and doc.line(hi + 1).strip():
        hi += 1
    return lo, hi


def _api_lines(doc, offset, symbols, apidocs, budget, count, marker) -> list[str]:
    if budget <= 0:
        return []
    summary = symbols.files.get(doc.path) if symbols is not None else None
    aliases: dict[str, str] = {}
    modules: list[str] = []
    if summary is not None:
        for imp in summary.imports:
            if imp.bound:
                aliases[imp.bound] = imp.binds_to
            modules.append(imp.module)
    query = build_query(doc.text, offset, aliases, modules)
    # Installed-package chunks are Python APIs: other languages get only the workspace's docs.
    chunks = apidocs.top(query, budget - count(marker) - 1, count, packages=doc.language == "python")
    if not chunks:
        return []
    lines = [marker + "api"]
    for chunk in reversed(chunks):  # best last, right above the code
        lines += [marker + t for t in chunk.render().splitlines()]
    return lines


def snippet_room(budget_tokens: int, limits: dict[str, int | None] | None = None) -> int:
    """The tokens a prompt of ``budget_tokens`` gives snippets (0 below ``MIN_SNIPPET_TOKENS``)."""
    room = int(budget_tokens * SHARES["others"])
    cap = (limits or {}).get("others")
    if cap is not None:
        room = min(room, cap)
    return room if room >= MIN_SNIPPET_TOKENS else 0


def _snippets(doc, line, other_docs, budget, count, marker, remembered=()) -> list[str]:
    """The memory's snippets (``remembered``, best first), then windows of other open files sharing
    the most identifiers with the code around the cursor, within ``budget``."""
    if budget <= 0:
        return []
    out: list[str] = []
    left = budget
    for path, text in remembered:
        block = [f"{marker}{_display(path, doc.path)}"] + [marker + t for t in text.strip("\n").split("\n")]
        cost = sum(count.cached(t) + 1 for t in block)
        if cost <= left:
            out += block
            left -= cost
    shown = {path for path, _ in remembered}
    other_docs = [d for d in other_docs if d.path not in shown]
    if not other_docs:
        return out
    near = set(_IDENT.findall(doc.text[doc.line_starts[max(0, line - SNIPPET_LINES)] : doc.line_starts[line]]))
    if not near:
        return out
    scored: list[tuple[float, str, int, list[str]]] = []
    for other in other_docs:
        if other.path == doc.path:
            continue
        for first, lines, idents in _windows(other):
            score = len(near & idents) / len(near | idents)
            if score > 0:
                scored.append((-score, other.path, first, lines))
    scored.sort()
    for _, path, first, lines in scored[:4]:
        block = [f"{marker}{_display(path, doc.path)}:{first + 1}"] + [marker + t for t in lines]
        cost = sum(count.cached(t) + 1 for t in block)
        if cost <= left:
            out += block
            left -= cost
    return out


_WINDOWS: dict[str, tuple[str, list[tuple[int, list[str], frozenset[str]]]]] = {}


def _windows(doc: Document) -> list[tuple[int, list[str], frozenset[str]]]:
    """A document's ``SNIPPET_LINES``-line windows with their identifiers (cached per text)."""
    cached = _WINDOWS.get(doc.path)
    if cached is not None and cached[0] is doc.text:
        return cached[1]
    out = []
    for first in range(0, doc.line_count, SNIPPET_LINES):
        lines = [doc.line(i) for i in range(first, min(first + SNIPPET_LINES, doc.line_count))]
        idents = frozenset(_IDENT.findall("\n".join(lines)))
        if idents:
            out.append((first, lines, idents))
    if len(_WINDOWS) > 64:
        _WINDOWS.clear()
    _WINDOWS[doc.path] = (doc.text, out)
    return out


def _display(path: str, relative_to: str) -> str:
    """``path`` relative to the folder it shares with ``relative_to`` (short, stable header lines)."""
    import os

    try:
        base = os.path.dirname(os.path.commonpath([path, relative_to]))
        return os.path.relpath(path, base) if base and base != os.sep else path
    except ValueError:
        return path
