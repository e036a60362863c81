"""Deferred readout: ``step()`` launches the step's reductions and reads nothing to the host.

On an accelerator a host read of a device tensor (``.item()``, ``.tolist()``, ``float()``,
``.cpu()``...) waits for the device: a synchronisation in the training loop. Deferred mode
(the default off the CPU; selectable on it) reads a step's values at the next measured step,
from the probe's host buffer, long after the device has finished them. Counted here by
patching the tensor methods that read to the host, inside ``step()`` only. Deferred and
immediate modes must log identical samples (the last one at ``remove()``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import pytest
import torch
from torch import Tensor, nn

from noisescope.torch import GradientNoiseProbe
from tests.probes.lsq_torch import ListSink

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")
STEPS, K, B = 4, 3, 8


class _Reads:
    """Host reads made while ``active``: of the probe's host buffer, and of anything else."""

    def __init__(self) -> None:
        self.active = False
        self.host: Tensor | None = None
        self.buffer = 0
        self.other: list[str] = []


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    reads = _Reads()
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(
            self: Tensor, *args: Any, _real: Callable[..., Any] = real, _name: str = name
        ) -> Any:
            if reads.active:
                if self is reads.host:
                    reads.buffer += 1
                else:
                    reads.other.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield reads


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _train(
    model: nn.Module, probe: GradientNoiseProbe, reads: _Reads | None, source: str
) -> list[int]:
    """STEPS steps; the host-buffer reads each step() made."""
    gen = torch.Generator().manual_seed(1)
    scaler = probe.scaler
    per_step = []
    k = K if source == "micro" else 1
    for _ in range(STEPS):
        for j in range(k):
            x = torch.randn(B, 6, generator=gen)
            y = torch.randint(0, 3, (B,), generator=gen)
            loss = nn.functional.cross_entropy(model(x), y) / k
            scaler.scale(loss).backward()
            if j < k - 1:
                probe.micro_step(batch_size=B)
        before = reads.buffer if reads is not None else 0
        loss_value = float(loss.detach())  # the user's own read, before step()
        if reads is not None:
            reads.active = True
        try:
            probe.step(batch_size=B, loss=loss_value)
        finally:
            if reads is not None:
                reads.active = False
        per_step.append((reads.buffer if reads is not None else 0) - before)
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.0))
        scaler.update()
        model.zero_grad()
    return per_step


@pytest.mark.parametrize("source", ["micro", "per_example"])
def test_deferred_step_reads_nothing_and_logs_what_immediate_logs(
    monkeypatch: pytest.MonkeyPatch, source: Literal["micro", "per_example"]
) -> None:
    base = _model()
    sinks: dict[str, ListSink] = {}
    buffer_reads: dict[str, list[int]] = {}
    for mode in ("immediate", "deferred"):
        model = copy.deepcopy(base)
        scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
        sinks[mode] = ListSink()
        probe = GradientNoiseProbe(
            model,
            sinks[mode],
            source=source,
            layers=True,
            scaler=scaler,
            readout=mode,
        )
        assert probe.readout == mode
        with _counting(monkeypatch) as reads:
            reads.host = probe._readout.host
            buffer_reads[mode] = _train(model, probe, reads, source)
            assert reads.other == [], reads.other  # no other host read in step(), either mode
            if mode == "deferred":  # nothing logged for the last step until it is read
                assert {r["step"] for r in sinks[mode].rows} == set(range(STEPS - 1))
            probe.remove()
        monkeypatch.undo()
    # immediate: each step() reads its own values; deferred: the previous step's, none first
    assert buffer_reads["immediate"] == [1] * STEPS
    assert buffer_reads["deferred"] == [0] + [1] * (STEPS - 1)
    assert len(sinks["immediate"].rows) == STEPS * 3  # the model and its two layers
    assert sinks["deferred"].rows == sinks["immediate"].rows


def test_readout_default_is_immediate_on_the_cpu() -> None:
    probe = GradientNoiseProbe(_model(), ListSink())
    assert probe.readout == "immediate"
    with pytest.raises(ValueError, match="readout must be"):
        GradientNoiseProbe(_model(), ListSink(), readout="later")  # type: ignore[arg-type]
