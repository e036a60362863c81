"""Wrappers the probe cannot read correctly are refused with an error naming what is
supported, instead of logging wrong numbers (FSDP1, nn.DataParallel; DeepSpeed's stages 0 and
3 with real engines in ``test_deepspeed``)."""

from __future__ import annotations

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
    named_modules = nn.Module.named_modules
    named_parameters = nn.Module.named_parameters


def _fsdp1_wrapped() -> nn.Module:
    return nn.Sequential(_Fsdp1Unit())


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (_fsdp1_wrapped, "FSDP1"),
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
    assert "Supported: one process, torch.nn.parallel.DistributedDataParallel, FSDP2" in message
