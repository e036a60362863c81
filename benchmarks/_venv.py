"""The competitors' venv: MLflow and wandb at pinned versions, never in the project's venv.

``python -m benchmarks`` (and the modules that compare against MLflow or wandb) call
``competitor_python()``, which creates ``.bench-venv/`` in the repository (git-ignored) the first
time, installs ``PINS`` with pip, and reuses it while its ``pins.txt`` matches. Set
``NOISESCOPE_BENCH_VENV`` to put it elsewhere. ``python -m benchmarks --venv-only`` prepares it
and stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PINS", "VenvError", "competitor_python", "ensure_venv", "venv_dir"]

#: The versions the published figures in docs/benchmarks.md were measured with.
PINS = ("mlflow==3.17.2", "wandb==0.31.0")
STAMP = "pins.txt"
REPO = Path(__file__).resolve().parent.parent


class VenvError(RuntimeError):
    """The venv could not be created or its packages installed (the message says which)."""


def venv_dir() -> Path:
    return Path(os.environ.get("NOISESCOPE_BENCH_VENV") or REPO / ".bench-venv")


def _python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ensure_venv(root: Path, pins: Sequence[str] = PINS, log: Path | None = None) -> Path:
    """The Python of a venv at ``root`` holding exactly ``pins``: reused when its stamp says so,
    else (re)created and installed. pip's output goes to ``log`` (default: ``root``/pip.log)."""
    stamp = root / STAMP
    wanted = "\n".join(pins) + "\n"
    python = _python(root)
    if python.exists() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    print(f"[benchmarks] creating the competitors' venv {root} ({', '.join(pins) or 'empty'})")
    venv.EnvBuilder(clear=True, with_pip=bool(pins)).create(root)
    log = log or root / "pip.log"
    if pins:
        with log.open("wb") as out:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--no-input", *pins],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if done.returncode != 0:
            raise VenvError(f"pip install {' '.join(pins)} failed in {root}; see {log}")
    stamp.write_text(wanted)
    return python


def competitor_python() -> tuple[Path | None, str]:
    """(the venv's Python, "") or (None, why not), for a benchmark's "not run" note."""
    try:
        return ensure_venv(venv_dir()), ""
    except (OSError, VenvError, subprocess.SubprocessError) as exc:
        return None, f"not run: {exc}"
