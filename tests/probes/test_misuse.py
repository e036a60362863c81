"""``probe.step()`` after ``scaler.unscale_()`` or after clipping: warned once, step not logged.

Both orders silently gave wrong samples (|G_big|^2 un-scaled twice, or clipped). The probe must
warn once with the fix, drop those steps, and log the steps in the right order as before.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from noisescope.torch import GradientNoiseProbe
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.lsq_torch import ListSink, Sampler, lsq_model, mean_loss

STEPS = 6
MISUSED = {1, 2, 4}  # the steps whose probe.step() comes too late


def _problem() -> tuple[LeastSquares, np.ndarray]:
    p = LeastSquares.make(d=8, sigma=0.5, seed=0)
    return p, p.w_star + 0.6 * np.random.default_rng(1).normal(size=p.d)


def _run(source: str, late: str | None, k: int) -> tuple[ListSink, GradientNoiseProbe, list[str]]:
    """STEPS steps; on MISUSED steps, ``late`` ("clip" or "unscale") comes before step()."""
    p, w = _problem()
    model, sink, sample = lsq_model(p, w), ListSink(), Sampler(p, seed=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = GradientNoiseProbe(model, sink, source=source, scaler=scaler)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            for j in range(k):
                # torch's Tensor.backward has no annotations: an "untyped call" to mypy
                scaler.scale(mean_loss(model, sample(16)) / k).backward()
                if j < k - 1:
                    probe.micro_step(batch_size=16)
            misused = late is not None and step in MISUSED
            if misused and late == "unscale":
                scaler.unscale_(opt)
            if misused and late == "clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            probe.step(batch_size=16)
            if not misused:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return sink, probe, [str(w.message) for w in caught if "noisescope" in str(w.message)]


@pytest.mark.parametrize(("source", "k"), [("per_example", 1), ("micro", 2)])
@pytest.mark.parametrize("late", ["clip", "unscale"])
def test_late_step_is_warned_once_and_not_logged(source: str, k: int, late: str) -> None:
    clean, _, clean_warnings = _run(source, None, k)
    assert clean_warnings == []
    assert [r["step"] for r in clean.rows] == list(range(STEPS))
    sink, probe, messages = _run(source, late, k)
    assert len(messages) == 1, messages  # once, however many steps
    assert ("unscale_()" if late == "unscale" else "clipping") in messages[0]
    assert "Call probe.step() right after the last backward" in messages[0]
    assert probe.misused_steps == len(MISUSED)
    # the steps in the right order are logged exactly as without the misuse
    good = [r for r in clean.rows if r["step"] not in MISUSED]
    assert [{**r, "examples": None} for r in sink.rows] == [{**r, "examples": None} for r in good]
