"""A fresh ``torch.compile`` state for one piece of training, and what dynamo did in it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Compiled:
    """Filled in when the block ends: dynamo's graph breaks (reason -> count) and the number
    of graphs it compiled."""

    graph_breaks: dict[str, Any] = field(default_factory=dict)
    graphs: int = 0


@contextmanager
def compiled_counts() -> Iterator[Compiled]:
    """Reset dynamo (no graph compiled earlier is reused) and its counters; read them after."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    out = Compiled()
    try:
        yield out
    finally:
        out.graph_breaks = dict(counters["graph_break"])
        out.graphs = int(counters["stats"]["unique_graphs"])
        torch._dynamo.reset()
