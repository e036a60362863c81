"""Regression: ``noisescope token create --project P --database-url URL`` (the option after
the action, as the docs and the harness write it) failed with "unrecognized arguments"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "noisescope.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_database_url_after_the_token_action(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    created = _cli("token", "create", "--project", "p", "--database-url", url)
    assert created.returncode == 0, created.stderr
    secret = next(ln for ln in created.stdout.splitlines() if ln.startswith("nsk_"))
    listed = _cli("token", "--database-url", url, "list")  # the old position still works
    assert listed.returncode == 0, listed.stderr
    assert " p " in listed.stdout
    assert secret not in listed.stdout
