"""Issue 56 (the first hour, round 2): the pages a new user opens after the README's steps.
A live Run page reads its run once per render, so its headline and verdict agree."""

from __future__ import annotations

import pytest

from harness.dashboard_runs import DIGITS64
from noisescope import Api
from noisescope.recommend import recommend
from noisescope_dashboard import _text

from ._app import plain
from .conftest import MakeApp

# --- item 4: one read per render ------------------------------------------------------------


def test_the_run_page_verdict_comes_from_the_read_its_headline_shows(
    make_app: MakeApp, server: str, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict is made from the same ``RunSummary`` as B_simple now and B / B_simple (a
    second request, as the page made before, reads a live run later and can disagree)."""

    def second_read(self: Api, run_id: str, **kwargs: object) -> None:
        raise AssertionError("the Run page asked the server for a second B_simple")

    monkeypatch.setattr(Api, "recommendation", second_read)
    at = make_app(server, "run", run=DIGITS64)
    run = api.run(DIGITS64)
    assert run.batch_in_use is not None
    verdict = plain(at.info[0].value)
    assert verdict == recommend(run, run.batch_in_use, units=run.units).verdict
    assert f"~{_text.ratio(run.batch_to_b_simple)} B_simple" in verdict


# --- item 5: the ids the pages show are taken everywhere --------------------------------------


def test_the_run_page_opens_on_a_unique_start_of_an_id(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=DIGITS64[:10])  # "digits00" starts several
    assert not at.error
    assert f"run id {DIGITS64}" in plain(at.caption[0].value)
