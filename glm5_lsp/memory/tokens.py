"""A text as the model's token ids, re-tokenized only where it changed.

The memory matches the model's context token for token, so a file must be tokenized exactly as a
prompt made of it would be. Re-tokenizing a 2,600-line file on every keystroke costs tens of
milliseconds, so a text is cut into *chunks* at points where the byte-level BPE always splits: right
before a line break that follows a character that is not white space. The pre-tokenizer's pieces
(``?\\p{L}+``, ``?\\p{N}+``, ``?[^\\s\\p{L}\\p{N}]+``, runs of white space) never join a character
that is not white space to the white space after it, and BPE merges only inside a piece, so the
chunks' token ids laid end to end are the whole text's (``tests/test_memory_tokens.py`` checks it
on the standard library). A chunk is therefore a line break, the indentation and the line after it
(blank lines and lines that end in spaces join the next chunk). An edit re-tokenizes the chunks it
touches and splices their ids in.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from glm5_lsp.textdiff import diff_region

# Where a chunk starts: a line break right after a character that is not white space.
_CUT = re.compile(r"(?<=\S)\n")


class Encoder(Protocol):
    """What the memory needs of a tokenizer (``glm5_lsp.model.Tokenizer`` has it)."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id and one more value, the separator."""
    return np.dtype(np.uint16) if vocab_size < np.iinfo(np.uint16).max else np.dtype(np.uint32)


def separator(dtype: np.dtype) -> int:
    """The id that ends every document in an index: no token has it, so no match crosses it."""
    return int(np.iinfo(dtype).max)


def chunk_starts(text: str) -> list[int]:
    """Character offsets where the chunks of ``text`` start (0 first)."""
    return [0, *(m.start() for m in _CUT.finditer(text))]


def last_chunk_start(text: str, end: int | None = None) -> int:
    """Where the last chunk of ``text[:end]`` starts (the last of :func:`chunk_starts`), found from
    the end."""
    end = len(text) if end is None else end
    i = text.rfind("\n", 0, end)
    while i > 0 and text[i - 1].isspace():
        i = text.rfind("\n", 0, i)
    return max(i, 0)


def encode_batch(tokenizer: Encoder, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of several texts (the ``tokenizers`` library's parallel batch where it is there)."""
    inner = getattr(tokenizer, "_tok", None)
    if inner is not None and hasattr(inner, "encode_batch") and len(texts) > 8:  # a few: no thread pool
        return [e.ids for e in inner.encode_batch(list(texts), add_special_tokens=False)]
    return [tokenizer.encode(t) for t in texts]


class TokenizedText:
    """One text's token ids, chunk by chunk, kept up to date by :meth:`update`."""

    def __init__(self, tokenizer: Encoder, text: str, ids: Sequence[int] | None = None,
                 token_starts: Sequence[int] | None = None) -> None:
        """``ids`` and ``token_starts`` (each token's first character), when given, are the whole
        text's encoding already made (a batch), split here at the chunk starts."""
        self.tokenizer = tokenizer
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.text = ""
        self._chunk_chars: list[int] = []  # each chunk's first character
        self._chunk_ids: list[np.ndarray] = []
        self._ids: np.ndarray | None = None
        self._set_all(text, ids, token_starts)

    # ---- reading ----------------------------------------------------------------------------

    @property
    def ids(self) -> np.ndarray:
        """All the text's token ids (``[N]``, the memory's dtype)."""
        if self._ids is None:
            self._ids = (np.concatenate(self._chunk_ids) if self._chunk_ids
                         else np.zeros(0, dtype=self.dtype))
        return self._ids

    def __len__(self) -> int:
        return len(self.ids)

    def token_at(self, offset: int) -> int:
        """The index of the token that holds character ``offset`` (the number of tokens when the
        offset is at or past the end)."""
        if offset >= len(self.text):
            return len(self.ids)
        offset = max(0, offset)
        chunk = bisect_right(self._chunk_chars, offset) - 1
        base = sum(len(c) for c in self._chunk_ids[:chunk])
        start = self._chunk_chars[chunk]
        end = self._chunk_chars[chunk + 1] if chunk + 1 < len(self._chunk_chars) else len(self.text)
        _, offsets = self.tokenizer.encode_with_offsets(self.text[start:end])
        for i, (_, stop) in enumerate(offsets):
            if start + stop > offset:
                return base + i
        return base + len(offsets)

    def ids_before(self, end: int, need: int) -> tuple[int, np.ndarray] | None:
        """The ids of the whole chunks before character ``end`` (a chunk start, or the text's end), as
        ``(first character, ids)``: the last chunks that hold more than ``need`` ids, or all of them.
        None where ``end`` is not where a chunk starts (its ids would not be the text's)."""
        chars = self._chunk_chars
        last = bisect_right(chars, end) - 1  # the chunk that starts at ``end``, or the one holding it
        if end == len(self.text):
            last = len(chars)
        elif last < 0 or chars[last] != end:
            return None
        first, count = last, 0
        while first > 0 and count <= need:
            first -= 1
            count += len(self._chunk_ids[first])
        if first == last:
            return 0, np.zeros(0, dtype=self.dtype)
        return chars[first], np.concatenate(self._chunk_ids[first:last])

    # ---- writing ----------------------------------------------------------------------------

    def _set_all(self, text: str, ids: Sequence[int] | None, token_starts: Sequence[int] | None = None) -> None:
        self.text = text
        starts = chunk_starts(text)
        if (ids is None or token_starts is None) and len(starts) > 8:  # one pass over the whole text
            ids, offsets = self.tokenizer.encode_with_offsets(text)
            token_starts = [o[0] for o in offsets]
        if ids is not None and token_starts is not None:
            cuts = np.searchsorted(np.asarray(token_starts, dtype=np.int64), np.asarray(starts[1:], dtype=np.int64))
            if not all(cut < len(token_starts) and token_starts[cut] == start for cut, start in zip(cuts.tolist(), starts[1:])):
                ids = token_starts = None  # a chunk start inside a token (an odd tokenizer): encode chunk by chunk
        if ids is None or token_starts is None:
            pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]
            chunk_ids = encode_batch(self.tokenizer, pieces) if text else []
            self._chunk_ids = [np.asarray(c, dtype=self.dtype) for c in chunk_ids]
        else:  # split the whole text's ids at the chunk starts (they are token boundaries)
            all_ids = np.asarray(ids, dtype=self.dtype)
            self._chunk_ids = list(np.split(all_ids, cuts)) if text else []
        self._chunk_chars = starts if text else []
        self._ids = None

    def update(self, text: str) -> tuple[int, int, int]:
        """Make this the token ids of ``text``, re-tokenizing only the chunks the change touches.

        Returns ``(start, removed, added)`` in tokens: ids ``[start, start + removed)`` of the old
        sequence became ``added`` new ones (``(n, 0, 0)`` for no change)."""
        old = self.text
        if text == old:
            return len(self.ids), 0, 0
        if not old or not self._chunk_ids:
            before = len(self.ids)
            self._set_all(text, None)
            return 0, before, len(self.ids)
        start, end, _ = diff_region(old, text)
        delta = len(text) - len(old)
        chars = self._chunk_chars
        # The chunks that hold the change, one more on each side: a cut may have appeared or gone.
        first = max(0, bisect_right(chars, start) - 2)
        last = min(len(chars), bisect_right(chars, end) + 1)  # chunks [first, last) are replaced
        old_from = chars[first]
        old_to = chars[last] if last < len(chars) else len(old)
        new_from, new_to = old_from, old_to + delta
        piece = text[new_from:new_to]
        local = chunk_starts(piece) if piece else []
        pieces = [piece[a:b] for a, b in zip(local, [*local[1:], len(piece)])]
        fresh = [np.asarray(c, dtype=self.dtype) for c in encode_batch(self.tokenizer, pieces)] if pieces else []
        token_from = sum(len(c) for c in self._chunk_ids[:first])
        removed = sum(len(c) for c in self._chunk_ids[first:last])
        self._chunk_ids[first:last] = fresh
        self._chunk_chars[first:last] = [new_from + a for a in local]
        for i in range(first + len(local), len(self._chunk_chars)):
            self._chunk_chars[i] += delta
        self.text = text
        self._ids = None
        return token_from, removed, sum(len(c) for c in fresh)
