"""One rule, one wording, for every number a formula divides by or takes the logarithm of:
``check_positive`` (a finite number > 0) and ``check_non_negative`` (a finite number >= 0) refuse
nan and inf as well, wherever the number enters: the estimators, the forecast, the branch plan
and the recommendation."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from noisescope import branch
from noisescope.estimators import (
    adaptive_batch_target,
    check_non_negative,
    check_positive,
    fit_critical_batch,
    local_critical_batch,
    noise_scaled_lr,
    statistical_efficiency,
)
from noisescope.forecast import fit_critical_batch_law, forecast_report
from noisescope.recommend import parallelism_plan, recommend

NOT_POSITIVE = [math.nan, math.inf, -math.inf, 0.0, -1.0]
NEGATIVE_OR_NOT_FINITE = [math.nan, math.inf, -math.inf, -1e-300, -1.0]

POSITIVE_INPUTS: dict[str, tuple[str, Callable[[float], object]]] = {
    "fit batch size": ("batch size", lambda v: fit_critical_batch([v, 32, 64], [30, 20, 15])),
    "fit steps": ("steps", lambda v: fit_critical_batch([16, 32, 64], [30, v, 15])),
    "branch batch size": (
        "batch size",
        lambda v: local_critical_batch([16, v], [[1.0, 1.1], [1.2, 1.3]]),
    ),
    "adaptive reference": ("reference_batch", lambda v: adaptive_batch_target(100.0, v)),
    "law loss": ("loss", lambda v: fit_critical_batch_law([v, 2.0, 1.0], [64, 128, 256])),
    "law b_crit": (
        "critical batch size",
        lambda v: fit_critical_batch_law([3.0, 2.0, 1.0], [64, v, 256]),
    ),
    "forecast loss": ("loss", lambda v: forecast_report(None, losses=[1.0, v])),
    "plan lr": ("lr", lambda v: branch.plan(10, 8, v)),
    "recommend batch": ("batch_size", lambda v: recommend(100.0, v)),
    "recommend candidate": ("candidates", lambda v: recommend(100.0, 64, candidates=[32, v])),
    "parallelism b_crit": ("b_crit", lambda v: parallelism_plan(v, 8)),
}

NON_NEGATIVE_INPUTS: dict[str, tuple[str, Callable[[float], object]]] = {
    "efficiency noise": ("noise_scale", lambda v: statistical_efficiency(64, v)),
    "adaptive noise": ("noise_scale", lambda v: adaptive_batch_target(v, 64)),
    "lr noise": ("noise_scale", lambda v: noise_scaled_lr(0.1, 64, v)),
    "recommend reference": (
        "reference_batch",
        lambda v: recommend(100.0, 64, reference_batch=v),
    ),
}


CASES = [
    *(
        (where, "a finite positive number", value)
        for where in POSITIVE_INPUTS
        for value in NOT_POSITIVE
    ),
    *(
        (where, "a finite number >= 0", value)
        for where in NON_NEGATIVE_INPUTS
        for value in NEGATIVE_OR_NOT_FINITE
    ),
]


@pytest.mark.parametrize(("where", "rule", "value"), CASES, ids=lambda v: str(v))
def test_every_input_refuses_what_its_rule_does_not_admit(
    where: str, rule: str, value: float
) -> None:
    name, call = (POSITIVE_INPUTS | NON_NEGATIVE_INPUTS)[where]
    with pytest.raises(ValueError, match=f"^{name} must be {rule}, got "):
        call(value)


def test_the_rules_accept_their_edges_and_name_the_value() -> None:
    check_positive("x", 5e-324)  # the smallest positive float
    check_positive("x", 1.7976931348623157e308)
    check_non_negative("x", 0.0)
    check_non_negative("x", -0.0)
    with pytest.raises(ValueError, match=r"^x must be a finite positive number, got nan$"):
        check_positive("x", math.nan)
    with pytest.raises(ValueError, match=r"^x must be a finite number >= 0, got -inf$"):
        check_non_negative("x", -math.inf)
