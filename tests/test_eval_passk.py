"""The unbiased pass@k estimator against the closed form and edge cases."""

from __future__ import annotations

from math import comb

import pytest

from glm5_lsp.evaluate.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k", [(1, 0, 1), (1, 1, 1), (10, 3, 1), (10, 3, 5), (20, 1, 10), (200, 17, 100), (5, 5, 5)])
def test_matches_the_closed_form(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_1_is_the_pass_rate_and_averages_over_problems() -> None:
    assert pass_at_k(10, 4, 1) == pytest.approx(0.4)
    assert mean_pass_at_k([(1, 1), (1, 0), (1, 0), (1, 1)], 1) == 0.5


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(2, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
