"""Reading the Vega-Lite specs the dashboard's charts produce."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def spec_layers(spec: dict[str, Any]) -> Sequence[dict[str, Any]]:
    """The layers of a Vega-Lite spec (a single view counts as one layer)."""
    layers = spec.get("layer")
    return list(layers) if layers is not None else [spec]
