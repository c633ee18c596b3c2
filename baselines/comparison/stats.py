"""Statistics of a comparison across seeds: Student-t intervals and the paired t-test.

    >>> round(t_quantile(0.975, df=2), 3)
    4.303
    >>> m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    >>> round(m, 3), round(hi - m, 3)
    (2.0, 2.484)

Pure Python (scipy is not a dependency). The t distribution's CDF comes from the regularised
incomplete beta function, I_x(a, b), evaluated by its continued fraction (modified Lentz), and
the quantile by bisection on that CDF; both are exact to ~1e-10, far below seed noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean, stdev


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_beta: x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    # the fraction converges fast only below the mean a / (a + b); use the symmetry above it
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T ≤ t) = p (bisection; the CDF is monotone)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t interval of the mean of independent values.
    With fewer than two values the interval is undefined: (mean, nan, nan)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_ci: no values")
    m = mean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    half = t_quantile(0.5 + level / 2.0, len(xs) - 1) * stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


@dataclass(frozen=True)
class PairedTest:
    """Paired t-test of b − a over matched pairs (here: runs with the same seed)."""

    n: int
    mean_diff: float
    ci_low: float
    ci_high: float
    t: float
    p_value: float  # two-sided


def paired_t_test(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> PairedTest:
    """Paired t-test of H0: E[b − a] = 0, with the `level` interval of the mean difference.

    Identical differences (zero spread) give t = ±inf and p = 0 when they are non-zero, t = 0 and
    p = 1 when they are all zero; fewer than two pairs give nan.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_t_test: need the same number of values, got {len(a)} and {len(b)}")
    diffs = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    if n < 2:
        d = diffs[0] if diffs else math.nan
        return PairedTest(n, d, math.nan, math.nan, math.nan, math.nan)
    m, lo, hi = mean_ci(diffs, level)
    sd = stdev(diffs)
    if sd == 0.0:
        if m == 0.0:
            return PairedTest(n, 0.0, 0.0, 0.0, 0.0, 1.0)
        return PairedTest(n, m, m, m, math.copysign(math.inf, m), 0.0)
    t = m / (sd / math.sqrt(n))
    df = n - 1
    p = regularized_beta(df / 2.0, 0.5, df / (df + t * t))  # P(|T| > |t|), without 1 − (1 − p) round-off
    return PairedTest(n, m, lo, hi, t, min(1.0, p))


__all__ = ["PairedTest", "mean_ci", "paired_t_test", "regularized_beta", "t_cdf", "t_quantile"]
