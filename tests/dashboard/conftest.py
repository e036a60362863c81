"""Fixtures for the dashboard tests: a temp SQLite file of synthetic runs, a fresh AppTest.

SQLite ``:memory:`` would give each Streamlit script thread its own empty database, so the
database is always a file. ``st.cache_data``/``cache_resource`` outlive an AppTest (streamlit
issue 9139): every test starts with empty caches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from ._synth import default_runs, insert_runs

APP = Path(__file__).parents[2] / "dashboard" / "noisescope_dashboard" / "app.py"


@pytest.fixture(scope="session")
def synth_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dash") / "noisescope.db"
    url = f"sqlite:///{path}"
    insert_runs(url, default_runs())
    return url


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dash_empty") / "noisescope.db"
    url = f"sqlite:///{path}"
    insert_runs(url, [])
    return url


@pytest.fixture(autouse=True)
def _clear_streamlit_caches() -> Iterator[None]:
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> Callable[..., AppTest]:
    """A fresh session on ``url``: the whole app, or one page opened by URL with its query.

    A page opened with query parameters is the page script itself started with them, as a
    shared link starts a new session (AppTest clears query parameters on ``switch_page``).
    """

    def make(url: str | None, page: str | None = None, **query: str | list[str]) -> AppTest:
        if url is None:
            monkeypatch.delenv("NOISESCOPE_DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("NOISESCOPE_DATABASE_URL", url)
        script = APP if page is None else APP.parent / "views" / f"{page}.py"
        at = AppTest.from_file(str(script), default_timeout=60)
        for key, value in query.items():
            at.query_params[key] = value
        at.run()
        return at

    return make
