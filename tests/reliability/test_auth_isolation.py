"""Isolation and auth on a real 2-worker server with ``--auth all``: hashed tokens, no
cross-project access, instant revocation on every worker, no secret in any log."""

from __future__ import annotations

from pathlib import Path

from reliability._auth import run_auth
from reliability._infra import Server


def test_tokens_isolate_projects_and_never_leak(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    with Server(url, auth="all", workers=2, log_level="debug") as server:
        result = run_auth(server, tmp_path, cli=False)
    assert [(c.what, c.expected, c.got) for c in result.checks if not c.ok] == []
    assert len(result.checks) > 30
