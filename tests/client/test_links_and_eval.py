"""Run links (printed once, from the client setting or the server's answer) and evaluation
losses (``Run.log(eval_loss=...)``, sent as ``eval`` events, never attached to samples)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import noisescope
from harness import AppServer, ServerProcess
from noisescope import _wire
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.database import query
from tests.support.waiting import wait_for


def _link_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "/run?run=" in line]


def test_eval_loss_reaches_the_server_as_an_eval_event(app_server: AppServer) -> None:
    run = noisescope.init(
        app_server.url, project="p", task="t", batch_size=8, transport=app_server.transport()
    )
    for step in range(5):
        run.log_sample(step, 8, 64, 2.0 + step, 1.0)
    run.log(step=2, eval_loss=0.5, examples=128)  # late, for an earlier step
    run.log(step=4, loss=0.9)  # still lands on step 4's open sample
    run.log(eval_loss=0.4)  # the current step
    run.log_sample(5, 8, 64, 7.0, 1.0)
    run.finish()
    events = app_server.client().get(f"/api/v1/runs/{run.id}/events").json()
    evals = [(e["step"], e["payload"]) for e in events if e["kind"] == _wire.EVAL_EVENT_KIND]
    assert evals == [(2, {"loss": 0.5, "examples": 128.0}), (4, {"loss": 0.4})]
    losses = query(
        app_server.database_url,
        "SELECT s.step, s.loss FROM sample s JOIN run r ON r.id = s.run_id "
        "WHERE r.uid = :uid ORDER BY s.seq",
        uid=run.id,
    )
    assert [tuple(r) for r in losses] == [
        (0, None),
        (1, None),
        (2, None),
        (3, None),
        (4, 0.9),
        (5, None),
    ]


def test_non_finite_eval_loss_is_ignored_and_counted(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    run = noisescope.init(project="p", task="t", transport=fake)
    with caplog.at_level(logging.WARNING, logger="noisescope"):
        run.log(step=1, eval_loss=float("nan"))
        run.log(step=1, eval_loss=float("inf"))
        run.log(step=1, eval_loss="not a number")  # type: ignore[arg-type]
        run.log(step=1, eval_loss=0.25)
    run.finish()
    kinds = [(e["kind"], e["payload"]) for e in fake.events[run.id].values()]
    assert kinds == [("eval", {"loss": 0.25})]
    assert run._hot_errors == 3
    assert sum("ignoring error in log call" in r.message for r in caplog.records) == 1


def test_eval_loss_offline_is_spooled_and_synced(tmp_path: Path, app_server: AppServer) -> None:
    run = noisescope.init(
        project="p", task="t", mode="offline", dir=tmp_path, dashboard_url="http://d"
    )
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log(step=0, eval_loss=1.5)
    run.finish()
    assert run.page_url is None  # offline: no link
    synced = noisescope.sync(tmp_path, url=app_server.url, transport=app_server.transport())
    assert synced.synced == [run.id]
    events = app_server.client().get(f"/api/v1/runs/{run.id}/events").json()
    assert [(e["kind"], e["payload"]) for e in events] == [("eval", {"loss": 1.5})]


def test_run_link_is_printed_at_init_from_the_client_setting(
    fake: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.dashboard_url = "http://from-server/run?run=x"  # the client's own setting wins
    fake.down = True  # and needs no server
    run = noisescope.init(
        project="p", task="t", name="bs64", transport=fake, quiet=False,
        dashboard_url="http://127.0.0.1:8501/", flush_timeout=0.2,
    )  # fmt: skip
    link = f"http://127.0.0.1:8501/run?run={run.id}"
    assert run.page_url == link
    assert capsys.readouterr().err == f"noisescope: run bs64 ({run.id[:8]}): {link}\n"
    fake.down = False
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    err = capsys.readouterr().err
    [summary] = err.splitlines()
    assert summary.endswith(f"View it at {link}")


def test_run_link_setting_from_the_environment(
    fake: FakeServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NOISESCOPE_DASHBOARD_URL", "http://dash.lab:8501")
    run = noisescope.init(project="p", task="t", transport=fake, quiet=False)
    assert capsys.readouterr().err.endswith(f"http://dash.lab:8501/run?run={run.id}\n")
    run.finish()


def test_run_link_is_printed_once_from_the_servers_answer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOISESCOPE_DASHBOARD_URL", raising=False)
    with ServerProcess(env={"NOISESCOPE_DASHBOARD_URL": "http://127.0.0.1:8501"}) as server:
        run = noisescope.init(server.url, project="p", task="t", name="lr3", quiet=False)
        link = f"http://127.0.0.1:8501/run?run={run.id}"
        assert wait_for(lambda: run.page_url is not None)
        assert run.page_url == link
        run.log_sample(0, 8, 64, 2.0, 1.0)
        run.finish()
    err = capsys.readouterr().err
    assert _link_lines(err)[0] == f"noisescope: run lr3 ({run.id[:8]}): {link}"
    assert len(_link_lines(err)) == 2  # that line, and the summary at finish
    assert _link_lines(err)[1].endswith(f"View it at {link}")


def test_quiet_prints_no_link(fake: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    fake.dashboard_url = "http://127.0.0.1:8501/run?run=r"
    run = noisescope.init(project="p", task="t", transport=fake, quiet=True)
    assert wait_for(lambda: run.page_url is not None)
    run2 = noisescope.init(
        project="p", task="t", transport=fake, dashboard_url="http://d", quiet=True
    )
    run.finish()
    run2.finish()
    assert capsys.readouterr().err == ""


def test_offline_and_disabled_runs_print_no_link(
    fake: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mode in ("offline", "disabled"):
        run = noisescope.init(
            project="p", task="t", mode=mode, dir=tmp_path, dashboard_url="http://d", quiet=False
        )
        run.finish()
        assert run.page_url is None
    assert "/run?run=" not in capsys.readouterr().err


@pytest.mark.parametrize("answer", ["javascript:alert(1)", "http://x/\x1b[2Jrun", 42, ""], ids=repr)
def test_a_servers_link_must_look_like_one(
    fake: FakeServer, answer: object, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.dashboard_url = answer  # type: ignore[assignment]
    run = noisescope.init(project="p", task="t", transport=fake, quiet=False)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    assert run.page_url is None
    assert run.status().sent == 1  # an odd answer changes nothing else
    assert "View it at" not in capsys.readouterr().err
