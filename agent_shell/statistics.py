"""Rates and paired comparisons of binary outcomes: the 95% Wilson score interval and the exact sign test.

Used by the success tables (:mod:`agent_shell.reporting`), the study tables, the calibrator's and the
decision evaluation's accuracies. Pure Python: imports nothing of the project.
"""

from __future__ import annotations

import math

#: z for a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) of a binomial rate k/n; (0, 1) for n = 0.

    Stays inside [0, 1] and is sensible for small counts (0 of 5 gives [0, 0.43], not [0, 0]).

    Raises ValueError unless 0 <= k <= n.
    """
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return min(low, p), max(high, p)  # rounding must not move an end past the rate (0/n, n/n)


def sign_test(k: int, n: int) -> float:
    """Exact two-sided sign test: P(X <= min(k, n - k)) + P(X >= max(k, n - k)) for X ~
    Binomial(n, 1/2), capped at 1 (1.0 for n = 0). Raises ValueError unless 0 <= k <= n."""
    if not 0 <= k <= n:
        raise ValueError(f"sign_test needs 0 <= k <= n, got k={k}, n={n}")
    low = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


__all__ = ["Z95", "sign_test", "wilson_interval"]
