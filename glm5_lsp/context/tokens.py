"""Token counting for budgets.

At run time the pipeline passes the model tokenizer's ``lambda s: len(tok.encode(s))``. Without
one, :func:`approx_tokens` estimates one token per three characters, rounded up: code tokenizers
average 3-4 characters per token, so the estimate errs on the side of staying inside the budget.
:class:`TokenCounter` memoises counts of repeated pieces (summary entries, doc chunks), which are
the same from one keystroke to the next.
"""

from __future__ import annotations

from collections.abc import Callable

CountTokens = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """The cheap default: ``ceil(len(text) / 3)``."""
    return (len(text) + 2) // 3


class TokenCounter:
    """Wraps a counting function with a bounded memo for pieces that repeat between requests."""

    def __init__(self, count: CountTokens | None = None, memo_size: int = 20_000) -> None:
        self.count_fn: CountTokens = count or approx_tokens
        self._memo: dict[str, int] = {}
        self._memo_size = memo_size

    def __call__(self, text: str) -> int:
        """Count without memoising (for text that changes every keystroke)."""
        return self.count_fn(text)

    def cached(self, text: str) -> int:
        """Count with memoisation (for stable pieces)."""
        n = self._memo.get(text)
        if n is None:
            if len(self._memo) >= self._memo_size:
                self._memo.clear()
            n = self._memo[text] = self.count_fn(text)
        return n
