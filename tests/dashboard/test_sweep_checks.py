"""The sweep's checks (noisescope.sweep._checks) where the user looks: the Critical batch page
shows every warning of the API as a warning, and What-if offers no undetermined B_crit."""

from __future__ import annotations

from noisescope import Api

from ._app import plain
from .conftest import MakeApp


def test_critical_batch_page_shows_the_sweeps_checks_as_warnings(
    make_app: MakeApp, server: str, api: Api
) -> None:
    # vision/digits has one seed per (batch, lr); nlp/lm-sweep one learning rate per batch
    for task, said in (("vision/digits", "single seed"), ("nlp/lm-sweep", "only one learning")):
        at = make_app(server, "critical_batch", task=task)
        shown = plain("\n".join(w.value for w in at.warning))
        project, name = task.split("/")
        report = api.critical_batch(project, name)
        assert report.targets
        for t in report.targets:
            assert any(said in w for w in t.warnings), t.warnings
            for w in t.warnings:  # every warning of the API, on the page as a warning
                assert w in shown, w


def test_what_if_shows_the_sweeps_warnings_beside_a_determined_b_crit(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "what_if", task="vision/digits", source="bcrit:1")
    # the determined target comes with what the sweep says to read it with
    assert any("read this B_crit with care" in w.value for w in at.warning)
