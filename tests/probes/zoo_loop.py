"""The training loop the zoo tests run the probe in (weights fixed), and the rows it must log.

Shared by test_zoo.py (the first zoo), test_zoo_layouts.py (the layouts of issue 54) and
test_zoo_mutation.py (a parameter also used outside its module)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from harness.zoo import Truth, ZooCase
from harness.zoo.layout_cases import micro_grads
from noisescope.torch import GradientNoiseProbe
from tests.probes.lsq_torch import ListSink

# what the probe says when it picks its source (GradientNoiseProbe._announce)
ANNOUNCEMENT = "measuring with source="


@dataclass
class NoticeSink(ListSink):
    """A ``ListSink`` that also keeps the run's notices (``log_event``): what the probe says
    on the run's page, once per reason."""

    notices: list[str] = field(default_factory=list)

    def log_event(self, step: int, kind: str, payload: dict[str, Any]) -> None:
        self.notices.append(str(payload.get("message", payload)))

    def announcements(self) -> list[str]:
        return [n for n in self.notices if n.startswith(ANNOUNCEMENT)]


def backward_step(case: ZooCase, idx: torch.Tensor, k: int, probe: GradientNoiseProbe) -> None:
    """One step's backwards: k micro-batches, each loss the mean over its items divided by k
    (examples), or the sum over its real tokens divided by the step's (tokens, "sum/N")."""
    step_items = case.items(idx)
    for m in idx.chunk(k):
        if case.units == "tokens":
            loss = case.batch_loss(m, divisor=step_items)
        else:
            loss = case.batch_loss(m) / k
        loss.backward()
        probe.micro_step(batch_size=case.items(m), item_counts=case.item_counts(m))


def make_probe(
    case: ZooCase, k: int, source: str | None = None, sink: ListSink | None = None
) -> GradientNoiseProbe:
    """The default probe; tokens: units="tokens", and with micro-batches the HF reduction."""
    kwargs: dict[str, str] = {} if source is None else {"source": source}
    if case.units == "tokens":
        kwargs["units"] = "tokens"
        if k > 1:
            kwargs["micro_loss"] = "sum/N"
    return GradientNoiseProbe(case.model, sink or ListSink(), **kwargs)  # type: ignore[arg-type]


def run_steps(
    case: ZooCase, probe: GradientNoiseProbe, batches: list[torch.Tensor], k: int
) -> list[dict[str, Any]]:
    """The training loop, without optimizer steps (weights fixed, .grad set to None): the
    sink's whole-model rows. An exception from the probe fails the test here."""
    for idx in batches:
        backward_step(case, idx, k, probe)
        probe.step(loss=0.0)
        case.model.zero_grad(set_to_none=True)
    rows: list[dict[str, Any]] = probe.sink.series("")  # type: ignore[attr-defined]
    return rows


def expected_row(truth: Truth, idx: torch.Tensor, k: int, b_small: float) -> tuple[float, ...]:
    """The row the probe must log for this step: per-example (the auto probe's source until a
    step has several backwards) or micro-batch, told apart by B_small."""
    per_example = truth.per_example_row(idx.tolist())
    if k == 1 or b_small == pytest.approx(per_example[0]):
        return per_example
    return truth.micro_row([m.tolist() for m in idx.chunk(k)])


def row_of(row: dict[str, Any]) -> tuple[float, ...]:
    return row["b_small"], row["b_big"], row["g_small_sq"], row["g_big_sq"]


def worst_error(got: tuple[float, ...], want: tuple[float, ...]) -> float:
    """The largest relative difference between a logged row and its exact value."""
    g, w = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    return float(np.max(np.abs(g - w) / np.abs(w)))


def b_simple_spread(truth: Truth, steps: int, batch: int, k: int) -> tuple[float, float]:
    """(bias, sigma) of a window's B_simple relative to the truth, from 200 windows of
    ``steps`` steps of ``batch`` examples in ``k`` micro-batches drawn from K: the estimator's
    own finite-window bias (and, in tokens, its per-example source's model of token counts)
    and its sampling spread."""
    sims = truth.simulate(steps, batch, k, reps=200, seed=1) / truth.b_simple - 1.0
    assert not np.isnan(sims).any()
    return float(sims.mean()), float(sims.std())


def exact_rows(
    case: ZooCase, truth: Truth | None, batches: list[torch.Tensor], k: int
) -> list[tuple[float, ...] | None]:
    """Per step, what the probe must log, where the truth is per-example (``truth``: the row
    of the source B_small names, ``expected_row``) or, where examples mix (``truth`` None:
    BatchNorm), each micro-batch's own gradient at these weights (k > 1; nothing at k = 1,
    where no per-example gradient exists). Call before the probe is attached: the micro-batch
    gradients are taken by backward passes the probe would see."""
    if truth is not None or k == 1:  # from K, once B_small says which source logged it
        return [None] * len(batches)
    rows: list[tuple[float, ...] | None] = []
    for idx in batches:
        grads = torch.stack(micro_grads(case, list(idx.chunk(k))))
        b = float(len(idx) // k)
        g_small = float(grads.square().sum(1).mean())
        rows.append((b, float(len(idx)), g_small, float(grads.mean(0).square().sum())))
    return rows


def check_rows(
    rows: list[dict[str, Any]],
    batches: list[torch.Tensor],
    k: int,
    truth: Truth | None,
    direct: list[tuple[float, ...] | None],
    rtol: float,
) -> None:
    """Each logged row (found by its step) within ``rtol`` of its exact value."""
    for row in rows:
        step = row["step"]
        want = direct[step]
        if truth is not None:
            want = expected_row(truth, batches[step], k, row["b_small"])
        assert want is not None, f"step {step} logged {row_of(row)} where nothing can be exact"
        err = worst_error(row_of(row), want)
        assert err <= rtol, f"step {step}: logged {row_of(row)}, exact {want}: {err:.2e} off"
