"""Wrappers the probe cannot read correctly are refused with an error naming what is
supported, instead of logging wrong numbers (FSDP1, DeepSpeed, nn.DataParallel)."""

from __future__ import annotations

import types

import pytest
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from noisescope.torch import GradientNoiseProbe
from tests.probes.lsq_torch import ListSink


class _Fsdp1Unit(FullyShardedDataParallel):
    """An FSDP1 unit built without a process group: only its type counts."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.add_module("inner", nn.Linear(4, 1))

    __getattr__ = nn.Module.__getattr__
    named_modules = nn.Module.named_modules  # type: ignore[assignment]
    named_parameters = nn.Module.named_parameters  # type: ignore[assignment]


def _fsdp1_wrapped() -> nn.Module:
    return nn.Sequential(_Fsdp1Unit())


def _deepspeed_engine() -> nn.Module:
    """A stand-in for ``deepspeed.DeepSpeedEngine`` (DeepSpeed does not install here): a module
    class defined in a ``deepspeed.*`` module."""
    engine_cls = types.new_class("DeepSpeedEngine", (nn.Module,))
    engine_cls.__module__ = "deepspeed.runtime.engine"
    engine = engine_cls()
    engine.add_module("module", nn.Linear(4, 1))
    return engine


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (_fsdp1_wrapped, "FSDP1"),
        (_deepspeed_engine, "DeepSpeed"),
        (lambda: nn.DataParallel(nn.Linear(4, 1)), "DataParallel"),
    ],
)
def test_unsupported_wrappers_are_refused_naming_what_is_supported(
    make: object, named: str
) -> None:
    with pytest.raises(TypeError) as caught:
        GradientNoiseProbe(make(), ListSink())  # type: ignore[operator]
    message = str(caught.value)
    assert named in message
    assert "Supported: one process, torch.nn.parallel.DistributedDataParallel, or FSDP2" in message
