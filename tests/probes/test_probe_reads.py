"""How the probe reads gradients: slots made once, nothing computed for unmeasured backwards,
the first backward read from .grad in one batched call (alone, with a submodule called
directly, in a one-process group)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from harness import free_port
from noisescope.torch import GradientNoiseProbe, _rows
from tests.probes.lsq_torch import ListSink
from tests.probes.small_loop import data, loss_of, mlp

# TorchDispatchMode.__init__ has no annotations; pyproject.toml's untyped_calls_exclude covers
# calls into torch but not super().__init__(), hence its type: ignore[no-untyped-call].


@pytest.fixture
def norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the gradient-norm kernels the probe's hooks launch."""
    calls = [0]
    real = _rows._norm_into

    def counting(dtype: torch.dtype) -> _rows.NormInto:
        norm = real(dtype)

        def counted(grad: Tensor, /, *, out: Tensor) -> object:
            calls[0] += 1
            return norm(grad, out=out)

        return counted

    monkeypatch.setattr(_rows, "_norm_into", counting)
    return calls


class _NormCalls(TorchDispatchMode):
    """Records, for each gradient norm computed in a backward, where its result went."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.outs: list[int | None] = []  # storage address of the out= slot, None if new

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten.linalg_vector_norm:
            out = kwargs.get("out")
            self.outs.append(None if out is None else out.untyped_storage().data_ptr())
        return func(*args, **kwargs)


def test_hooks_write_norms_into_slots_made_once(first_read: str) -> None:
    """Results kept alive through the later backwards of a step, allocated between their large
    gradient buffers, fragment the heap (page faults every step): the hooks write each norm
    into a slot the probe made once, the same storage every step."""
    steps, k, b = 3, 3, 4
    model, sink = mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    x, y = data(steps, k, b)
    per_step: list[set[int | None]] = []
    for i in range(steps):
        calls = _NormCalls()
        for j in range(k):
            loss = loss_of(model, x[i, j], y[i, j]) / k
            with calls:
                loss.backward()
            probe.micro_step(batch_size=b)
        probe.step()
        model.zero_grad()
        n = len(list(model.parameters()))
        hooked = k - 1 if first_read == "batched" else k  # batched: 1st read from .grad
        assert len(calls.outs) == hooked * n
        per_step.append(set(calls.outs))
    assert None not in per_step[0]
    assert per_step[0] == per_step[1] == per_step[2]
    assert len(sink.series("")) == steps


def test_unmeasured_backwards_compute_nothing(norm_calls: list[int], first_read: str) -> None:
    """every=2 with small_batches="first": only the first backward of a measured step is
    read, and the measured steps match a probe that measures every step."""
    steps, k, b = 4, 3, 4
    model, sink = mlp(), ListSink()
    twin, twin_sink = copy.deepcopy(model), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", every=2, small_batches="first")
    every_step = GradientNoiseProbe(twin, twin_sink, source="micro", small_batches="first")
    x, y = data(steps, k, b)
    calls = []
    for i in range(steps):
        for j in range(k):
            before = norm_calls[0]
            (loss_of(model, x[i, j], y[i, j]) / k).backward()
            probe.micro_step(batch_size=b)
            calls.append(norm_calls[0] - before)
            (loss_of(twin, x[i, j], y[i, j]) / k).backward()
            every_step.micro_step(batch_size=b)
        probe.step()
        every_step.step()
        model.zero_grad(set_to_none=False)  # zeroed .grad: hooks, not a read of .grad
        twin.zero_grad(set_to_none=False)
    n = len(list(model.parameters()))
    # hooks on the first backward only; batched, step 0 has no .grad yet: read from .grad
    first = 0 if first_read == "batched" else n
    assert calls == [first, 0, 0, 0, 0, 0, n, 0, 0, 0, 0, 0]
    measured = [r for r in twin_sink.series("") if r["step"] in (0, 2)]
    assert sink.series("") == measured
    probe.remove()
    assert not any(p._backward_hooks for p in model.parameters())


def test_first_backward_read_from_grad_matches_the_hooks(
    norm_calls: list[int], first_read: str
) -> None:
    """Batched: with every .grad None before a step (set_to_none=True), the first backward's
    norms are read from .grad in one batched call; zeroed grads (set_to_none=False) need the
    hooks. Hooks (the CPU's way): every backward through the hooks, no forward hook at all.
    Both give the same samples."""
    steps, k, b = 3, 3, 4
    x, y = data(steps, k, b)
    rows = {}
    for set_to_none in (True, False):
        model, sink = mlp(), ListSink()
        n = len(list(model.parameters()))
        probe = GradientNoiseProbe(model, sink, source="micro")
        calls = []
        for i in range(steps):
            for j in range(k):
                before = norm_calls[0]
                (loss_of(model, x[i, j], y[i, j]) / k).backward()
                calls.append(norm_calls[0] - before)
                probe.micro_step(batch_size=b)
            probe.step()
            model.zero_grad(set_to_none=set_to_none)
        if first_read == "batched":
            # a fresh model has no .grad at all: its first step never needs the hooks
            assert calls[::k] == [0] + [0 if set_to_none else n] * (steps - 1)
        else:
            assert calls[::k] == [n] * steps
            assert not any(m._forward_pre_hooks for m in model.modules())
        assert all(c == n for j, c in enumerate(calls) if j % k)
        rows[set_to_none] = sink.series("")
    numbers = ("step", "b_small", "b_big", "g_small_sq", "g_big_sq", "examples")
    for read, hooked in zip(rows[True], rows[False], strict=True):
        for name in numbers:
            assert read[name] == pytest.approx(hooked[name], rel=1e-6), name


def test_first_backward_read_from_grad_when_a_submodule_is_called_directly(
    norm_calls: list[int], read_first_from_grad: None
) -> None:
    """Lightning calls ``self.model(...)`` inside training_step, never the probed module's own
    forward: the first backward is still read from .grad, and the numbers match."""

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = mlp()

    k, b = 3, 4
    x, y = data(1, k, b)
    wrapper, sink = Wrapper(), ListSink()
    twin, twin_sink = copy.deepcopy(wrapper.model), ListSink()
    probe = GradientNoiseProbe(wrapper, sink, source="micro")
    reference = GradientNoiseProbe(twin, twin_sink, source="micro")
    calls = []
    for j in range(k):
        before = norm_calls[0]
        (loss_of(wrapper.model, x[0, j], y[0, j]) / k).backward()
        calls.append(norm_calls[0] - before)
        probe.micro_step(batch_size=b)
        (loss_of(twin, x[0, j], y[0, j]) / k).backward()
        reference.micro_step(batch_size=b)
    probe.step()
    reference.step()
    assert calls[0] == 0
    assert sink.series("") == twin_sink.series("")


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A gloo group of one process, as ``torchrun --nproc-per-node 1`` sets up."""
    init = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["plain", "ddp"])
def test_first_backward_read_from_grad_in_a_one_process_group(
    one_process_group: None, norm_calls: list[int], read_first_from_grad: None, wrap: str
) -> None:
    """With no peer to all-reduce with, the first backward is read from .grad even outside
    no_sync; later backwards use the hooks; the numbers match a probe outside any group."""
    k, b = 3, 4
    x, y = data(2, k, b)
    base = mlp()
    model: nn.Module = copy.deepcopy(base)
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    sink, twin_sink = ListSink(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    twin = copy.deepcopy(base)
    reference = GradientNoiseProbe(twin, twin_sink, source="micro")
    n = len(list(base.parameters()))
    calls = []
    for i in range(2):
        for j in range(k):
            before = norm_calls[0]
            (loss_of(model, x[i, j], y[i, j]) / k).backward()
            calls.append(norm_calls[0] - before)
            probe.micro_step(batch_size=b)
            (loss_of(twin, x[i, j], y[i, j]) / k).backward()
            reference.micro_step(batch_size=b)
        probe.step()
        reference.step()
        model.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
    assert calls == [0, n, n] * 2
    for row, ref in zip(sink.series(""), twin_sink.series(""), strict=True):
        for name in ("b_small", "b_big", "g_small_sq", "g_big_sq"):
            assert row[name] == pytest.approx(ref[name], rel=1e-5), name
