"""A sample or event the client accepted is delivered, spooled or counted as dropped with a
reason, and one bad record never costs the good ones (issue 46: bad samples in a batch, events
beyond the memory bound, a token revoked mid-run, run fields over the server's limits, secrets
in the URL). Against the server's app in this process, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import noisescope
from harness import AppServer
from noisescope import Request, Response, TransportError, protocol
from noisescope._delivery import _outbox
from noisescope._records import SampleRow
from tests.conftest import BACKENDS, app_on

API = protocol.API_PREFIX
ADMIN = "nothing-lost-admin"
GOOD = (8.0, 64.0, 2.0, 1.0)
#: One sample the server refuses, of each kind (issue 46, item 1): (b_small, b_big, g_small_sq,
#: g_big_sq, step, series).
BAD = {
    "equal batch sizes": (64.0, 64.0, 2.0, 1.0, None, ""),
    "zero b_small": (0.0, 64.0, 2.0, 1.0, None, ""),
    "negative norm": (8.0, 64.0, -1e-9, 1.0, None, ""),
    "long series": (*GOOD, None, "s" * 201),
    "NUL in series": (*GOOD, None, "a\x00b"),
    "step 2^63": (*GOOD, 2**63, ""),
    "norm 1e300": (8.0, 64.0, 1e300, 1.0, None, ""),
}


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppServer]:
    env = {"NOISESCOPE_ADMIN_TOKEN": ADMIN}
    with app_on(request.param, tmp_path_factory.mktemp("db"), auth="write", env=env) as app:
        yield app


def _token(server: AppServer, project: str) -> tuple[str, int]:
    made = server.make_token(project, ADMIN)
    return made["token"], made["id"]


def _init(server: AppServer, project: str, tmp_path: Path, **kwargs: Any) -> noisescope.Run:
    token = kwargs.pop("token", None) or _token(server, project)[0]
    return noisescope.init(
        url=server.url,
        project=project,
        token=token,
        dir=tmp_path,
        transport=kwargs.pop("transport", None) or server.transport(token),
        batch_interval=kwargs.pop("batch_interval", 0.05),
        quiet=True,
        **kwargs,
    )


def _stored(server: AppServer, run_id: str) -> int:
    return server.api().run(run_id).n_samples


def _log_with_one_bad(run: noisescope.Run, n: int, bad_at: int, bad: tuple[Any, ...]) -> None:
    for step in range(n):
        if step == bad_at:
            b_small, b_big, g_small_sq, g_big_sq, bad_step, series = bad
            at = step if bad_step is None else bad_step
            run.log_sample(at, b_small, b_big, g_small_sq, g_big_sq, series=series)
        else:
            run.log_sample(step, *GOOD)


@pytest.mark.parametrize("kind", list(BAD))
def test_one_bad_sample_costs_only_itself(
    server: AppServer, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = _init(server, "one-bad", tmp_path, batch_max=4000)
    _log_with_one_bad(run, 2000, 1000, BAD[kind])
    status = run.finish(timeout=30)
    assert (status.sent, status.dropped, status.spooled) == (1999, 1, 0), status
    assert _stored(server, run.id) == 1999
    assert "left out, the server would refuse them" in caplog.text


def test_the_server_names_every_refused_sample(server: AppServer) -> None:
    token, _ = _token(server, "named-rows")
    with server.client() as http:
        auth = {"Authorization": f"Bearer {token}"}
        made = http.put(
            f"{API}/runs/named", json={"project": "named-rows", "task": "t"}, headers=auth
        )
        assert made.status_code in (200, 201), made.text
        columns = {
            "seq": [0, 1, 2, 3],
            "step": [0, 1, 2, 3],
            "b_small": [8, 64, 8, 8],
            "b_big": [64, 64, 64, 64],
            "g_small_sq": [1.0, 1.0, -1.0, 1.0],
            "g_big_sq": [1.0, 1.0, 1.0, 1.0],
            "series": ["", "", "", "x" * 201],
        }
        refused = http.post(f"{API}/runs/named/samples", json={"columns": columns}, headers=auth)
    assert refused.status_code == 422
    # the message names the first problem found (checks run column by column), rows all three
    assert refused.json()["rows"] == [1, 2, 3] and "series" in refused.json()["detail"]


def test_samples_the_server_names_are_dropped_and_the_rest_sent(
    server: AppServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose own check misses a rule (an older client, a newer server): the 422's
    ``rows`` are counted dropped and the rest of the batch is sent at once."""

    def unchecked(
        rows: list[SampleRow], prefix: str = ""
    ) -> tuple[dict[str, list[Any]], list[str]]:
        columns = zip(protocol.SAMPLE_COLUMNS, zip(*rows, strict=True), strict=True)
        return {name: list(col) for name, col in columns}, []

    monkeypatch.setattr(_outbox, "rows_to_columns", unchecked)
    run = _init(server, "server-named", tmp_path, batch_max=500)
    _log_with_one_bad(run, 1000, 700, BAD["equal batch sizes"])
    status = run.finish(timeout=30)
    assert (status.sent, status.dropped) == (999, 1), status
    assert _stored(server, run.id) == 999


class RevocableToken:
    """The server's transport; the token it carries can be revoked from the test."""

    def __init__(self, server: AppServer, token: str) -> None:
        self.inner = server.transport(token)

    def handle_request(self, request: Request) -> Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_token_revoked_mid_run_spools_the_rest_for_sync(
    server: AppServer, tmp_path: Path
) -> None:
    token, token_id = _token(server, "revoked")
    run = _init(server, "revoked", tmp_path, token=token, batch_max=500)
    for step in range(2000):
        run.log_sample(step, *GOOD)
    assert run.flush(30)
    with server.client() as http:
        gone = http.delete(f"{API}/tokens/{token_id}", headers={"Authorization": f"Bearer {ADMIN}"})
    assert gone.status_code == 204
    for step in range(2000, 6000):
        run.log_sample(step, *GOOD)
    status = run.finish(timeout=30)
    assert (status.sent, status.spooled, status.dropped) == (2000, 4000, 0), status
    assert "--token <TOKEN>" in (run.status().last_error or "") or status.spooled
    fresh, _ = _token(server, "revoked")
    result = noisescope.sync(
        tmp_path, url=server.url, token=fresh, transport=server.transport(fresh)
    )
    assert result.synced == [run.id], result
    assert _stored(server, run.id) == 6000
    assert server.api().run(run.id).status == "finished"


class EventsDown:
    """The server's transport with events requests failing while ``down`` (an outage that
    only events see)."""

    def __init__(self, server: AppServer, token: str) -> None:
        self.inner = server.transport(token)
        self.down = True

    def handle_request(self, request: Request) -> Response:
        if self.down and request.path.endswith("/events"):
            raise TransportError("events unreachable (test)")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_events_beyond_the_memory_bound_are_spooled_or_counted(
    server: AppServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "noisescope")
    # 12,000 evaluations while events cannot be sent: beyond 10,000 they go to the spool,
    # and every one is stored once the server takes them
    token, _ = _token(server, "events")
    transport = EventsDown(server, token)
    run = _init(server, "events", tmp_path, token=token, transport=transport, backoff_max=0.2)
    run.log_sample(0, *GOOD)
    for step in range(12_000):
        run.log(step=step, eval_loss=1.0 / (step + 1))
    transport.down = False
    status = run.finish(timeout=60)
    assert status.dropped_events == 0, status
    assert len(server.api().events(run.id)) == 12_000
    # no spool (its folder cannot be made): the events beyond the bound are counted, and said
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    lost = _init(server, "events", blocker, token=token, transport=EventsDown(server, token))
    for step in range(12_000):
        lost.log_event(step, "batch_size", {"batch_size": 64})
    # beyond the bound while logging (the sender may hold a request's 1,000 meanwhile)
    assert 1_000 <= lost.status().dropped_events <= 2_000
    assert "dropping new events" in caplog.text
    # at finish, what never reached the server is counted too: every event, here
    assert lost.finish(timeout=0.5).dropped_events == 12_000


def test_one_bad_event_costs_only_itself(
    server: AppServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _init(server, "bad-events", tmp_path)
    run.log_sample(0, *GOOD)
    bad = [(-1, "mark", {}), (1, "k" * 65, {}), (2, "a\x00", {}), (3, "big", {"x": "x" * 300_000})]
    for step in range(2000):
        run.log_event(step, "mark", {"i": step})
        if step % 500 == 0:
            run.log_event(*bad[step // 500])
    status = run.finish(timeout=30)
    assert status.dropped_events == 4, status
    assert len(server.api().events(run.id)) == 2000
    assert "an event was not recorded" in caplog.text


class SlowSamples:
    """The server's transport, each samples request answered after 1 s: longer than half
    the batch interval, so the guard copies the batch to the spool meanwhile."""

    def __init__(self, server: AppServer, token: str) -> None:
        self.inner = server.transport(token)

    def handle_request(self, request: Request) -> Response:
        if request.path.endswith("/samples"):
            time.sleep(1.0)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("slow", [False, True], ids=["answered", "copied-by-the-guard"])
def test_a_run_id_used_again_counts_the_samples_the_server_ignores(
    server: AppServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, slow: bool
) -> None:
    """``init(run_id=...)`` of a run the server has numbers its samples from 0 again, and the
    server keeps the first sample of each (run, seq): the new ones are counted dropped and
    said, never reported as sent (also when a slow answer made the guard spool a copy)."""
    token, _ = _token(server, "again")
    run_id = f"used-twice-{slow}"
    first = _init(server, "again", tmp_path, token=token, run_id=run_id)
    for step in range(10):
        first.log_sample(step, *GOOD)
    assert first.finish(timeout=30).sent == 10
    # only the batch's own request, or the guard's copy of it: a batch the sender was too slow
    # to take (a loaded machine) goes to the spool first, and its replay cannot tell its
    # samples from re-sends of this session's own (docs/client.md)
    transport = SlowSamples(server, token) if slow else None
    second = _init(
        server, "again", tmp_path, token=token, run_id=run_id, transport=transport,
        batch_interval=0.4 if slow else 10.0,
    )  # fmt: skip
    for step in range(10, 25):
        second.log_sample(step, *GOOD)
    status = second.finish(timeout=30)
    assert (status.sent, status.dropped, status.spooled) == (5, 10, 0), status
    assert _stored(server, run_id) == 15
    assert "the run id was used before" in caplog.text


#: Run fields over the server's limits, and the words of init's refusal of each.
OVER_THE_LIMITS: dict[str, dict[str, Any]] = {
    "config is": {"config": {"weights": "x" * (1 << 20)}},
    "tags; the limit is 100": {"tags": [str(i) for i in range(10_000)]},
    "name is 201 characters": {"name": "n" * 201},
    "project is 201 characters": {"project": "p" * 201},
    "project must not be blank": {"project": "  "},
    "task must not contain NUL": {"task": "a\x00"},
}


def test_run_fields_the_server_would_refuse_are_refused_at_init(tmp_path: Path) -> None:
    for says, fields in OVER_THE_LIMITS.items():
        with pytest.raises(ValueError, match=says):
            noisescope.init(mode="offline", dir=tmp_path, **fields)
    assert not list(tmp_path.iterdir())  # nothing spooled that sync could not deliver


def test_the_server_refuses_what_init_refuses(server: AppServer) -> None:
    """init's rule (``_wire.run_fields_problem``) and the server's schema agree: each run
    init refuses, the server answers 422, and the same run within the limits it takes."""
    token, _ = _token(server, "limits")
    with server.client() as http:
        auth = {"Authorization": f"Bearer {token}"}
        for i, fields in enumerate(OVER_THE_LIMITS.values()):
            body = {"project": "limits", "task": "t", **fields}
            refused = http.put(f"{API}/runs/limits-{i}", json=body, headers=auth)
            assert refused.status_code in (401, 403, 422), (fields.keys(), refused.text)
            if "project" not in fields:
                assert refused.status_code == 422, (fields.keys(), refused.text)
        taken = http.put(
            f"{API}/runs/limits-ok",
            json={"project": "limits", "task": "t", "name": "n" * 200, "tags": ["x"] * 100},
            headers=auth,
        )
        assert taken.status_code in (200, 201), taken.text


def test_a_password_in_the_url_is_never_printed_or_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, "noisescope")
    run = noisescope.init(
        url="http://ada:hunter22@127.0.0.1:9", dir=tmp_path, quiet=False, flush_timeout=0.5
    )
    run.log_sample(0, *GOOD)
    run.finish(timeout=0.5)
    written = "".join(p.read_text() for p in tmp_path.rglob("run.json"))
    said = caplog.text + capsys.readouterr().err + (run.status().last_error or "")
    assert "127.0.0.1:9" in said and "ada:***@" in written
    assert "hunter22" not in said + written


@st.composite
def _batches(draw: st.DrawFn) -> tuple[int, int, str]:
    n = draw(st.integers(1, 300))
    return n, draw(st.integers(0, n - 1)), draw(st.sampled_from(sorted(BAD)))


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_batches(), batch_max=st.integers(1, 400))
def test_logged_is_stored_plus_counted_drops(
    server: AppServer, tmp_path_factory: pytest.TempPathFactory, case: Any, batch_max: int
) -> None:
    """One invalid record in batches of valid ones, through the client: every valid one is
    stored, the invalid one is counted, and the totals balance."""
    n, bad_at, kind = case
    run = _init(server, "balance", tmp_path_factory.mktemp("spool"), batch_max=batch_max)
    _log_with_one_bad(run, n, bad_at, BAD[kind])
    status = run.finish(timeout=30)
    assert _stored(server, run.id) == n - 1 == status.sent
    assert status.dropped == 1 and status.queued == status.spooled == 0


@settings(max_examples=300, deadline=None)
@given(
    step=st.one_of(st.integers(-1, 3), st.just(2**63 - 1), st.just(2**63)),
    b_small=st.sampled_from([0.0, -1.0, 1.0, 8.0, 64.0, 1e-300, 1e300]),
    b_big=st.sampled_from([1.0, 8.0, 64.0, 64.0000001, 1e300, math.inf]),
    g_sq=st.sampled_from([0.0, -1e-9, 1.0, 1e100, 1e290, 1e300, math.nan]),
    series=st.sampled_from(["", "a", "s" * 200, "s" * 201, "a\x00"]),
)
def test_the_client_and_server_rules_agree(
    step: int, b_small: float, b_big: float, g_sq: float, series: str
) -> None:
    """``protocol.sample_problem`` (the client's row check) refuses exactly the samples the
    server's column validation refuses."""
    from noisescope_server.errors import BadInput
    from noisescope_server.validate import validate_samples

    row = (0, step, None, b_small, b_big, g_sq, 1.0, None, None, None, series)
    columns = {name: [value] for name, value in zip(protocol.SAMPLE_COLUMNS, row, strict=True)}
    body = json.loads(json.dumps({"columns": columns}))  # the values as the wire has them
    try:
        validate_samples(body)
        refused = False
    except BadInput:
        refused = True
    assert (protocol.sample_problem(row) is not None) == refused, row


def test_a_clock_ahead_of_the_servers_is_said(
    server: AppServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server stores a started_at a day ahead as its own time and says so; the client
    passes that on, once."""
    from noisescope import _run

    monkeypatch.setattr(_run, "_now_iso", lambda: "2999-01-01T00:00:00+00:00")
    run = _init(server, "clock", tmp_path)
    run.log_sample(0, *GOOD)
    run.finish(timeout=30)
    assert "the server says: started_at 2999-01-01" in caplog.text
    started = server.api().run(run.id).started_at
    assert started is not None and started.year < 2999
