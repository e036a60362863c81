"""Hypothesis properties of the payload validation, and the dashboard in headless Chromium
showing HTML/JS names as text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reliability._browser import check_dashboard, seed_runs
from reliability._infra import Server
from reliability._properties import run_properties


def test_payload_validation_properties() -> None:
    failed = [(r.name, r.error) for r in run_properties(25) if not r.ok]
    assert failed == []


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs /usr/bin/chromium")
def test_dashboard_shows_html_names_as_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'xss.db'}"
    with Server(url) as server:
        uids = seed_runs(server)
        result = check_dashboard(server.url, uids[:1], tmp_path, overview_pages=False)
    assert result.problems == [], result.pages
    assert result.shown_as_text > 0, result.pages
