"""Token healing's word: the identifier the cursor ends, which the model writes again in its own tokens.

A prompt ending inside a word splits it where the tokenizer never would, and the model then rarely
continues it: the pipeline cuts :func:`partial_word` off the prompt and forces the model to write it
again (the in-process runtime's forced prefix); the gate reads the same word for its features.
"""

from __future__ import annotations

from glm5_lsp.postprocess import trailing_identifier

MAX_HEALED_CHARS = 32


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
