"""The memory's next-token estimate for a text, in the model's tokens, wherever the text ends.

The memory holds files as the tokenizer cuts them whole. A context that ends mid-word (``self.na``,
token healing's cut), after white space (``x = ``, or ``\\n\\n`` that a following name would split
in two), or after a token that could still grow (``.`` before ``(``) is tokenized differently from
the same characters inside a file, so its ids would rarely be found. Here the text is cut where the
tokenization is settled: before its last pre-token (the byte-level regex's piece) and the white
space before that, which leaves a text ending in a character that is not white space, whose ids are
exactly the file's. The rest, *pending* text, is matched through the memory's own tokens: a next
id whose text runs past the pending text gives its remainder (the longest vocabulary token it
starts with) as the model's next token; one that the pending text runs past is followed one level
deeper (the most frequent one). A continuation that disagrees with the pending text does not count;
when none agrees, shorter suffixes are tried (backing off as an n-gram model does when a count is 0).

With nothing pending the estimate is the memory's own counts, id for id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from glm5_lsp.memory.matcher import Match, Matcher
from glm5_lsp.memory.tokens import last_chunk_start

MAX_DEPTH = 4  # levels of pending text followed through the memory's own tokens (the slow way)
BACKOFF_TRIES = 4
RECENT = 64  # estimates remembered by the text they follow
BIND_WINDOW = 4096  # characters of code before the cursor encoded at first (more while too few ids)
# The shorter suffixes whose estimates are mixed beside the longest match's (``TextMatcher.shorter``),
# one slot each: the longest's length less one, less two, half of it, then 4, 2 and 1 ids. A slot is
# empty where its length is not shorter than the longest match or an earlier slot has it already.
SHORTER_SLOTS = 6


def shorter_lengths(length: int) -> list[int]:
    """The suffix length of each shorter slot after a longest match of ``length`` ids (0: empty)."""
    out: list[int] = []
    taken = {length}
    for wanted in (length - 1, length - 2, length // 2, 4, 2, 1):
        ok = 1 <= wanted < length and wanted not in taken
        out.append(wanted if ok else 0)
        taken.add(wanted)
    return out


@dataclass
class Estimate:
    """The memory's distribution over the model's next token: ``ids`` and ``probs`` (summing to 1,
    or empty), and the match it came from (its length and count set the mixing weight)."""

    ids: np.ndarray
    probs: np.ndarray
    match: Match

    @property
    def empty(self) -> bool:
        return not len(self.ids)

    def top(self) -> tuple[int, float]:
        if self.empty:
            return -1, 0.0
        best = int(np.argmax(self.probs))
        return int(self.ids[best]), float(self.probs[best])


class Vocabulary:
    """Token strings and the longest token a text begins with."""

    _cache: ClassVar[dict[int, Vocabulary]] = {}

    def __init__(self, strings: Sequence[str]) -> None:
        self.strings = strings
        self.by_string: dict[str, int] = {}
        for i, s in enumerate(strings):
            if s and "\ufffd" not in s:
                self.by_string.setdefault(s, i)
        self.longest = max((len(s) for s in self.by_string), default=1)
        self.first_char = np.asarray([ord(s[0]) if s else -1 for s in strings], dtype=np.int64)

    @classmethod
    def of(cls, tokenizer: object) -> Vocabulary:
        strings = tokenizer.token_strings()  # type: ignore[attr-defined]
        found = cls._cache.get(id(strings))
        if found is None or found.strings is not strings:
            found = cls._cache[id(strings)] = cls(strings)
        return found

    def first_token(self, text: str) -> int:
        """The id of the longest token that ``text`` begins with (-1 for none)."""
        for n in range(min(len(text), self.longest), 0, -1):
            i = self.by_string.get(text[:n])
            if i is not None:
                return i
        return -1


class TextMatcher:
    """A :class:`~glm5_lsp.memory.matcher.Matcher` driven by text: ``bind`` the code before the
    cursor, then ask for the estimate after any text written since."""

    def __init__(self, matcher: Matcher, tokenizer: object) -> None:
        self.matcher = matcher
        self.tokenizer = tokenizer
        self.vocab = Vocabulary.of(tokenizer)
        inner = getattr(tokenizer, "_tok", None)
        self._pre = inner.pre_tokenizer if inner is not None and inner.pre_tokenizer is not None else None
        self.code = ""
        self.typed = ""  # the healed word after ``code`` (``bind``)
        self._tail_start = 0  # a chunk start in ``code``: ids before it are bound to the matcher
        self._stable: tuple[str, list[int]] = ("", [])  # a chunk-aligned start of the tail and its ids
        self._recent: dict[tuple[str, bool], Estimate] = {}
        self._recent_shorter: dict[str, list[Estimate | None]] = {}

    def bind(self, code: str, known: Callable[[int, int], list[int] | None] | None = None, typed: str = "") -> None:
        """Follow ``code`` (the prompt's code, up to the cursor). ``known(end, need)``: the ids of
        ``code[:end]`` (or of its last chunks, more than ``need`` of them) where they are at hand
        already (the memory's own tokens of the document), None where not: then they are encoded.
        ``typed``: what the user typed after ``code`` that the model is made to write again (a
        healed word): the estimate after it is the one the cursor itself would get (the slow way
        where its last piece is pending), not a generation's."""
        self.code = code
        self.typed = typed
        self._recent, self._recent_shorter = {}, {}
        self._tail_start = last_chunk_start(code)
        need = getattr(self.matcher, "max_match", None)
        ids = known(self._tail_start, need) if known is not None and need is not None else None
        self.matcher.bind(ids if ids is not None else self._head_ids(code[: self._tail_start]))
        self._stable = ("", [])

    def _head_ids(self, head: str) -> list[int]:
        """Ids of the code before the tail, or of its last chunks where those hold more ids than the
        matcher reads (its longest match is at most ``max_match`` ids: what lies further back never
        changes a match, and a long file's whole prefix would cost milliseconds to encode each request)."""
        encode = self.tokenizer.encode  # type: ignore[attr-defined]
        need = getattr(self.matcher, "max_match", None)
        window = BIND_WINDOW
        while need is not None and len(head) > window:
            cut = last_chunk_start(head, len(head) - window)
            if cut <= 0:
                break
            ids = encode(head[cut:])
            if len(ids) > need:
                return ids
            window *= 4
        return encode(head) if head else []

    # ---- the settled ids and the pending text ---------------------------------------------------

    def split(self, written: str) -> tuple[list[int], str]:
        """The ids after the bound part up to where the text's tokenization is settled, and the
        pending text after it."""
        tail = self.code[self._tail_start:] + written
        cut = self._settled(tail)
        return self._ids(tail[:cut]), tail[cut:]

    def _settled(self, tail: str) -> int:
        line = last_chunk_start(tail)
        piece = tail[line:]
        if self._pre is not None and piece:
            pieces = self._pre.pre_tokenize_str(piece)
            cut = line + (pieces[-1][1][0] if pieces else 0)
        else:  # no pre-tokenizer to ask: the last run of word characters or of other characters
            cut = len(tail)
            while cut > line and (tail[cut - 1].isalnum() or tail[cut - 1] == "_"):
                cut -= 1
            if cut == len(tail):
                while cut > line and not tail[cut - 1].isalnum() and not tail[cut - 1].isspace():
                    cut -= 1
        return cut

    def _ids(self, text: str) -> list[int]:
        """Ids of ``text`` (a start of the tail), re-encoding only what follows the last chunk
        start encoded before."""
        stable_end = last_chunk_start(text)
        known, ids = self._stable
        if not text.startswith(known) or len(known) > stable_end:
            known, ids = "", []
        if stable_end > len(known):
            ids = ids + self.tokenizer.encode(text[len(known):stable_end])  # type: ignore[attr-defined]
            known = text[:stable_end]
            self._stable = (known, ids)
        return ids + self.tokenizer.encode(text[stable_end:]) if stable_end < len(text) else list(ids)  # type: ignore[attr-defined]

    # ---- estimates ------------------------------------------------------------------------------

    def estimate(self, written: str, *, within_piece: bool = False) -> Estimate:
        """The memory's distribution over the model's next token after the bound code plus ``written``
        (the last few are remembered: a draft's proposal and the steps that verify it ask the same).

        ``within_piece``: where that estimate is empty (no longer context goes on as the text's last
        piece does), what followed a match found only inside that piece (its last token or two,
        anywhere in the memory) instead. Mixed into the model's distribution with its own fitted
        weight this lowers held-out perplexity (such a match is short, its weight small); a greedy
        continuation leaves it out (it would run on from one token's worth of context)."""
        found = self._recent.get((written, False))
        if found is None:
            found = self._estimate_text(written)
            self._remember((written, False), found)
        if not within_piece or not found.empty:
            return found
        loose = self._recent.get((written, True))
        if loose is None:
            loose = self._in_piece(written)
            self._remember((written, True), loose)
        return loose

    def shorter(self, written: str) -> list[Estimate | None]:
        """What followed shorter suffixes of the bound code plus ``written`` (as the tokenizer cuts the
        text), one estimate per slot of :func:`shorter_lengths` (None where the slot is empty or
        nothing followed): an n-gram model's lower orders, which the mixing weighs beside the longest
        match (it misses the next token about four times in ten on held-out code, where these
        often have it)."""
        found = self._recent_shorter.get(written)
        if found is not None:
            return found
        ids, pending = self.split(written)
        context = ids + (self._encode(pending) if pending else [])
        length = self.matcher.sync(context).length
        found = []
        for wanted in shorter_lengths(length):
            match = self.matcher.backoff(context, wanted) if wanted else None
            if match is None or not len(match.counts.ids):
                found.append(None)
                continue
            found.append(self._estimate(match.counts.ids, match.counts.counts.astype(np.float64), match))
        self._recent_shorter[written] = found
        if len(self._recent_shorter) > RECENT:
            self._recent_shorter.pop(next(iter(self._recent_shorter)))
        return found

    def _remember(self, key: tuple[str, bool], estimate: Estimate) -> None:
        self._recent[key] = estimate
        if len(self._recent) > RECENT:
            self._recent.pop(next(iter(self._recent)))

    def _in_piece(self, written: str) -> Estimate:
        ids, pending = self.split(written)
        match = self.matcher.sync(ids + (self._encode(pending) if pending else []))
        return self._estimate(match.counts.ids, match.counts.counts.astype(np.float64), match)

    def _estimate_text(self, written: str) -> Estimate:
        ids, pending = self.split(written)
        # Where the cursor is, mid-word or after white space: the prompt's own end, or the healed word
        # typed there (the model writes it again; the user's text, not a generation's, ends there).
        if pending and written in ("", self.typed):
            walked = self._walk(ids, pending)
            if walked is not None:
                return walked
        piece = self._encode(pending) if pending else []
        match = self.matcher.sync(ids + piece)
        counts = match.counts
        whole = (counts.ids, counts.counts.astype(np.float64))  # the text as the tokenizer cuts it
        if not pending:
            return self._estimate(*whole, match)
        if match.length <= len(piece):  # found only inside the last piece: no context behind it
            whole = (whole[0][:0], whole[1][:0])
        before = self.matcher.sync(ids)  # the state before the last piece: kept on the way, no search
        merged, kept = self._merges(before.counts, pending)
        if not len(merged[0]) or not kept:
            if not len(merged[0]):
                if not len(whole[0]):  # nothing agrees with the piece here: shorter contexts
                    return self._walk(ids, pending) or self._estimate(*whole, match)
                return self._estimate(*whole, match)
            return self._estimate(*merged, before)
        # What followed the context before the piece: some occurrences wrote it whole and went on
        # (``kept`` of them: the whole-text estimate stands for those), others wrote a longer token
        # that begins with it (its remainder is the model's next token).
        total_kept = float(kept)
        if not len(whole[0]) or not whole[1].sum():
            return self._estimate(*merged, before)
        ids_all = np.concatenate([whole[0], merged[0]])
        weights = np.concatenate([whole[1] / whole[1].sum() * total_kept, merged[1]])
        source = match if total_kept >= merged[1].sum() else before
        return self._estimate(ids_all, weights, source)

    def _walk(self, ids: list[int], pending: str, depth: int = 0,
              walked: dict[tuple[int, ...], Estimate | None] | None = None) -> Estimate | None:
        """The slow way, where the last piece was never seen after the longest context: back off to
        shorter contexts until what followed agrees with the pending text, following an id that
        the pending text runs past one level on (a typed word's first characters, several pieces
        of white space). ``walked``: the answers one level on so far in this walk, by the ids
        followed (each shorter context tried here most often follows the same id again)."""
        walked = {} if walked is None else walked
        match = self.matcher.sync(ids)
        length, tries = match.length, 0
        while True:
            found = self._agrees(ids, match, pending, depth, walked)
            if found is not None or length <= 1 or tries >= BACKOFF_TRIES:
                return found
            length = length // 2 if length > 8 else length - 1
            tries += 1
            match = self.matcher.backoff(ids, length)

    def _agrees(self, ids: list[int], match: Match, pending: str, depth: int,
                walked: dict[tuple[int, ...], Estimate | None]) -> Estimate | None:
        if not pending:
            counts = match.counts
            return self._estimate(counts.ids, counts.counts.astype(np.float64), match) if len(counts.ids) else None
        (merged_ids, merged_counts), _ = self._merges(match.counts, pending)
        strings = self.vocab.strings
        deeper: tuple[int, int] | None = None  # (count, id): the likeliest id the pending text runs past
        ids_, numbers = self._beginning_with(match.counts.ids, match.counts.counts, pending[0])
        for token, count in zip(ids_.tolist(), numbers.tolist()):
            piece = strings[token]
            if len(piece) <= len(pending) and pending.startswith(piece) and (deeper is None or count > deeper[0]):
                deeper = (count, token)
        sub = None
        if deeper is not None and depth < MAX_DEPTH:
            on = ids + [deeper[1]]
            key = tuple(on[len(on) - depth - 1:])  # the ids this walk followed (it began at ``ids[:-depth]``)
            if key not in walked:
                walked[key] = self._walk(on, pending[len(strings[deeper[1]]):], depth + 1, walked)
            sub = walked[key]
        if sub is None:
            return self._estimate(merged_ids, merged_counts, match) if len(merged_ids) else None
        assert deeper is not None
        ids_all = np.concatenate([merged_ids, sub.ids])
        weights = np.concatenate([merged_counts, sub.probs * deeper[0]])
        return self._estimate(ids_all, weights, sub.match if deeper[0] >= merged_counts.sum() else match)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)  # type: ignore[attr-defined]

    @staticmethod
    def _estimate(ids: np.ndarray, weights: np.ndarray, match: Match) -> Estimate:
        total = weights.sum()
        if not len(ids) or total <= 0:
            return Estimate(np.zeros(0, dtype=np.int64), np.zeros(0), match)
        if len(ids) == 1 or bool((ids[1:] > ids[:-1]).all()):  # distinct and in order already (most often:
            return Estimate(ids, weights / total, match)  # a match's own counts): nothing to merge
        keys, where = np.unique(ids, return_inverse=True)
        summed = np.zeros(len(keys))
        np.add.at(summed, where, weights)
        return Estimate(keys, summed / summed.sum(), match)

    def _merges(self, counts: object, pending: str) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        """Of what followed the context before the last piece (``pending``): the ids that run past
        it, as the model's next token (their remainder's first token) with their counts; and how
        many occurrences wrote it in pieces of its own (an id that it begins with)."""
        ids, numbers = self._beginning_with(counts.ids, counts.counts, pending[0])  # type: ignore[attr-defined]
        strings = self.vocab.strings
        out_ids: list[int] = []
        out_counts: list[float] = []
        kept = 0
        for token, count in zip(ids.tolist(), numbers.tolist()):
            piece = strings[token]
            if len(piece) > len(pending) and piece.startswith(pending):
                after = self.vocab.first_token(piece[len(pending):])
                if after >= 0:
                    out_ids.append(after)
                    out_counts.append(count)
            elif pending.startswith(piece):
                kept += count
        return (np.asarray(out_ids, dtype=np.int64), np.asarray(out_counts, dtype=np.float64)), kept

    def _beginning_with(self, ids: np.ndarray, numbers: np.ndarray, char: str) -> tuple[np.ndarray, np.ndarray]:
        """The next ids (and their counts) whose text begins with ``char``: a short match can have
        thousands of next ids, of which the pending text's first character leaves a few to read."""
        first = self.vocab.first_char
        inside = ids < len(first)
        ids, numbers = ids[inside], numbers[inside]
        agree = first[ids] == ord(char)
        return ids[agree], numbers[agree]

    def continuation(self, written: str, max_tokens: int, min_length: int = 1, min_share: float = 0.0,
                     stop: str = "") -> list[int]:
        """The memory's greedy continuation in the model's tokens after ``written``: the most
        likely next token, again and again, while the match is at least ``min_length`` ids long and
        that token at least ``min_share`` likely; ends after a token holding ``stop``."""
        out: list[int] = []
        text = written
        strings = self.vocab.strings
        while len(out) < max_tokens:
            estimate = self.estimate(text)
            token, share = estimate.top()
            if token < 0 or estimate.match.length < min_length or share < min_share:
                break
            out.append(token)
            text += strings[token]
            if stop and stop in strings[token]:
                break
        return out
