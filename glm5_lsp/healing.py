"""Token healing: the end of the text before the cursor that the model writes again in its own tokens.

A prompt that ends where the tokenizer would not have cut it leaves the model a continuation it
rarely saw in training. Two places are common while typing:

- inside a word (``namespace, va|``): the word is split where the tokenizer never would, and a small
  model then rarely continues it (:func:`partial_word`);
- right after a space (``return |``, ``total = |``, ``f(a, |``): the tokenizer joins a space to the
  word after it (`` return``, `` =``, `` b``), so a prompt ending on a lone space token ends on one
  the model saw almost only before a line break or another space, and it writes junk
  (:func:`space_run`).

The pipeline cuts :func:`healed_text` off the prompt and forces the model to write it again (the
in-process runtime's forced prefix, which lets a token run past it); the gate reads the same text
for its features. Only a healed *word* is a word being typed (:func:`healed_word`): the word
finisher and the word check leave a healed space alone.
"""

from __future__ import annotations

from glm5_lsp.postprocess import trailing_identifier

MAX_HEALED_CHARS = 32


def healed_text(before: str, after: str) -> str:
    """What token healing cuts off the prompt at the cursor: the word the cursor ends, else the
    run before a space the cursor follows, else ""."""
    return partial_word(before, after) or space_run(before)


def healed_word(healed: str) -> str:
    """``healed`` when it is a word being typed (:func:`partial_word`'s), "" when it is a space run."""
    return healed if healed and not healed.endswith(" ") else ""


def partial_word(before: str, after: str) -> str:
    """The identifier the cursor ends (``va`` in ``f(a, va|)``), or "" when there is none to heal.

    Not when the word goes on after the cursor (``va|lue``: the model would have to write around
    it), nor for a long one (nothing to gain), nor after a digit (``1e|``).
    """
    if after[:1].isalnum() or after[:1] == "_":
        return ""
    word = trailing_identifier(before[-(MAX_HEALED_CHARS + 1):])
    if not word or len(word) > MAX_HEALED_CHARS:
        return ""
    start = len(before) - len(word)
    if start > 0 and (before[start - 1].isalnum() or before[start - 1] == "_"):
        return ""  # the word began further back than the window (or after a digit)
    return word


def space_run(before: str) -> str:
    """The space the cursor follows with the token before it, where the tokenizer would join them
    otherwise: `` return `` in ``    return |``, `` = `` in ``total = |``, ``, `` in ``f(a, |``; "" when
    the cursor does not follow one space after code on its line (indentation, two spaces), or the
    run is long.

    The run is the byte-level tokenizer's last piece before the space (:func:`_piece_starts`): BPE
    merges tokens only inside a piece, so a cut at a piece's start is a cut the tokenizer makes.
    """
    if not before.endswith(" ") or before.endswith("  "):
        return ""
    line = before[before.rfind("\n") + 1:-1]
    if not line.strip():
        return ""
    starts = _piece_starts(line, _scan_from(line))
    healed = line[starts[-1]:] + " "
    return healed if len(healed) <= MAX_HEALED_CHARS + 1 else ""


_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def _kind(char: str) -> int:
    """The pre-tokenizer's classes: 0 a letter, 1 a number, 2 any other character but whitespace."""
    return 0 if char.isalpha() else 1 if char.isnumeric() else 2


def _piece_starts(text: str, start: int = 0) -> list[int]:
    """Where the byte-level pre-tokenizer's pieces begin in ``text`` (GPT-2's pattern: a contraction,
    an optional space and a run of letters, of numbers or of other characters, or whitespace,
    the last space of which goes with what follows), read from ``start``, itself a piece's start."""
    starts, i, n = [], start, len(text)
    while i < n:
        starts.append(i)
        char = text[i]
        if char == "'" and (contraction := next((c for c in _CONTRACTIONS if text.startswith(c, i)), None)):
            i += len(contraction)
        elif not char.isspace() or (char == " " and i + 1 < n and not text[i + 1].isspace()):
            j = i + 1 if char == " " else i
            kind = _kind(text[j])
            j += 1
            while j < n and not text[j].isspace() and _kind(text[j]) == kind:
                j += 1
            i = j
        else:  # whitespace: all of it, less its last character where something follows
            j = i
            while j < n and text[j].isspace():
                j += 1
            i = j - 1 if j < n and j - i > 1 else j
    return starts


def _scan_from(line: str, window: int = 256) -> int:
    """A piece's start near the end of a long line (a space after something else always is one),
    so that reading the pieces costs the window, not the line."""
    if len(line) <= window:
        return 0
    at = line.find(" ", len(line) - window)
    while at > 0 and line[at - 1].isspace():
        at = line.find(" ", at + 1)
    return max(0, at)
