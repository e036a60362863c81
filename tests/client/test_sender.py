"""Batching, compression, retries/backoff, 4xx handling, spill to disk and bounded waits."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest

import noisescope
from noisescope import TransportError
from noisescope._retry import Backoff, classify, parse_retry_after
from noisescope._transport import Response
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.waiting import wait_for


def make_run(fake: FakeServer, **kwargs: object) -> noisescope.Run:
    options: dict[str, object] = {
        "project": "p",
        "transport": fake,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "flush_timeout": 10.0,
    }
    options.update(kwargs)
    return noisescope.init(**options)  # type: ignore[arg-type]


def log_steps(run: noisescope.Run, n: int, start: int = 0) -> None:
    for step in range(start, start + n):
        run.log_sample(step, 8, 64, 2.0 + step, 1.0)


def assert_exactly_once(fake: FakeServer, run: noisescope.Run, n: int) -> None:
    rows = fake.rows(run.id)
    assert [r["seq"] for r in rows] == list(range(n))
    assert [r["g_small_sq"] for r in rows] == [2.0 + s for s in range(n)]


def test_batches_by_count(fake: FakeServer) -> None:
    run = make_run(fake, batch_max=100, batch_interval=30.0)
    log_steps(run, 1001)
    run.log(step=1001)
    assert wait_for(lambda: len(fake.rows(run.id)) >= 1000)
    run.finish()
    assert max(fake.batch_sizes) == 100
    assert sum(fake.batch_sizes) == 1001
    assert_exactly_once(fake, run, 1001)


def test_batches_by_time(fake: FakeServer) -> None:
    run = make_run(fake, batch_max=10_000, batch_interval=0.05)
    log_steps(run, 5)
    run.log(step=5)
    # Far fewer than batch_max and no flush: only the timer can send them.
    assert wait_for(lambda: len(fake.rows(run.id)) == 5)
    run.finish()


def test_large_bodies_are_gzipped(fake: FakeServer) -> None:
    run = make_run(fake, url="http://ingest.example:8765", gzip_min_bytes=1024)
    log_steps(run, 500)
    run.finish()
    posts = fake.sample_posts()
    assert posts
    big = [p for p in posts if p.headers.get("Content-Encoding") == "gzip"]
    assert big
    body = json.loads(gzip.decompress(big[0].body or b""))
    assert set(body["columns"]) >= {"seq", "step", "b_small", "g_big_sq", "series"}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"])
def test_bodies_to_this_machine_are_not_compressed(fake: FakeServer, host: str) -> None:
    """On loopback gzip costs the client (and the server) CPU and saves nothing."""
    run = make_run(fake, url=f"http://{host}:8765", gzip_min_bytes=1024)
    log_steps(run, 500)
    run.finish()
    posts = fake.sample_posts()
    assert posts and all("Content-Encoding" not in p.headers for p in posts)
    assert sum(len(json.loads(p.body or b"")["columns"]["seq"]) for p in posts) == 500


def test_backoff_grows_exponentially_with_jitter_and_honours_retry_after() -> None:
    backoff = Backoff(base=1.0, cap=8.0, rng=random.Random(0))
    delays = [backoff.next_delay() for _ in range(6)]
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)  # jittered, not lock step
    assert backoff.next_delay(retry_after=20.0) == 20.0
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_retry_after_parsing_and_classification() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert [classify(Response(s)) for s in (200, 201, 429, 500, 503, 408, 404, 422, 400)] == [
        "ok", "ok", "retry", "retry", "retry", "retry", "missing", "fatal", "fatal",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "faults",
    [
        [TransportError("refused")] * 4,
        [500, 502, 503],
        [(429, {"Retry-After": "0"})] * 3,
        [RuntimeError("a transport bug")],
    ],
    ids=["connection", "5xx", "429", "transport-bug"],
)
def test_retryable_failures_lose_nothing(fake: FakeServer, faults: list[object]) -> None:
    run = make_run(fake, batch_max=20)
    fake.faults = list(faults)  # type: ignore[arg-type]
    log_steps(run, 200)
    status = run.finish()
    assert_exactly_once(fake, run, 200)
    assert (status.sent >= 200, status.spooled, status.dropped) == (True, 0, 0)


def test_429_retry_after_is_waited_for(fake: FakeServer) -> None:
    run = make_run(fake, backoff_max=0.01)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    fake.faults = [(429, {"Retry-After": "0.3"})]
    run.flush()
    times = [t for t, r in fake.requests]
    gap = max(b - a for a, b in itertools.pairwise(times))
    assert gap >= 0.3  # the client waited at least what the server asked for
    run.finish()
    assert len(fake.rows(run.id)) == 1


def test_4xx_is_not_retried_and_logged_once(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    run = make_run(fake, batch_max=10)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.flush()  # run exists
    fake.faults = [422, 422]
    caplog.set_level(logging.WARNING, logger="noisescope")
    log_steps(run, 20, start=1)
    status = run.finish()
    posts_after_faults = len(fake.sample_posts())
    assert status.dropped == 20  # two rejected batches of 10, not retried
    assert posts_after_faults == 3  # 1 ok + 2 rejected, no retries
    messages = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(messages) == 1
    assert "fault 422" in messages[0]  # the server's own message


def test_unknown_run_is_created_again(fake: FakeServer) -> None:
    run = make_run(fake)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.flush()
    with fake.lock:
        del fake.runs[run.id]  # the server lost the run (database reset)
        del fake.samples[run.id]
    log_steps(run, 5, start=1)
    run.finish()
    assert len(fake.rows(run.id)) == 5  # steps 1..5 (step 0 was lost with the server's db)


def test_outage_spools_to_disk_and_replays_when_server_returns(
    fake: FakeServer, tmp_path: Path
) -> None:
    run = make_run(fake, batch_max=50, batch_interval=0.01, dir=tmp_path)
    fake.down = True
    log_steps(run, 500)
    run.log(step=500)
    assert wait_for(lambda: run.status().spooled == 500)
    assert run.status().queued == 0  # memory is free during the outage
    assert list((tmp_path / run.id).glob("seg-*.jsonl"))
    fake.down = False
    assert wait_for(lambda: run.status().sent >= 500)
    status = run.finish()
    assert_exactly_once(fake, run, 500)
    assert status.spooled == 0
    assert not (tmp_path / run.id).exists()  # fully delivered: spool dir removed


def test_memory_stays_bounded_when_the_server_is_slow(fake: FakeServer, tmp_path: Path) -> None:
    run = make_run(fake, batch_max=100, memory_max=1000, dir=tmp_path)
    fake.delay = 0.05
    outbox = run._sender.outbox  # type: ignore[union-attr]
    high_water = 0
    for step in range(5000):
        run.log_sample(step, 8, 64, 2.0 + step, 1.0)
        high_water = max(high_water, len(outbox))
    fake.delay = 0.0
    status = run.finish()
    assert high_water <= 1000
    assert status.dropped + len(fake.rows(run.id)) == 5000
    assert status.dropped == outbox.overflow  # only the hard in-memory bound ever drops


def test_disk_limit_keeps_oldest_and_counts_newer_as_dropped(tmp_path: Path) -> None:
    run = noisescope.init(
        project="p", mode="offline", dir=tmp_path, batch_max=100, spool_max_bytes=30_000
    )
    for step in range(2000):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    status = run.finish()
    assert status.dropped > 0
    assert status.spooled + status.dropped == 2000
    spool = noisescope._spool.RunSpool(tmp_path, run.id)
    seqs = [
        s for path in spool.seal() for record in spool.read(path) for s in record["columns"]["seq"]
    ]
    assert seqs == list(range(status.spooled))  # the oldest are kept


def test_finish_waits_a_bounded_time_then_spools(fake: FakeServer, tmp_path: Path) -> None:
    # The first retry is an hour away: a finish that waited for it would not return (the
    # suite's timeout fails it), one bounded by flush_timeout (0.3 s) returns and spools.
    run = make_run(fake, dir=tmp_path, flush_timeout=0.3, backoff_base=3600.0, backoff_max=3600.0)
    fake.down = True
    log_steps(run, 100)
    status = run.finish()
    assert (status.spooled, status.dropped, status.queued) == (100, 0, 0)
    end = noisescope._spool.RunSpool(tmp_path, run.id).read_end()
    assert end is not None and end["status"] == "finished"  # sync will deliver the end too


def test_finish_prints_one_line_with_the_sync_command(
    fake: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(fake, dir=tmp_path, flush_timeout=0.2, quiet=False)
    fake.down = True
    log_steps(run, 3)
    run.finish()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("noise")]
    assert len(lines) == 1
    assert "spooled 3" in lines[0]
    assert f"noisescope sync {tmp_path}" in lines[0]


def test_refused_run_is_kept_in_the_spool(fake: FakeServer, tmp_path: Path) -> None:
    fake.faults = [(401, {})]
    run = make_run(fake, dir=tmp_path)
    log_steps(run, 10)
    status = run.finish()
    assert (status.spooled, status.dropped) == (10, 0)
    assert "401" in (status.last_error or "")
    puts = [r for _, r in fake.requests if r.method == "PUT"]
    assert len(puts) == 1  # not retried


def test_spool_replay_merges_batches_into_few_requests(fake: FakeServer, tmp_path: Path) -> None:
    run = make_run(fake, batch_max=10, batch_interval=0.01, dir=tmp_path)
    fake.down = True
    log_steps(run, 3000)
    run.log(step=3000)
    assert wait_for(lambda: run.status().spooled == 3000)
    posts_before = len(fake.sample_posts())
    fake.down = False
    status = run.finish()
    assert_exactly_once(fake, run, 3000)
    assert status.sent == 3000
    # 300 spooled batches of 10 replay in requests of up to 5000 samples
    assert len(fake.sample_posts()) - posts_before <= 3


@pytest.mark.parametrize("with_orjson", [True, False])
def test_both_encoders_write_the_same_values(
    monkeypatch: pytest.MonkeyPatch, with_orjson: bool
) -> None:
    """orjson (when installed) and the standard library encode the same numbers; integers
    orjson refuses (beyond 64 bits) take the standard path."""
    from noisescope import _json, _request

    if not with_orjson:
        monkeypatch.setattr(_json, "orjson", None)
    columns: dict[str, list[Any]] = {
        "seq": [0, 1, 2**70],
        "g_small_sq": [0.1, 1e-300, 1.7646e9 + 0.123456],
        "loss": [None, 2.5, 1e22],
        "series": ["", "é/x", '"q"'],
    }
    decoded = json.loads(_request.encode_columns(columns))
    assert decoded == {"columns": columns}
    request = _request.build_request("POST", "/p", {"columns": columns}, gzip_min_bytes=1)
    assert request.headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(request.body or b"")) == {"columns": columns}


def test_columns_with_fields_never_logged_are_nulls() -> None:
    """examples/lr not logged at all (the common case) stay null on the fast path; a batch
    that mixes logged and unlogged values, or a non-finite loss, gives the same columns."""
    from noisescope._records import SampleRow, new_sample, rows_to_columns

    def row(seq: int, examples: float | None, loss: float) -> SampleRow:
        return new_sample((seq, seq, examples, 8.0, 64.0, 2.0, 1.0, loss, None, 0.5, "s"))

    plain, invalid = rows_to_columns([row(0, None, 1.0), row(1, None, 2.0)], "rank1")
    assert invalid == []
    assert plain["examples"] == [None, None] and plain["lr"] == [None, None]
    assert plain["series"] == ["rank1/s", "rank1/s"]
    mixed, _ = rows_to_columns([row(0, None, float("nan")), row(1, 64.0, 2.0)])
    assert mixed["examples"] == [None, 64.0] and mixed["loss"] == [None, 2.0]
    # a loss beyond what the server sums, or negative examples (outside
    # noisescope._wire.SAMPLE_RANGES), travel as null too, so the server keeps the batch
    huge, invalid = rows_to_columns([row(0, 1e200, 1e300), row(1, -1.0, 2.0)])
    assert invalid == [] and huge["loss"] == [None, 2.0] and huge["examples"] == [1e200, None]


def test_a_batch_in_flight_at_finish_is_counted_once(fake: FakeServer, tmp_path: Path) -> None:
    """finish() gives up while a request is on the wire: its batch, copied to the spool, is
    counted spooled, not also queued (nor sent when the answer comes after all)."""
    answer = threading.Event()

    def hold_samples(request: noisescope.Request) -> None:
        if request.path.endswith("/samples"):
            answer.wait(10)

    fake.on_request = hold_samples
    run = make_run(fake, dir=tmp_path, flush_timeout=0.2, batch_interval=30.0, batch_max=100)
    log_steps(run, 101)
    status = run.finish()
    assert (status.sent, status.queued, status.spooled) == (0, 0, 101), status
    answer.set()
    assert wait_for(lambda: len(fake.rows(run.id)) == 100)
    assert wait_for(lambda: not run._sender.alive)  # type: ignore[union-attr]
    after = run.status()
    assert after.sent + after.queued + after.spooled + after.dropped == 101, after
