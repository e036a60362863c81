"""Probe tests share 2 CPU cores with everything else: one intra-op thread is fastest here."""

from __future__ import annotations

import pytest

from noisescope.torch import _rows


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every probe test runs with ``one_torch_thread``."""


@pytest.fixture
def read_first_from_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an accelerator: a step's first backward is read from .grad in one batched call
    when it can be (on the CPU, the default, the hooks measure it like the later ones)."""
    monkeypatch.setattr(_rows, "_PER_PARAMETER", frozenset())


@pytest.fixture(params=["hooks", "batched"])
def first_read(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of measuring a step's first backward: in the hooks (the CPU's) and, as on an
    accelerator, from .grad in one batched call."""
    if request.param == "batched":
        monkeypatch.setattr(_rows, "_PER_PARAMETER", frozenset())
    return str(request.param)
