"""Probe tests share 2 CPU cores with everything else: one intra-op thread is fastest here."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every probe test runs with ``one_torch_thread``."""
