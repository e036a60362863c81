"""Student's t quantiles (pure Python) and Fieller's interval for a ratio of jointly normal
estimates: the two pieces every interval here is built from (B_simple's over blocks of steps,
B_crit's from a sweep fit, the local critical batch's over seeds)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularised incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _student_t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def check_level(level: float) -> None:
    """Refuse a confidence ``level`` outside (0, 1) (nan included): every interval's rule."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def check_positive(name: str, value: float) -> None:
    """Refuse a ``value`` that is not a finite number > 0 (nan included): the rule for every
    size, rate and loss that a formula divides by or takes the logarithm of."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    """Refuse a ``value`` that is not a finite number >= 0 (nan included): a noise scale or a
    reference batch, where 0 has a meaning."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@functools.lru_cache(maxsize=1024)  # pure; the server calls it once per bucket (2000/query)
def student_t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (pure Python, ~1e-10 accurate)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _student_t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def fieller(
    num: float, den: float, var_num: float, var_den: float, cov: float, level: float, df: float
) -> tuple[float | None, float | None]:
    """Fieller's ``level`` interval for num/den (jointly normal, t on ``df`` d.o.f.).

    (None, None) when it is unbounded: the denominator is not significantly non-zero. The
    lower end is clipped at 0 (the quantities here are non-negative, so no coverage is lost).
    """
    t = student_t_quantile(0.5 + level / 2.0, df)
    a = den * den - t * t * var_den
    if a <= 0.0:
        return None, None
    half_b = num * den - t * t * cov
    c = num * num - t * t * var_num
    disc = max(half_b * half_b - a * c, 0.0)
    ratio = num / den
    lo = (half_b - math.sqrt(disc)) / a
    hi = (half_b + math.sqrt(disc)) / a
    return max(0.0, min(lo, ratio)), max(hi, ratio)


def fieller_lower_bound(
    num: float, den: float, var_num: float, var_den: float, cov: float, level: float, df: float
) -> float | None:
    """The lower end of Fieller's ``level`` set for num/den >= 0 when that set is unbounded
    above (the denominator not significantly positive) but excludes 0 (the numerator
    significantly positive): the set cut to [0, inf) is then [bound, inf). None otherwise.

    The set is {r : a r^2 - 2 b r + c <= 0} with a = den^2 - t^2 var_den,
    b = num den - t^2 cov, c = num^2 - t^2 var_num; a <= 0 makes it unbounded, c > 0 keeps 0 out.
    """
    t = student_t_quantile(0.5 + level / 2.0, df)
    a = den * den - t * t * var_den
    half_b = num * den - t * t * cov
    c = num * num - t * t * var_num
    if c <= 0.0 or num <= 0.0 or a > 0.0:
        return None
    if a == 0.0:
        return c / (2.0 * half_b) if half_b > 0.0 else None
    # a < 0 < c: one negative and one positive root, and the set is [positive root, inf)
    return (half_b - math.sqrt(half_b * half_b - a * c)) / a


@dataclass(frozen=True)
class LineFit:
    """y = intercept + slope x by weighted least squares, with what intervals need: the
    weighted residual variance ``s2`` (n - 2 degrees of freedom), the weights' sum, their mean
    x and the weighted sum of squares about it."""

    intercept: float
    slope: float
    s2: float
    w_sum: float
    x_mean: float
    sxx: float

    @property
    def var_slope(self) -> float:
        return self.s2 / self.sxx

    @property
    def var_intercept(self) -> float:
        return self.var_mean(0.0)

    def var_mean(self, x: float) -> float:
        """Variance of the fitted line's value at ``x``: s2 (1/w_sum + (x - x_mean)^2 / sxx)."""
        return self.s2 * (1.0 / self.w_sum + (x - self.x_mean) ** 2 / self.sxx)

    @property
    def cov(self) -> float:
        """Covariance of (intercept, slope)."""
        return -self.x_mean * self.s2 / self.sxx


def weighted_line_fit(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> LineFit:
    """The weighted least-squares line through (x, y) with weights w (>= 3 points, 2 distinct
    x): the one fit behind B_crit from a sweep (S against 1/B) and the law B_crit(L) (log
    B_crit against log L)."""
    w_sum = sum(ws)
    x_mean = sum(w * x for w, x in zip(ws, xs, strict=True)) / w_sum
    y_mean = sum(w * y for w, y in zip(ws, ys, strict=True)) / w_sum
    sxx = sum(w * (x - x_mean) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * (x - x_mean) * (y - y_mean) for w, x, y in zip(ws, xs, ys, strict=True))
    slope = sxy / sxx
    intercept = y_mean - slope * x_mean
    resid = [y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)]
    s2 = sum(w * r * r for w, r in zip(ws, resid, strict=True)) / (len(xs) - 2)
    return LineFit(intercept, slope, s2, w_sum, x_mean, sxx)
