"""The competitors' venv: made once, reused while its pins match, remade when they change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import _venv


def test_a_venv_is_made_then_reused_until_the_pins_change(tmp_path: Path) -> None:
    root = tmp_path / "venv"
    python = _venv.ensure_venv(root, pins=())
    assert subprocess.run([str(python), "-c", "import sys"], check=False).returncode == 0
    assert (root / _venv.STAMP).read_text() == "\n"
    marker = root / "kept"
    marker.write_text("")
    assert _venv.ensure_venv(root, pins=()) == python
    assert marker.exists()  # reused, not rebuilt
    (root / _venv.STAMP).write_text("mlflow==0.0.1\n")  # as if made for other pins
    assert _venv.ensure_venv(root, pins=()) == python
    assert not marker.exists()  # rebuilt from scratch


def test_a_failed_install_says_where_pip_wrote_why(tmp_path: Path) -> None:
    root = tmp_path / "venv"
    with pytest.raises(_venv.VenvError, match=r"pip\.log"):
        _venv.ensure_venv(root, pins=("./no-such-package-dir",))
    assert not (root / _venv.STAMP).exists()  # not taken for ready next time


def test_the_venv_lives_in_the_repo_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOISESCOPE_BENCH_VENV", raising=False)
    assert _venv.venv_dir() == _venv.REPO / ".bench-venv"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(_venv.venv_dir())], cwd=_venv.REPO, check=False
    )
    assert ignored.returncode == 0, ".bench-venv must be git-ignored"
    monkeypatch.setenv("NOISESCOPE_BENCH_VENV", "/elsewhere")
    assert _venv.venv_dir() == Path("/elsewhere")


def test_benchmarks_name_no_machine_path() -> None:
    """Anyone can rerun them: no absolute path of this machine in the code or its output."""
    bench = _venv.REPO / "benchmarks"
    texts = {p.name: p.read_text() for p in bench.glob("*.py")}
    texts["docs/benchmarks.md"] = (_venv.REPO / "docs" / "benchmarks.md").read_text()
    for name, text in texts.items():
        for root in ("/work/", "/home/", "/opt/", "/root/"):
            assert root not in text, f"{name} names a machine path under {root}"
