"""Numbers as people write them: ``noisescope._format``, which every sentence uses."""

from __future__ import annotations

import math

import pytest

from noisescope import _format


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.642, "0.64"),
        (0.3, "0.3"),
        (0.0642, "0.064"),
        (1.2, "1.2"),
        (2.0, "2"),
        (75.4, "75"),
        (99.7, "100"),
        (1234.0, "1,200"),
        (1.23e-5, "0.000012"),
        (0.0, "0"),
        (math.inf, "∞"),
    ],
)
def test_ratios_read_with_two_significant_digits_and_no_exponent(value: float, text: str) -> None:
    assert _format.ratio(value) == text


@pytest.mark.parametrize(
    ("lo", "hi", "head", "texts"),
    [
        (0.62, 0.66, 0.64, ("0.62", "0.66")),  # two digits suffice
        (0.6368, 0.6432, 0.64, ("0.637", "0.643")),  # the ends would both read 0.64
        (0.6402, 0.71, 0.642, ("0.6402", "0.71")),  # the lower end would read as the head
        (0.64, 0.64, 0.64, ("0.64", "0.64")),  # equal values may read alike
        (0.5, math.inf, 0.64, ("0.5", "∞")),
    ],
)
def test_an_interval_s_ends_read_apart_from_each_other_and_from_the_head(
    lo: float, hi: float, head: float, texts: tuple[str, str]
) -> None:
    assert _format.ratio_interval(lo, hi, head=head) == texts


@pytest.mark.parametrize(
    ("value", "text"), [(97.8, "98"), (6.1, "6"), (1234.6, "1,235"), (2.4e6, "2.4M"), (0.4, "0.4")]
)
def test_whole_counts(value: float, text: str) -> None:
    assert _format.whole(value) == text
