"""Numbers as people write them, for every sentence noisescope prints or shows.

"1,860 examples", "2.1M tokens", "0.35x", never "1.86e+03": one formatter, so a page, the
API's verdicts and warnings and the client's messages read alike.
"""

from __future__ import annotations

import math

__all__ = ["count", "ratio"]


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


def ratio(value: float) -> str:
    """A ratio such as B / B_simple: 0.3, 1.2, 75, 1,200."""
    if not math.isfinite(value):
        return "∞"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2g}" if abs(value) >= 1 else f"{value:.1g}"
