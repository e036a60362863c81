"""Framework integrations: callbacks that measure the gradient noise scale where people train.

- :class:`HuggingFaceCallback`: a ``transformers.TrainerCallback`` (``pip install
  'noisescope[transformers]'``).
- :class:`LightningCallback`: a ``lightning.pytorch.Callback`` (``pip install
  'noisescope[lightning]'``).

Both are thin layers over the plain-loop API (``noisescope.init`` and
``noisescope.torch.GradientNoiseProbe``); both branch (docs/branching.md) when given
``branch=BranchOptions(every=N, eval=batches, ...)`` (:class:`BranchOptions`). Both take the
keyword arguments of :class:`CallbackOptions`, one declaration for the two. The callback
classes are loaded on first access, so importing ``noisescope`` or ``noisescope.integrations``
never imports torch, transformers or lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from noisescope.integrations._options import BranchOptions, CallbackOptions

if TYPE_CHECKING:
    from noisescope.integrations._hf import HuggingFaceCallback
    from noisescope.integrations._lightning import LightningCallback

__all__ = ["BranchOptions", "CallbackOptions", "HuggingFaceCallback", "LightningCallback"]

_LAZY = {
    "HuggingFaceCallback": ("noisescope.integrations._hf", "transformers"),
    "LightningCallback": ("noisescope.integrations._lightning", "lightning"),
}


def __getattr__(name: str) -> Any:
    """Import the framework (and its callback module) only when its callback is asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module 'noisescope.integrations' has no attribute {name!r}")
    module_name, extra = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"noisescope.integrations.{name} needs the {extra!r} extra: "
            f"pip install 'noisescope[{extra}]' ({exc})"
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
