"""noisescope's PyTorch probes: gradient-noise measurements inside the training loop.

Importing this module needs torch; ``import noisescope`` never does. See docs/sources.md for
which source of the two batch sizes to use, what each costs, and the pitfalls.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "noisescope.torch needs PyTorch (noisescope itself does not). Without an NVIDIA GPU "
        "install the CPU build, a plain `pip install torch` pulls the multi-GB CUDA one: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    ) from exc

from noisescope._sink import Sink

from ._hessian import BNoiseEstimate, hessian_noise_scale
from ._instrument import instrumented
from ._per_example import PerExampleNorms
from ._probe import GradientNoiseProbe
from ._sums import ProbeSample

__all__ = [
    "BNoiseEstimate",
    "GradientNoiseProbe",
    "PerExampleNorms",
    "ProbeSample",
    "Sink",
    "hessian_noise_scale",
    "instrumented",
]
