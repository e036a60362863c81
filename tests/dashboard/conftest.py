"""Fixtures for the dashboard tests: a real server on synthetic runs, a fresh AppTest per test.

The dashboard reads only the HTTP API, so every test runs against ``python -m
noisescope_server`` (``harness.servers.ServerProcess``) on a SQLite file written by
``harness.dashboard_runs``. ``st.cache_data``/``cache_resource`` outlive an AppTest
(streamlit issue 9139): every test starts with empty caches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from harness import ServerProcess
from harness.dashboard_runs import default_runs, insert_runs
from noisescope import Api

APP = Path(__file__).parents[2] / "dashboard" / "noisescope_dashboard" / "app.py"
#: The admin token of ``auth_server`` (it creates project tokens).
ADMIN = "admin-secret-for-dashboard-tests"

MakeApp = Callable[..., AppTest]


@pytest.fixture(scope="session")
def synth_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dash") / "noisescope.db"
    url = f"sqlite:///{path}"
    insert_runs(url, default_runs())
    return url


@pytest.fixture(scope="session")
def server(synth_db: str) -> Iterator[str]:
    """The base URL of a server on the synthetic runs (auth off)."""
    with ServerProcess(synth_db) as proc:
        yield proc.url


@pytest.fixture(scope="session")
def empty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("dash_empty") / "noisescope.db"
    url = f"sqlite:///{path}"
    insert_runs(url, [])
    with ServerProcess(url) as proc:
        yield proc.url


@pytest.fixture(scope="session")
def auth_server(synth_db: str) -> Iterator[str]:
    """A second server on the same runs that answers reads only with a token."""
    with ServerProcess(synth_db, auth="all", env={"NOISESCOPE_ADMIN_TOKEN": ADMIN}) as proc:
        yield proc.url


@pytest.fixture(scope="session")
def api(server: str) -> Iterator[Api]:
    with Api(server) as client:
        yield client


@pytest.fixture(autouse=True)
def _clear_streamlit_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> MakeApp:
    """A fresh session on ``url``: the whole app, or one page opened by URL with its query,
    run once without an exception.

    A page opened with query parameters is the page script itself started with them, as a
    shared link starts a new session (AppTest clears query parameters on ``switch_page``).
    """

    def make(
        url: str | None,
        page: str | None = None,
        *,
        token: str | None = None,
        **query: str | list[str],
    ) -> AppTest:
        for name in ("NOISESCOPE_URL", "NOISESCOPE_TOKEN", "NOISESCOPE_DATABASE_URL"):
            monkeypatch.delenv(name, raising=False)
        if url is not None:
            monkeypatch.setenv("NOISESCOPE_URL", url)
        if token is not None:
            monkeypatch.setenv("NOISESCOPE_TOKEN", token)
        script = APP if page is None else APP.parent / "views" / f"{page}.py"
        at = AppTest.from_file(str(script), default_timeout=120)
        for key, value in query.items():
            at.query_params[key] = value
        at.run()
        assert not at.exception, [e.message for e in at.exception]  # no page ever raises
        return at

    return make
