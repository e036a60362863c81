"""Getting a measured step's sums to the host, now or one measured step later.

Each measured step packs everything it has to tell into one device vector::

    [per-slot G_small sums | (FSDP) per-slot G_big shard sums | 5 counts | 2 flags]

which one collective adds over the ranks (under DDP and FSDP), followed by the part that is
not summed (DDP's per-slot G_big: its ``.grad`` is already all-reduced, the same on every rank).
The flags are how many ranks stopped after an error and how many saw ``step()`` come after
unscaling or clipping: every rank reads the same sums, so every rank stops, or drops a step, at
the same step.

Immediate readout waits for the values in ``step()`` (on an accelerator, a device
synchronisation per measured step). Deferred readout (the default off the CPU) only launches:
the reductions, the all-reduce asynchronously, and a non-blocking copy into a preallocated
host buffer with an event recorded behind it; the values are read at the next measured step,
or at ``flush()``, by which time the device has long finished them, so the training thread
never waits for it.
"""

from __future__ import annotations

import array
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

N_COUNTS = 5  # G_small samples, sum 1/b, sum c, sum c^2/b, items
N_FLAGS = 2  # ranks stopped, ranks that saw a misuse


@dataclass
class Pending:
    """A launched step, not yet read."""

    step: int
    loss: float | None
    lr: float | None
    examples_before: float  # examples seen before this step (the step's own added on reading)
    misuse: str | None  # this rank's reason to drop the step, if any
    work: Any  # the all-reduce's handle (CPU, async), or None
    values: Tensor  # the packed vector: the summed part, then the part that is not summed
    n_reduced: int  # the length of the summed part
    event: Any  # off the CPU: recorded after the copy into the host buffer


class Readout:
    """The one collective of a measured step, and the copy of its result to the host."""

    def __init__(
        self, device: torch.device, length: int, group: Any, distributed: bool, deferred: bool
    ) -> None:
        self.device = device
        self.group = group
        self.distributed = distributed
        self.deferred = deferred
        pinned = device.type == "cuda"
        #: the host copy of each step's values, the one tensor a deferred read touches
        self.host = torch.zeros(length, dtype=torch.float64, pin_memory=pinned)
        self.pending: Pending | None = None

    def to_device(self, values: list[float]) -> Tensor:
        """Host numbers to the device without waiting for it (pinned, non-blocking)."""
        if self.device.type == "cpu":  # from a buffer: no per-item type checks, as torch.tensor
            return torch.frombuffer(array.array("d", values), dtype=torch.float64)
        staged = torch.tensor(values, dtype=torch.float64, pin_memory=self.device.type == "cuda")
        return staged.to(self.device, non_blocking=True)

    def launch(self, pending: Pending) -> None:
        """Start the collective and the copy to the host; read now unless deferred."""
        if self.distributed:
            values, n = pending.values, pending.n_reduced
            reduced = values if n == len(values) else values[:n]  # a view: summed in place
            pending.work = torch.distributed.all_reduce(reduced, group=self.group, async_op=True)
        if self.device.type != "cpu":
            if pending.work is not None:
                pending.work.wait()  # the device stream waits for the collective, not the host
                pending.work = None
            self.host.copy_(pending.values, non_blocking=True)
            pending.event = _record_event(self.device)
        self.pending = pending

    def read(self) -> tuple[Pending, list[float]] | None:
        """The pending step and its values (summed part, then local part), if one is pending."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        if pending.event is not None:
            pending.event.synchronize()  # long done when deferred
        else:
            if pending.work is not None:
                pending.work.wait()
            self.host.copy_(pending.values)
        return pending, self.host.tolist()


def _record_event(device: torch.device) -> Any:
    module = getattr(torch, device.type, None)
    event_cls = getattr(module, "Event", None) if module is not None else None
    if event_cls is None:  # no events on this device: synchronise at the read
        return _Synchronise(device)
    event = event_cls()
    event.record()
    return event


class _Synchronise:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        module = getattr(torch, self.device.type, None)
        sync = getattr(module, "synchronize", None) if module is not None else None
        if sync is not None:
            sync()
