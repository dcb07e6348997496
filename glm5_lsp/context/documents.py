"""Documents: text plus a tree-sitter tree, re-parsed incrementally on edits.

Positions are ``(line, column)`` with 0-based lines and columns counted in Unicode code points
(Python string indices); the server converts from the editor's encoding at its edge. Tree-sitter
works in UTF-8 bytes, so each document keeps its encoded bytes and converts where needed (a pure
ASCII document, the common case, needs no conversion). A language without a grammar has no tree.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from glm5_lsp.languages import PLAIN, Grammar, detect_language, load_grammar

if TYPE_CHECKING:
    import tree_sitter

log = logging.getLogger(__name__)
_NEWLINE = re.compile("\n")


class Change(NamedTuple):
    """Where an applied edit landed, in UTF-8 bytes, and how many lines it added (negative: removed).

    ``changed`` is the new-text byte range whose syntax changed (tree-sitter's ``changed_ranges``,
    merged with the edit itself): error recovery can restructure code beyond the edited bytes.
    """

    start_byte: int
    old_end_byte: int
    new_end_byte: int
    line_delta: int
    changed: tuple[int, int]


@dataclass(frozen=True)
class Edit:
    """Replace the text between two positions with ``new_text`` (an LSP content change)."""

    start_line: int
    start_col: int
    end_line: int
    end_col: int
    new_text: str


class Document:
    """One file's text, its language and (when a grammar exists) its syntax tree."""

    # Counts every full or incremental parse in this process (tests use it to prove cache reuse).
    parse_count = 0

    def __init__(self, path: str, text: str, language: str = PLAIN, version: int = 0) -> None:
        self.path = path
        self.language = language
        self.version = version
        self.grammar: Grammar | None = load_grammar(language)
        self._parser: tree_sitter.Parser | None = self.grammar.parser() if self.grammar else None
        self.tree: tree_sitter.Tree | None = None
        self._set_text(text)
        self._parse(None)

    # -- text and positions ---------------------------------------------------------------
    def _set_text(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8", errors="surrogatepass")
        self.ascii = len(self.data) == len(text)
        if self.ascii:  # byte offsets are string offsets: let numpy find the newlines
            import numpy as np

            newlines = np.flatnonzero(np.frombuffer(self.data, dtype=np.uint8) == 10) + 1
            self.line_starts = [0, *newlines.tolist()]
        else:
            self.line_starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line(self, line: int) -> str:
        """The text of one line without its newline ('' past the end)."""
        if not 0 <= line < len(self.line_starts):
            return ""
        start = self.line_starts[line]
        end = self.line_starts[line + 1] - 1 if line + 1 < len(self.line_starts) else len(self.text)
        return self.text[start:end]

    def offset(self, line: int, col: int) -> int:
        """The string offset of a position, clamped into the document."""
        if line < 0:
            return 0
        if line >= len(self.line_starts):
            return len(self.text)
        start = self.line_starts[line]
        end = self.line_starts[line + 1] - 1 if line + 1 < len(self.line_starts) else len(self.text)
        return min(start + max(col, 0), end)

    def position(self, offset: int) -> tuple[int, int]:
        """The ``(line, col)`` of a string offset."""
        offset = min(max(offset, 0), len(self.text))
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line, offset - self.line_starts[line]

    def byte_offset(self, offset: int) -> int:
        return offset if self.ascii else len(self.text[:offset].encode("utf-8", errors="surrogatepass"))

    def char_offset(self, byte: int) -> int:
        if self.ascii:
            return byte
        return len(self.data[:byte].decode("utf-8", errors="replace"))

    def node_text(self, node: tree_sitter.Node) -> str:
        return self.data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")

    # -- parsing --------------------------------------------------------------------------
    def _parse(self, old: tree_sitter.Tree | None) -> None:
        if self._parser is None:
            return
        Document.parse_count += 1
        self.tree = self._parser.parse(self.data, old) if old is not None else self._parser.parse(self.data)

    def _point(self, line: int, offset: int) -> tuple[int, int]:
        """Tree-sitter point (row, byte column) of a string offset on ``line``."""
        start = self.line_starts[line]
        if self.ascii:
            return line, offset - start
        return line, len(self.text[start:offset].encode("utf-8", errors="surrogatepass"))

    def apply(self, edit: Edit) -> Change:
        """Apply one edit and re-parse incrementally, reusing the old tree (returns where it landed)."""
        start = self.offset(edit.start_line, edit.start_col)
        end = max(self.offset(edit.end_line, edit.end_col), start)
        start_byte, old_end_byte = self.byte_offset(start), self.byte_offset(end)
        start_point = self._point(*self._line_and(start))
        old_end_point = self._point(*self._line_and(end))
        line_delta = edit.new_text.count("\n") - self.text.count("\n", start, end)
        self._set_text(self.text[:start] + edit.new_text + self.text[end:])
        new_end = start + len(edit.new_text)
        new_end_byte = start_byte + len(edit.new_text.encode("utf-8", errors="surrogatepass"))
        new_end_point = self._point(*self._line_and(new_end))
        if self.tree is not None:
            self.tree.edit(
                start_byte=start_byte,
                old_end_byte=old_end_byte,
                new_end_byte=new_end_byte,
                start_point=start_point,
                old_end_point=old_end_point,
                new_end_point=new_end_point,
            )
            old_tree = self.tree
            self._parse(old_tree)
            lo, hi = start_byte, new_end_byte
            for r in self.tree.changed_ranges(old_tree):
                lo, hi = min(lo, r.start_byte), max(hi, r.end_byte)
            return Change(start_byte, old_end_byte, new_end_byte, line_delta, (lo, hi))
        return Change(start_byte, old_end_byte, new_end_byte, line_delta, (start_byte, new_end_byte))

    def _line_and(self, offset: int) -> tuple[int, int]:
        return self.position(offset)[0], offset

    def replace(self, text: str) -> None:
        """Replace the whole text (a full-document sync) and re-parse from scratch."""
        self._set_text(text)
        self._parse(None)

    @property
    def has_errors(self) -> bool:
        return self.tree is not None and self.tree.root_node.has_error


@dataclass
class DocumentStore:
    """The open documents, keyed by path."""

    documents: dict[str, Document] = field(default_factory=dict)

    def open(self, path: str | os.PathLike[str], text: str, language_id: str | None = None, version: int = 0) -> Document:
        key = os.fspath(path)
        doc = Document(key, text, detect_language(key, language_id), version)
        self.documents[key] = doc
        return doc

    def update(
        self, path: str | os.PathLike[str], changes: Iterable[Edit | str], version: int | None = None
    ) -> Document:
        """Apply content changes in order: an :class:`Edit`, or a ``str`` replacing the whole text."""
        key = os.fspath(path)
        doc = self.documents.get(key)
        if doc is None:
            raise KeyError(f"document {key} is not open")
        for change in changes:
            if isinstance(change, str):
                doc.replace(change)
            else:
                doc.apply(change)
        if version is not None:
            doc.version = version
        return doc

    def close(self, path: str | os.PathLike[str]) -> None:
        self.documents.pop(os.fspath(path), None)

    def get(self, path: str | os.PathLike[str]) -> Document | None:
        return self.documents.get(os.fspath(path))

    def __iter__(self):
        return iter(list(self.documents.values()))
