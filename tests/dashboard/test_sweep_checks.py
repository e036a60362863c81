"""The sweep's checks (noisescope.sweep._checks) where the user looks: the Critical batch page
shows every warning of the API as a warning, and What-if offers no undetermined B_crit."""

from __future__ import annotations

import dataclasses
import uuid

import httpx
import pandas as pd
import streamlit as st

from harness import ServerProcess
from harness.synthetic_sweep import make_sweep, post
from noisescope import Api
from noisescope_dashboard import _frames, _text
from tests.server.test_diverged import _BlowUp

from ._app import chart_data, plain
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


def test_a_diverged_run_reads_diverged_beside_its_status(api: Api) -> None:
    run = api.runs(project="vision", task="digits")[0]
    assert not run.diverged and _text.status(run) == run.status
    blown = dataclasses.replace(run, diverged=True, diverged_reason="its loss rose from 0.4")
    assert _text.status(blown) == f"{run.status} · diverged"
    frame = _frames.runs_table([blown])
    assert frame["status"].tolist() == [f"{run.status} · diverged"]


def test_compare_tasks_leaves_a_diverged_run_off_the_loss_axis_and_says_so(
    make_app: MakeApp,
) -> None:
    project = "diverging"
    good, other = make_sweep(200.0, (64, 256), lrs=((0.3, 1.0),))
    blown = dataclasses.replace(other, uid=uuid.uuid4().hex)
    with ServerProcess() as server, httpx.Client(base_url=server.url, timeout=60) as client:
        post(client, [good], project=project, task="t")
        post(client, [_BlowUp(**dataclasses.asdict(blown))], project=project, task="t")
        at = make_app(server.url, "compare_tasks")
        at.checkbox(key="each").check().run()  # each run drawn too: not the blown-up one
        drawn = pd.concat(chart_data(at)[f"B_simple against loss: {project}/t"])
        assert set(drawn["run"].dropna()) == {good.uid}
        notes = "\n".join(c.value for c in at.caption)
        assert "Left out, their loss diverged" in notes and "B256-lr0.3" in plain(notes)
        # the Critical batch page lists a sweep's left-out runs under "Runs left out", and says
        # why only when one diverged
        three = make_sweep(200.0, (64, 256, 1024), lrs=((0.3, 1.0),))
        again = [dataclasses.replace(r, uid=uuid.uuid4().hex) for r in (*three, three[0])]
        post(client, three, project=project, task="sweep")
        post(client, [_BlowUp(**dataclasses.asdict(again.pop()))], project=project, task="sweep")
        post(client, again, project=project, task="units")
        tokens = uuid.uuid4().hex
        body = {"project": project, "task": "units", "batch_size": 4096, "units": "tokens"}
        assert client.put(f"/api/v1/runs/{tokens}", json=body).status_code == 201
        st.cache_data.clear()  # the task list read before these runs came
        for task, diverged in (("sweep", True), ("units", False)):
            at = make_app(server.url, "critical_batch", task=f"{project}/{task}")
            assert "Runs left out" in [h.value for h in at.subheader]
            notes = "\n".join(c.value for c in at.caption)
            assert ("Runs whose loss diverged" in notes) is diverged, task
