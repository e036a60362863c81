"""A probe that fails or cannot measure: training goes on unchanged, and the run's page (and
the server) says why, once."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import noisescope
from harness import AppServer
from noisescope.torch import GradientNoiseProbe, _rows
from tests.probes.lsq_torch import ListSink
from tests.probes.small_loop import data, loss_of, mlp


@pytest.mark.parametrize("source", ["micro", "per_example"])
def test_an_error_inside_the_probe_stops_it_and_training_goes_on_unchanged(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception raised in a gradient hook would abort the user's backward half-way (some
    .grad accumulated, some not). The probe keeps it out of the backward: the model trains
    exactly as without the probe, the probe warns once, says why and measures no more."""
    from noisescope.torch import _factors

    calls = [0]

    def failing_after(n: int, real: Any) -> Any:
        def failing(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] > n:
                raise RuntimeError("injected failure")
            return real(*args, **kwargs)

        return failing

    steps, b = 4, 4
    if source == "micro":  # on the CPU, 4 norms in each backward's hooks and 4 at step()
        k = 2
        real = _rows._norm_into
        per_step = 4 * (k + 1)
        monkeypatch.setattr(_rows, "_norm_into", lambda dtype: failing_after(per_step, real(dtype)))
    else:  # two Linear layers per backward
        monkeypatch.setattr(_factors, "lowrank_sq", failing_after(3, _factors.lowrank_sq))
        k = 1
    model, sink = mlp(), ListSink()
    twin = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source=source)  # type: ignore[arg-type]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    x, y = data(steps, k, b)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(steps):
            for m, opt in zip((model, twin), opts, strict=True):
                for j in range(k):
                    (loss_of(m, x[i, j], y[i, j]) / k).backward()
                    if m is model:
                        probe.micro_step(batch_size=b)
                if m is model:
                    results.append(probe.step())
                opt.step()
                opt.zero_grad()
    stopped = [w for w in caught if "stopped measuring after an error" in str(w.message)]
    assert len(stopped) == 1
    assert stopped[0].category is RuntimeWarning
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert probe.error == "RuntimeError: injected failure"
    assert results[0] is not None
    assert results[1:] == [None] * (steps - 1)
    assert [r["step"] for r in sink.series("")] == [0]
    assert probe.examples_seen == steps * k * b


@pytest.mark.parametrize(
    "grads_exist", [False, True], ids=["read after the first backward", "read at the step"]
)
def test_an_error_reading_the_gradients_is_kept_from_the_loop(
    grads_exist: bool, monkeypatch: pytest.MonkeyPatch, read_first_from_grad: None
) -> None:
    """Reading .grad fails in micro_step (a first backward with no .grad before it) or in
    step() (the accumulated gradient): the loop goes on, the probe stops and says why."""

    def broken(self: _rows.NormRows, row: int) -> None:
        raise RuntimeError("injected failure")

    model, sink = mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    monkeypatch.setattr(_rows.NormRows, "read_grad_into", broken)
    if grads_exist:  # then every backward goes through the hooks, .grad is read at the step
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    x, y = data(2, 2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            model.zero_grad(set_to_none=not grads_exist)
            for j in range(2):
                (loss_of(model, x[i, j], y[i, j]) / 2).backward()
                probe.micro_step(batch_size=4)
            assert probe.step() is None
    assert probe.error == "RuntimeError: injected failure"
    assert sum("stopped measuring" in str(w.message) for w in caught) == 1
    assert probe.examples_seen == 16
    assert sink.rows == []


class _EventSink(ListSink):
    """A sink that, like ``noisescope.Run``, also takes events."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, str, dict[str, Any]]] = []

    def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None:
        self.events.append((step, kind, dict(payload or {})))


def _single_backward_steps(probe: GradientNoiseProbe, model: nn.Module, steps: int) -> None:
    x, y = data(steps, 1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            loss_of(model, x[i, 0], y[i, 0]).backward()
            probe.micro_step(batch_size=4)
            probe.step()
            model.zero_grad()


def test_a_probe_that_cannot_measure_says_why_on_the_runs_page_once() -> None:
    model, sink = mlp(), _EventSink()
    _single_backward_steps(GradientNoiseProbe(model, sink, source="micro"), model, 3)
    assert sink.rows == []
    [(step, kind, payload)] = sink.events
    assert (step, kind) == (0, "notice")
    assert payload["message"].startswith("this step has one batch size only")
    assert "gradient accumulation" in payload["message"]  # what to do


def test_a_plain_sink_gets_no_notice_and_no_error() -> None:
    model = mlp()
    _single_backward_steps(GradientNoiseProbe(model, ListSink(), source="micro"), model, 2)


def test_a_probe_stopped_by_an_error_says_why_on_the_runs_page(
    monkeypatch: pytest.MonkeyPatch, read_first_from_grad: None
) -> None:
    def broken(self: _rows.NormRows, row: int) -> None:
        raise RuntimeError("injected failure")

    model, sink = mlp(), _EventSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    probe.step_count = 7
    monkeypatch.setattr(_rows.NormRows, "read_grad_into", broken)
    x, y = data(3, 2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            model.zero_grad(set_to_none=True)
            for j in range(2):
                (loss_of(model, x[i, j], y[i, j]) / 2).backward()
                probe.micro_step(batch_size=4)
            probe.step()
    [(step, kind, payload)] = sink.events
    assert (step, kind) == (7, "notice")
    assert "stopped measuring at step 7" in payload["message"]
    assert "RuntimeError: injected failure" in payload["message"]


def test_the_notice_reaches_the_server(app_server: AppServer) -> None:
    model = mlp()
    run = noisescope.init(
        app_server.url, project="p", task="t", quiet=True, transport=app_server.transport()
    )
    _single_backward_steps(GradientNoiseProbe(model, run, source="micro"), model, 3)
    run.finish()
    events = app_server.client().get(f"/api/v1/runs/{run.id}/events").json()
    assert [e["kind"] for e in events] == ["notice"]
    assert "one batch size only" in events[0]["payload"]["message"]
