"""The unbiased pass@k estimator (Chen et al., 2021): the chance that at least one of k samples,
drawn without replacement from n generated ones of which c pass, passes."""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n - c, k) / C(n, k)``, computed as a product so large n does not overflow."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems given ``(n, c)`` per problem."""
    if not counts:
        raise ValueError("no problems")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
