"""The repair prompt keeps every span valid: an empty span where the hint block goes moves with it.

Found by the server's fuzzer (``tests/test_server_fuzz.py``): a document of line-break-like
characters gave the prompt an empty span at the cursor line's start, and the repair round raised
``ValueError: bad span [236, 104)``, answered as an internal error.
"""

from __future__ import annotations

from glm5_lsp.repair.repair_prompt import _shift
from glm5_lsp.spans import Span


def test_an_empty_span_at_the_insertion_point_moves_whole() -> None:
    assert _shift(Span(6, 6, "current_block"), 6, 10) == Span(16, 16, "current_block")
    assert _shift(Span(2, 6, "code"), 6, 10) == Span(2, 6, "code")  # ends there: stays before the block
    assert _shift(Span(2, 8, "code"), 6, 10) == Span(2, 18, "code")  # spans it: grows
    assert _shift(Span(7, 9, "code"), 6, 10) == Span(17, 19, "code")
