"""The run page's branching section against a real server holding a parent run with samples,
its branch runs (``noisescope.branch``) and a sweep of the same task."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import noisescope
from harness import ServerProcess
from harness.lsq_branch import branch_logged_parent
from harness.payloads import columns, log_sample_args
from harness.synthetic_sweep import make_sweep, post
from noisescope import Api
from noisescope_dashboard import _branches

from ._app import chart_data, charts, plain, texts
from .conftest import MakeApp

PROJECT, TASK = "branching", "lsq"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    tmp: Path = tmp_path_factory.mktemp("branches")
    with ServerProcess() as server:
        parent = noisescope.init(
            server.url, project=PROJECT, task=TASK, batch_size=4, dir=tmp / "spool", quiet=True
        )
        cols = columns(400)
        for i in range(len(cols["step"])):
            parent.log_sample(*log_sample_args(cols, i))
        with httpx.Client(base_url=server.url) as c:
            post(c, make_sweep(200.0, (32, 64, 128, 256, 512)), project=PROJECT, task=TASK)
        branch_logged_parent(parent, server.url, tmp, quiet=True)
        parent.finish()
        kid = next(r.uid for r in Api(server.url).runs(project=PROJECT) if r.parent_uid)
        yield server.url, parent.id, kid


def test_the_run_page_draws_proxy_local_and_sweep_on_one_chart(
    make_app: MakeApp, stack: tuple[str, str, str]
) -> None:
    url, parent, _ = stack
    at = make_app(url, "run", run=parent)
    assert _branches.TITLE in charts(at), (list(charts(at)), texts(at)[-2000:], at.error)
    spec = charts(at)[_branches.TITLE]
    frames = chart_data(at)[_branches.TITLE]
    measured = next(f for f in frames if "interval" in f.columns)
    answer = Api(url).branches(parent)
    (point,) = answer.points
    # the fixture's grid (x4 steps) does not resolve its crossing: a bracket, drawn as its span
    assert point.b_crit is None and point.b_crit_lo is not None and point.b_crit_hi is not None
    local = measured[measured["quantity"] == _branches.BRACKET]
    assert list(local["lo"]) == pytest.approx([point.b_crit_lo])
    assert list(local["hi"]) == pytest.approx([point.b_crit_hi])
    assert set(measured["quantity"]) <= {
        _branches.BRACKET,
        _branches.SWEEP,
        _branches.SWEEP_EXTRAPOLATED,
    }
    assert any(q.startswith("sweep B_crit") for q in measured["quantity"])
    titles = [
        layer["encoding"]["y"].get("title")
        for layer in spec["layer"]
        if "y" in layer.get("encoding", {})
    ]
    assert "batch size (examples)" in titles
    assert "largest batch whose loss after the branch budget" in plain(texts(at))
    (table,) = [d for d in at.dataframe if "local B_crit" in d.value.columns]
    assert list(table.value["step"]) == [50]


def test_a_branch_run_links_to_its_parent_and_plain_runs_show_no_section(
    make_app: MakeApp, stack: tuple[str, str, str]
) -> None:
    url, parent, kid = stack
    at = make_app(url, "run", run=kid)
    text = plain(texts(at))
    assert f"This run is a branch of run [{parent[:12]}](/run?run={parent})" in text
    assert _branches.TITLE not in charts(at)


def test_marks_and_table_say_why_when_there_is_no_number() -> None:
    from noisescope._results import BranchPointResult, RunBranches

    empty = BranchPointResult(
        step=7,
        parent_loss=None,
        epsilon=0.01,
        level=0.9,
        batch_sizes=[8.0, 16.0],
        mean_loss=[1.0, 1.0],
        seeds=2,
        n_runs=4,
        run_ids=[],
        b_crit=None,
        b_crit_lo=16.0,
        b_crit_hi=None,
        reason="every batch size up to 16 stayed within 0.01",
    )
    answer = RunBranches(str(uuid.uuid4()), "examples", [empty], None, None, "too few")
    frame = _branches.marks(answer, None)
    assert list(frame["quantity"]) == [_branches.LOWER] and list(frame["value"]) == [16.0]
    assert list(frame["interval"]) == ["above 16"]  # the tooltip says what is known
    row = _branches.table(answer, None).iloc[0]
    assert row["local B_crit"] == "> 16" and "stayed within" in row["note"]


def test_a_bracket_is_drawn_and_written_as_its_two_grid_points() -> None:
    from dataclasses import replace

    from noisescope._results import BranchPointResult, RunBranches

    bracket = BranchPointResult(
        step=10,
        parent_loss=None,
        epsilon=0.01,
        level=0.9,
        batch_sizes=[16.0, 32.0, 64.0],
        mean_loss=[1.0, 1.3, 1.6],
        seeds=3,
        n_runs=9,
        run_ids=[],
        b_crit=None,
        b_crit_lo=16.0,
        b_crit_hi=32.0,
        reason="between 16 and 32: the first step of the grid (x2) already leaves the tolerance",
        b_crit_interpolated=16.3,
    )
    number = replace(bracket, step=20, b_crit=40.0, b_crit_lo=32.0, b_crit_hi=64.0, reason=None)
    answer = RunBranches(str(uuid.uuid4()), "examples", [bracket, number], None, None, "")
    frame = _branches.marks(answer, None)
    assert list(frame["quantity"]) == [_branches.BRACKET, _branches.LOCAL]
    assert list(frame["lo"]) == [16.0, 32.0] and list(frame["hi"]) == [32.0, 64.0]
    assert list(frame["interval"]) == ["16 – 32", "32 – 64"]
    one_seed = replace(number, b_crit_lo=None, b_crit_hi=None, seeds=1)
    mark = _branches.local_mark(one_seed)
    assert (
        mark is not None and mark["interval"] == "unknown" and mark["quantity"] == _branches.LOCAL
    )
    assert 16.0 < frame["value"][0] < 32.0  # drawn across its span, never at 16.3
    rows = _branches.table(answer, None)
    assert list(rows["local B_crit"]) == ["between 16 and 32", "40"]
    assert list(rows["90% interval"]) == ["16 – 32", "32 – 64"]


def test_a_branch_run_says_when_its_parent_is_not_on_the_server(
    make_app: MakeApp, stack: tuple[str, str, str]
) -> None:
    """Issue 29 item 8: such a link is accepted (the parent may come later), not invisible."""
    url, _, kid = stack
    orphan = uuid.uuid4().hex
    body = {"project": PROJECT, "task": TASK, "parent_run_id": uuid.uuid4().hex, "branch_step": 3}
    assert httpx.put(f"{url}/api/v1/runs/{orphan}", json=body).status_code == 201
    said = [c.value for c in make_app(url, "run", run=orphan).caption]
    assert any("is a branch of run" in c and "not on this server" in c for c in said), said
    said = [c.value for c in make_app(url, "run", run=kid).caption]
    assert any("is a branch of run" in c for c in said)
    assert not any("not on this server" in c for c in said), said
