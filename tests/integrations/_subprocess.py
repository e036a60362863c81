"""The environment of the training scripts the integration tests run as child processes."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pythonpath() -> str:
    """This checkout's client package first, then its tests: a child must import this
    checkout's noisescope, not one installed in the environment."""
    return os.pathsep.join([str(ROOT / "client"), str(ROOT)])
