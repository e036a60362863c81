"""A database migrated by a newer noisescope (issue 55 item 4), on SQLite and PostgreSQL:
``server``, ``up`` and ``db upgrade`` end with one line that names both revisions and the
remedy, status 2, no traceback, and leave the database as it was (the SQLite file's bytes,
PostgreSQL's rows); ``db current`` says the database is newer than this noisescope."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import free_port
from harness.old_rows import FUTURE_REVISION, database_state, future_database
from noisescope_server import db


def _cli(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NOISESCOPE_HOME": str(home)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "noisescope.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_newer_database_is_refused_in_one_line_and_left_unchanged(
    db_url: str, tmp_path: Path
) -> None:
    future_database(db_url)
    before = database_state(db_url)
    head = db.head_revision()
    commands = {
        "noisescope server": ["server", "--port", str(free_port())],
        "noisescope up": ["up", "--no-dashboard", "--port", str(free_port())],
        "noisescope db upgrade": ["db", "upgrade"],
        "noisescope token list": ["token", "list"],
    }
    for name, argv in commands.items():
        out = _cli([*argv, "--database-url", db_url], tmp_path)
        assert out.returncode == 2, (name, out)
        assert "Traceback" not in out.stderr, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith(f"{name}: "), line
        assert f"at revision {FUTURE_REVISION}, newer than this noisescope" in line
        assert f"newest revision is {head}" in line and "pip install -U noisescope-server" in line
        assert database_state(db_url) == before, name
    current = _cli(["db", "current", "--database-url", db_url], tmp_path)
    assert current.returncode == 0, current
    assert f"current: {FUTURE_REVISION}  head: {head}" in current.stdout
    assert "newer than this noisescope" in current.stdout
    assert "needs `noisescope db upgrade`" not in current.stdout
    assert database_state(db_url) == before


def test_the_line_in_the_docs_is_the_commands(tmp_path: Path) -> None:
    """docs/deployment.md's example line is what ``noisescope server`` prints, but for the
    database's URL and the revision numbers."""
    import re

    url = f"sqlite:///{tmp_path / 'noisescope.db'}"
    future_database(url)
    out = _cli(["server", "--port", str(free_port()), "--database-url", url], tmp_path)
    docs = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
    (documented,) = [
        line.strip()
        for line in docs.read_text().splitlines()
        if line.strip().startswith("noisescope server: sqlite:")
    ]

    def general(line: str) -> str:
        line = re.sub(r"sqlite:///\S+?: ", "URL: ", line)
        return re.sub(r"revision \d{4}", "revision N", line)

    assert out.returncode == 2 and general(out.stderr.strip()) == general(documented)
