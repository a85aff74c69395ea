"""Student's t quantile without scipy (the rig's intervals need only this): the regularized
incomplete beta function by its continued fraction, inverted by bisection."""

from __future__ import annotations

import math
from functools import lru_cache


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny, c, d = 1e-300, 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-12:
            break
    return math.exp(log_front) * fraction / a


@lru_cache(maxsize=4096)
def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile (probability > 0.5), by bisection on its distribution function."""
    tail = 1 - probability  # P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2
    low, high = 0.0, 1.0
    while _betainc(df / 2, 0.5, df / (df + high * high)) / 2 > tail:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        if _betainc(df / 2, 0.5, df / (df + middle * middle)) / 2 > tail:
            low = middle
        else:
            high = middle
    return (low + high) / 2
