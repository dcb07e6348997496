"""Document text as the editor has it: LSP's line rules, positions in the negotiated code units,
a chunked copy that an incremental change edits in place, and the window of a large document
that the model, the checks and the indexes read.

LSP breaks lines at ``\\n``, ``\\r\\n`` and ``\\r`` only. ``str.splitlines`` also breaks at ``\\x0b``,
``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``, so a text holding any of them
(a form feed is common in Python and C sources) would put every later edit on the wrong line;
nothing here uses it.

:class:`ChunkedText` keeps the text as a list of chunks of whole lines (about 16 K characters
each), so a keystroke in a 10 MB document rewrites one chunk, not the whole text.
:class:`SyncedDocument` is the pygls workspace document on top of it (``source``, positions and
changes by LSP's rules; a position past the end of a line means the line's end, as the protocol
says). :class:`View` is a snapshot of what a request reads, the whole document or, for a document
over ``limits.windowChars``, its head plus a window around the cursor, with the mapping between
the snapshot's offsets and the document's positions.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

from glm5_lsp.positions import LINE_BREAK

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
CHUNK_CHARS = 1 << 14
UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"


# ---- lines and code units ------------------------------------------------------------------------


def line_starts(text: str) -> list[int]:
    """The offset where each line of ``text`` starts, by LSP's rules (``\\n``, ``\\r\\n``, ``\\r``)."""
    if len(text) > 4096:  # one pass in numpy over the code points (a chunk after each edit: 20x faster)
        import numpy as np

        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        newline = points == 10
        alone = points == 13
        alone[:-1] &= ~newline[1:]  # a "\\r" before "\\n" is half of one break
        return [0, *(np.flatnonzero(newline | alone) + 1).tolist()]
    if "\r" not in text:
        starts = [0]
        find = text.find
        index = find("\n")
        while index >= 0:
            starts.append(index + 1)
            index = find("\n", index + 1)
        return starts
    return [0, *(m.end() for m in LINE_BREAK.finditer(text))]


def count_breaks(text: str) -> int:
    """How many line breaks ``text`` holds (``\\r\\n`` is one)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` with their breaks kept (``str.splitlines(True)`` by LSP's rules)."""
    starts = line_starts(text)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True) if a < b or a == 0]


def encoding_name(kind: Any) -> str:
    """``"utf-8"``, ``"utf-16"`` or ``"utf-32"`` for a ``PositionEncodingKind`` (UTF-16 when unknown)."""
    value = str(getattr(kind, "value", kind) or UTF16).lower()
    return value if value in (UTF8, UTF32) else UTF16


def units_of(text: str, encoding: str = UTF16) -> int:
    """How many code units of ``encoding`` ``text`` takes."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF16:
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    return len(text.encode("utf-8", "surrogatepass"))


def chars_in(line: str, units: int, encoding: str = UTF16) -> int:
    """The character column ``units`` code units into ``line`` (a line without its break).

    Past the line's end it is the line's end (the protocol's rule); inside a character that takes
    several units it is that character's start.
    """
    units = max(0, units)
    if encoding == UTF32 or line.isascii():
        return min(units, len(line))
    if encoding == UTF16:
        data = line.encode("utf-16-le", "surrogatepass")
        if 2 * units >= len(data):
            return len(line)
        head = data[: 2 * units].decode("utf-16-le", "surrogatepass")
        return len(head) - (1 if head and "\ud800" <= head[-1] <= "\udbff" else 0)
    data = line.encode("utf-8", "surrogatepass")
    if units >= len(data):
        return len(line)
    return len(data[:units].decode("utf-8", "ignore"))


def strip_break(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith(("\n", "\r")) else line


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate (``"\\ud800"`` from JSON) replaced by U+FFFD.

    Both are one UTF-16 unit and one code point, so every position in UTF-16 and UTF-32 stays where
    the editor has it; a lone surrogate cannot be encoded, and would fail whatever reads the text.
    """
    if text.isascii() or _LONE_SURROGATE.search(text) is None:
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


# ---- the chunked text ---------------------------------------------------------------------------


def _chunk_end(text: str, at: int) -> int:
    """The end of the first line break at or after ``at`` (``len(text)`` when there is none)."""
    newline, carriage = text.find("\n", at), text.find("\r", at)
    if newline < 0 and carriage < 0:
        return len(text)
    if carriage < 0 or 0 <= newline < carriage:
        return newline + 1
    return carriage + 2 if text.startswith("\n", carriage + 1) else carriage + 1


def split_chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """``text`` cut into chunks of whole lines, each about ``size`` characters (a longer line is one
    chunk); every chunk but the last ends with a line break, and no cut falls inside ``\\r\\n``."""
    chunks, start = [], 0
    while len(text) - start > size:
        end = _chunk_end(text, start + size - 1)
        chunks.append(text[start:end])
        start = end
    if start < len(text) or not chunks:
        chunks.append(text[start:])
    return chunks


class ChunkedText:
    """A text kept as chunks of whole lines; an edit rewrites the chunks it touches.

    ``value`` joins them when asked (and keeps the join until the next edit); ``slice`` reads a
    part without joining the rest. Offsets are characters (code points).
    """

    def __init__(self, text: str = "", chunk_chars: int = CHUNK_CHARS) -> None:
        self.chunk_chars = chunk_chars
        self._chunks = split_chunks(text, chunk_chars)
        self._breaks_in = [count_breaks(c) for c in self._chunks]
        self._starts: list[list[int] | None] = [None] * len(self._chunks)
        self._joined: str | None = text
        self._reindex()

    def _reindex(self) -> None:
        self._ends = list(accumulate(len(c) for c in self._chunks))
        self._breaks = list(accumulate(self._breaks_in))

    def __len__(self) -> int:
        return self._ends[-1]

    @property
    def value(self) -> str:
        if self._joined is None:
            self._joined = "".join(self._chunks)
        return self._joined

    @property
    def line_count(self) -> int:
        return self._breaks[-1] + 1

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    def slice(self, start: int, end: int) -> str:
        """``value[start:end]``, read from the chunks it spans."""
        start, end = max(0, start), min(end, len(self))
        if start >= end:
            return ""
        if self._joined is not None:
            return self._joined[start:end]
        first = bisect.bisect_right(self._ends, start)
        last = min(bisect.bisect_left(self._ends, end), len(self._chunks) - 1)
        base = self._ends[first - 1] if first else 0
        return "".join(self._chunks[first : last + 1])[start - base : end - base]

    def _chunk_start(self, index: int) -> int:
        return self._ends[index - 1] if index else 0

    def _local_starts(self, index: int) -> list[int]:
        starts = self._starts[index]
        if starts is None:
            starts = self._starts[index] = line_starts(self._chunks[index])
        return starts

    def line_span(self, line: int) -> tuple[int, int] | None:
        """``(start, end)`` of ``line`` without its break, or None past the last line."""
        if line < 0 or line >= self.line_count:
            return None
        index = min(bisect.bisect_right(self._breaks, line), len(self._chunks) - 1)
        first_line = self._breaks[index - 1] if index else 0
        starts = self._local_starts(index)
        local = line - first_line
        base = self._chunk_start(index)
        chunk = self._chunks[index]
        start = starts[local]
        if local + 1 < len(starts):
            end = starts[local + 1] - 1
            if end > start and chunk[end] == "\n" and chunk[end - 1] == "\r":
                end -= 1
        else:
            end = len(chunk)
        return base + start, base + end

    def line_text(self, line: int) -> str:
        span = self.line_span(line)
        return "" if span is None else self.slice(*span)

    def line_of(self, offset: int) -> int:
        """The line holding character ``offset`` (clamped into the text)."""
        offset = max(0, min(offset, len(self)))
        index = min(bisect.bisect_right(self._ends, offset), len(self._chunks) - 1)
        local = offset - self._chunk_start(index)
        first_line = self._breaks[index - 1] if index else 0
        return first_line + bisect.bisect_right(self._local_starts(index), local) - 1

    def replace(self, start: int, end: int, text: str) -> None:
        """``value[start:end] = text``, rewriting only the chunks the edit touches."""
        total = len(self)
        start, end = max(0, min(start, total)), max(0, min(end, total))
        start, end = min(start, end), max(start, end)
        count = len(self._chunks)
        lo = min(bisect.bisect_right(self._ends, start), count - 1)
        hi = min(bisect.bisect_right(self._ends, end), count - 1)
        base = self._chunk_start(lo)
        merged = "".join(self._chunks[lo : hi + 1])
        merged = merged[: start - base] + text + merged[end - base :]
        # Keep the invariants: a chunk before the last ends with a line break, and no "\r\n" is cut.
        while lo > 0 and merged.startswith("\n") and self._chunks[lo - 1].endswith("\r"):
            lo -= 1
            merged = self._chunks[lo] + merged
        while hi < count - 1 and (not merged.endswith(("\n", "\r"))
                                  or (merged.endswith("\r") and self._chunks[hi + 1].startswith("\n"))):
            hi += 1
            merged += self._chunks[hi]
        pieces = split_chunks(merged, self.chunk_chars) if merged or count == hi - lo + 1 else []
        if pieces == [""] and count > hi - lo + 1:
            pieces = []
        self._chunks[lo : hi + 1] = pieces
        self._breaks_in[lo : hi + 1] = [count_breaks(p) for p in pieces]
        self._starts[lo : hi + 1] = [None] * len(pieces)
        if not self._chunks:
            self._chunks, self._breaks_in, self._starts = [""], [0], [None]
        self._joined = None
        self._reindex()

    def set(self, text: str) -> None:
        self.__init__(text, self.chunk_chars)  # type: ignore[misc]

    def chunks(self) -> Iterator[str]:
        return iter(list(self._chunks))


# ---- the workspace document ---------------------------------------------------------------------


class SyncedDocument(TextDocument):
    """A pygls workspace document kept by LSP's line rules in a :class:`ChunkedText`.

    Every incoming text has its lone surrogates replaced already (the protocol layer does that for
    every string of every message), so the text can always be encoded.
    """

    def __init__(self, uri: str, source: str | None = None, version: int | None = None,
                 language_id: str | None = None, local: bool = True,
                 sync_kind: types.TextDocumentSyncKind = types.TextDocumentSyncKind.Incremental,
                 position_codec: Any = None) -> None:
        super().__init__(uri, None, version, language_id, local, sync_kind, position_codec)
        self.chunked = ChunkedText(without_lone_surrogates(source or ""), CHUNK_CHARS)

    @property
    def encoding(self) -> str:
        return encoding_name(self.position_codec.encoding)

    @property
    def source(self) -> str:  # type: ignore[override]
        return self.chunked.value

    def __len__(self) -> int:
        return len(self.chunked)

    @property
    def lines(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(split_lines(self.chunked.value))

    # ---- positions ----------------------------------------------------------------------------

    def offset_at(self, position: types.Position, *, clamp_line: bool = False) -> int | None:
        """The character offset of an LSP position; past a line's end, the line's end. Past the last
        line: the document's end when ``clamp_line`` (an edit), else None (a request)."""
        span = self.chunked.line_span(position.line)
        if span is None:
            return len(self.chunked) if clamp_line and position.line >= 0 else None
        start, end = span
        if position.character <= 0:
            return start
        line = self.chunked.slice(start, end)
        return start + chars_in(line, position.character, self.encoding)

    def position_at(self, offset: int) -> types.Position:
        offset = max(0, min(offset, len(self.chunked)))
        line = self.chunked.line_of(offset)
        span = self.chunked.line_span(line)
        start = span[0] if span is not None else 0
        return types.Position(line=line, character=units_of(self.chunked.slice(start, offset), self.encoding))

    def offset_at_position(self, client_position: types.Position) -> int:
        found = self.offset_at(client_position, clamp_line=True)
        return len(self.chunked) if found is None else found

    def client_position_at_offset(self, offset: int) -> types.Position:
        return self.position_at(offset)

    def text_in_client_range(self, range: types.Range) -> str:
        return self.chunked.slice(self.offset_at_position(range.start), self.offset_at_position(range.end))

    def word_at_position(self, client_position: types.Position, *args: Any, **kwargs: Any) -> str:
        line = self.chunked.line_text(client_position.line)
        column = chars_in(line, client_position.character, self.encoding)
        head = re.search(r"[A-Za-z_0-9]*$", line[:column])
        tail = re.match(r"[A-Za-z_0-9]*", line[column:])
        return (head.group(0) if head else "") + (tail.group(0) if tail else "")

    # ---- changes ------------------------------------------------------------------------------

    def apply_change(self, change: types.TextDocumentContentChangeEvent) -> None:
        """An incremental change (clamped into the text as editors do) or a whole new text."""
        text = change.text
        if isinstance(change, types.TextDocumentContentChangePartial):
            start = self.offset_at_position(change.range.start)
            end = self.offset_at_position(change.range.end)
            self.chunked.replace(min(start, end), max(start, end), text)
        else:
            self.chunked.set(text)


class SyncedWorkspace(Workspace):
    """pygls' workspace with :class:`SyncedDocument` documents."""

    def _create_text_document(self, doc_uri: str, source: str | None = None, version: int | None = None,
                              language_id: str | None = None) -> TextDocument:
        return SyncedDocument(doc_uri, source=source, version=version, language_id=language_id,
                              sync_kind=self._sync_kind, position_codec=self._position_codec)


# ---- what a request reads -----------------------------------------------------------------------


_TOP_LEVEL = re.compile(r"(?:\r\n|\r|\n)(?=[A-Za-z_@#$])")


@dataclass(frozen=True)
class Segment:
    """``View.text[start:end]`` is the document's text from offset ``doc_start``, which lies at
    ``(doc_line, doc_units)`` in the document."""

    start: int
    end: int
    doc_start: int
    doc_line: int
    doc_units: int


class View:
    """A snapshot of the text a request reads, and the mapping to the document's positions.

    For a document up to the window size it is the whole text. A larger one is read as its head
    (up to an eighth of the window, cut where a top-level line starts: the imports) followed by a
    window around the cursor, cut at top-level lines too; the window moves in steps of a quarter of
    its size, so the text the caches see stays the same while the user types.
    """

    def __init__(self, text: str, segments: list[Segment], encoding: str = UTF16,
                 document_chars: int | None = None) -> None:
        self.text = text
        self.segments = segments
        self.encoding = encoding
        self.document_chars = len(text) if document_chars is None else document_chars
        self._starts: list[int] | None = None
        self._newline_starts: list[int] | None = None

    @classmethod
    def whole(cls, text: str, encoding: str = UTF16) -> View:
        return cls(text, [Segment(0, len(text), 0, 0, 0)], encoding)

    @property
    def windowed(self) -> bool:
        return len(self.text) < self.document_chars

    def starts(self) -> list[int]:
        """Line starts of ``text`` by LSP's rules."""
        if self._starts is None:
            self._starts = line_starts(self.text)
        return self._starts

    def newline_starts(self) -> list[int]:
        """Line starts of ``text`` at ``\n`` only: how the checkers number their lines."""
        if self._newline_starts is None:
            self._newline_starts = line_starts(self.text.replace("\r", " ")) if "\r" in self.text \
                else self.starts()
        return self._newline_starts

    def _segment_at(self, offset: int) -> Segment:
        for segment in reversed(self.segments):
            if segment.start <= offset:
                return segment
        return self.segments[0]

    def _reaches_end(self, segment: Segment) -> bool:
        return segment.doc_start + segment.end - segment.start >= self.document_chars

    # ---- mapping ------------------------------------------------------------------------------

    def contiguous(self, start: int, end: int) -> bool:
        """Whether ``text[start:end]`` is one stretch of the document (an edit of it may be sent)."""
        return any(s.start <= start and end <= s.end for s in self.segments)

    def document_offset(self, offset: int) -> int:
        """The document offset of an offset into ``text`` (at a seam: the later segment's start)."""
        offset = max(0, min(offset, len(self.text)))
        segment = self._segment_at(offset)
        return segment.doc_start + offset - segment.start

    def offset_of_document(self, doc_offset: int) -> int | None:
        """The offset into ``text`` of a document offset, or None when the view does not hold it."""
        for segment in reversed(self.segments):
            if segment.doc_start <= doc_offset <= segment.doc_start + segment.end - segment.start:
                return segment.start + doc_offset - segment.doc_start
        return None

    def position(self, offset: int) -> types.Position:
        """The document position of an offset into ``text``."""
        offset = max(0, min(offset, len(self.text)))
        segment = self._segment_at(offset)
        starts = self.starts()
        line = bisect.bisect_right(starts, offset) - 1
        first = bisect.bisect_right(starts, segment.start) - 1
        if line == first:
            units = segment.doc_units + units_of(self.text[segment.start:offset], self.encoding)
        else:
            units = units_of(self.text[starts[line]:offset], self.encoding)
        return types.Position(line=segment.doc_line + line - first, character=units)

    def offset(self, position: types.Position) -> int | None:
        """The offset into ``text`` of a document position (past a line's end: the line's end), or
        None when the position lies past the document's last line or outside the view."""
        starts = self.starts()
        for segment in reversed(self.segments):
            if position.line < segment.doc_line:
                continue
            first = bisect.bisect_right(starts, segment.start) - 1
            line = first + position.line - segment.doc_line
            if line >= len(starts):
                return None
            line_start = max(starts[line], segment.start)
            if line_start > segment.end:
                return None
            if line_start == segment.end and not self._reaches_end(segment):
                # The start of the line after the view: held only as the last segment's end.
                return segment.end if segment is self.segments[-1] and position.character == 0 else None
            line_end = min(starts[line + 1] if line + 1 < len(starts) else len(self.text), segment.end)
            body = strip_break(self.text[line_start:line_end])
            units = position.character - (segment.doc_units if line == first else 0)
            if units < 0:
                return None
            cut_short = len(body) == line_end - line_start and line_end == segment.end and not self._reaches_end(segment)
            if cut_short and units > units_of(body, self.encoding):
                return None  # the line goes on past what the view holds
            return line_start + chars_in(body, units, self.encoding)
        return None


def document_view(document: SyncedDocument, cursor: int, window_chars: int) -> View:
    """What a request at character ``cursor`` reads of ``document`` (see :class:`View`)."""
    encoding = document.encoding
    total = len(document)
    if total <= window_chars:
        return View.whole(document.source, encoding)
    chunked = document.chunked
    cursor = max(0, min(cursor, total))
    head_budget = window_chars // 8
    body_chars = window_chars - head_budget
    step = max(1, body_chars // 4)
    lo = max(0, (cursor - body_chars // 2) // step * step)
    start = 0
    if lo > 0:
        start = _top_level_before(chunked, lo, step, lines=True)
        if start is None:
            start = lo
    head_end = (_top_level_before(chunked, head_budget, head_budget) or 0) if start > 0 else 0
    if start <= head_end:
        start, head_end = 0, 0
    end = _top_level_after(chunked, start + body_chars, step)
    if end < cursor:  # a line longer than the window: keep the cursor inside
        end = min(total, cursor + step)
    segments: list[Segment] = []
    pieces: list[str] = []
    if head_end:
        pieces.append(chunked.slice(0, head_end))
        segments.append(Segment(0, head_end, 0, 0, 0))
    body = chunked.slice(start, end)
    where = document.position_at(start)
    segments.append(Segment(head_end, head_end + len(body), start, where.line, where.character))
    pieces.append(body)
    return View("".join(pieces), segments, encoding, total)


def _top_level_before(chunked: ChunkedText, offset: int, reach: int, lines: bool = False) -> int | None:
    """The last top-level line start at or before ``offset`` and within ``reach`` of it (with
    ``lines``: else the last line start), or None."""
    lo = max(0, offset - reach)
    text = chunked.slice(lo, offset + 1)  # the character at ``offset`` decides whether a line there is top-level
    found = None
    for pattern in (_TOP_LEVEL, LINE_BREAK) if lines else (_TOP_LEVEL,):
        for match in pattern.finditer(text):
            if lo + match.end() <= offset:
                found = lo + match.end()
        if found is not None:
            break
    return found


def _top_level_after(chunked: ChunkedText, offset: int, reach: int) -> int:
    """The first top-level line start at or after ``offset`` and within ``reach`` of it, else the
    first line start, else ``offset`` (the document's end at most)."""
    total = len(chunked)
    if offset >= total:
        return total
    base = max(0, offset - 2)
    text = chunked.slice(base, offset + reach)
    for pattern in (_TOP_LEVEL, LINE_BREAK):
        match = next((m for m in pattern.finditer(text) if base + m.end() >= offset), None)
        if match is not None:
            return base + match.end()
    return min(total, offset + reach) if offset + reach < total else total
