"""Numbers as people write them, for every sentence noisescope prints or shows.

"1,860 examples", "2.1M tokens", "0.35x", never "1.86e+03": one formatter, so a page, the
API's verdicts and warnings and the client's messages read alike.
"""

from __future__ import annotations

import math

__all__ = ["count", "plural", "ratio", "ratio_beside", "ratio_interval", "whole"]


def count(value: float) -> str:
    """A batch size, step or example count: 12, 18.5, 1,860, 250,000, 2.1M, 3.4B."""
    if not math.isfinite(value):
        return "∞" if value > 0 else ("−∞" if value < 0 else "–")
    size = abs(value)
    if size >= 1e9:
        return f"{value / 1e9:.3g}B"
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 1:
        return f"{value:.3g}"
    if size == 0:
        return "0"
    return f"{value:.2g}"


def whole(value: float) -> str:
    """A count read as a whole number, such as devices or a batch: 6, 98, 1,235, 2.1M (below
    one, as ``count``: 0.4 is not "0")."""
    return count(round(value)) if math.isfinite(value) and abs(value) >= 1 else count(value)


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, trailing zeros dropped, never an exponent."""
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits}g}")
    if abs(rounded) >= 100:
        return f"{rounded:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def ratio(value: float, digits: int = 2) -> str:
    """A ratio such as B / B_simple, to two significant digits: 0.064, 0.64, 1.2, 75, 1,200."""
    if not math.isfinite(value):
        return "∞"
    return _significant(value, digits)


def ratio_beside(value: float, limit: float) -> str:
    """``value`` as a ratio with the fewest significant digits (2 to 6) that keep its reading on
    its side of ``limit``: 1.494 against a 1.5 limit reads "1.49", never "1.5"."""
    for digits in range(2, 7):
        text = ratio(value, digits)
        if not math.isfinite(value) or (float(text.replace(",", "")) >= limit) == (value >= limit):
            break
    return text


def ratio_interval(lo: float, hi: float, head: float | None = None) -> tuple[str, str]:
    """An interval's two ends as ratios, with the fewest significant digits (2 to 4) that keep
    ends of different values apart from each other and from ``ratio(head)``: a tight interval
    around 0.64 reads "0.638 to 0.645", never "0.64 to 0.64"."""
    head_text = None if head is None else ratio(head)
    for digits in (2, 3, 4):
        lo_text, hi_text = ratio(lo, digits), ratio(hi, digits)
        if (lo_text != hi_text or lo == hi) and all(
            text != head_text or end == head for text, end in ((lo_text, lo), (hi_text, hi))
        ):
            break
    return lo_text, hi_text


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, plural unless 1, with thousands separators (exact: counts to check):
    "1 run", "4,000 samples"."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
