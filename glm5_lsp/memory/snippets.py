"""Snippets for the prompt: the chunks of other documents most like the code at the cursor.

As shipping assistants do with the editor's other tabs: the lines before the cursor are compared
with fixed windows of the other documents the editor has open or edited (the memory's edited
documents), by the Jaccard similarity of their identifier sets, and the most similar windows are
kept within a character budget, most similar first (a window that overlaps a better one is
dropped, and the memory's match where a window of its document is kept). The memory adds its own: the text around the longest match of the cursor's context in any
other document, decoded from the ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Snippet:
    key: str  # the document (a path)
    text: str
    score: float  # Jaccard similarity to the cursor's lines (1.0 for the memory's own match)
    origin: str  # "similar" (a window of an edited document) or "match" (the memory's longest match)
    line: int = -1  # the window's first line, where known


def words(text: str) -> set[str]:
    return set(_WORD.findall(text))


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def windows(text: str, size: int, stride: int) -> Iterable[tuple[int, str]]:
    lines = text.split("\n")
    for start in range(0, max(1, len(lines) - size + stride), stride):
        chunk = lines[start:start + size]
        if any(line.strip() for line in chunk):
            yield start, "\n".join(chunk)


def similar_snippets(memory: object, key: str | None, document: str, offset: int, max_chars: int = 1500,
                     window_lines: int = 20, stride: int = 10, limit: int = 4, min_score: float = 0.1,
                     match_tokens: int = 60) -> list[Snippet]:
    """Snippets for a request at ``offset`` of ``document`` (``key``), at most ``max_chars`` in all."""
    before = document[:offset].split("\n")
    query = words("\n".join(before[-window_lines:]))
    found: list[Snippet] = []
    edited = getattr(memory, "_edited", {})
    for other, doc in list(edited.items()):
        if other == key:
            continue
        for line, text in windows(doc.text, window_lines, stride):
            score = jaccard(query, words(text))
            if score >= min_score:
                found.append(Snippet(other, text, score, "similar", line))
    match = _memory_match(memory, key, document, offset, match_tokens)
    if match is not None:
        found.append(match)
    found.sort(key=lambda s: -s.score)
    kept: list[Snippet] = []
    used = 0
    for snippet in found:
        if len(kept) >= limit or used + len(snippet.text) > max_chars:
            continue
        if any(s.key == snippet.key and (s.line < 0 or snippet.line < 0 or abs(s.line - snippet.line) < window_lines)
               for s in kept):
            continue  # overlaps a better window of the same document
        kept.append(snippet)
        used += len(snippet.text)
    return kept


def _memory_match(memory: object, key: str | None, document: str, offset: int, tokens: int) -> Snippet | None:
    """The text around the longest match of the cursor's context in another document."""
    matcher = memory.matcher(key, document, offset) if key is not None else memory.matcher()  # type: ignore[attr-defined]
    tokenizer = memory.tokenizer  # type: ignore[attr-defined]
    from glm5_lsp.memory.align import TextMatcher

    text = TextMatcher(matcher, tokenizer)
    text.bind(document[max(0, offset - 2000):offset])
    settled, _ = text.split("")  # up to where the tokenization is settled (not a half-typed word)
    match = matcher.sync(settled)
    if match.length < 8:
        return None
    for source, state in zip(matcher.sources, match.shards):
        if state.length != match.length or not hasattr(state, "lo"):
            continue
        index = source.index
        position = int(index.sa[state.lo])
        doc = int(index.doc_starts.searchsorted(position, side="right")) - 1
        other = index.keys[doc]
        if other == key:
            continue
        start, end = int(index.doc_starts[doc]), int(index.doc_starts[doc + 1]) - 1
        ids = index.tokens[max(start, position - tokens):min(end, position + state.length + tokens)]
        return Snippet(other, tokenizer.decode([int(t) for t in ids]), 1.0, "match")
    return None
