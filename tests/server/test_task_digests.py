"""The task list and the run list read a quiet run's current window from its stored digest
(``crud.refresh_digests``, every few seconds in a server) and give the same answers as reading
every window from the samples: on a database of live runs, compacted ones, runs that got
samples after their digest was stored, a compacted run with a late sample and runs without
whole-model samples, on SQLite and PostgreSQL. Beyond ``STALE_READ_LIMIT`` lagging runs the
task list takes their digests as they are and says how many (``n_behind``)."""

from __future__ import annotations

import statistics
import zlib
from typing import Any
from unittest import mock

import pytest
from sqlalchemy import Engine, delete, select

from harness.payloads import columns
from noisescope_server import crud, db, queries
from noisescope_server.crud import _digests
from noisescope_server.models import Run, RunDigest
from noisescope_server.queries import _runs, _tasks
from noisescope_server.queries._current import read_current


@pytest.fixture
def engine(db_url: str) -> Engine:
    e = db.make_engine(db_url)
    db.upgrade(e)
    return e


def _add(engine: Engine, uid: str, n: int, *, start: int = 0, series: str = "", **kw: Any) -> None:
    cols = columns(n, start=start, seed=zlib.crc32(uid.encode()) % 1000, series=series, **kw)
    crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))


def _run(engine: Engine, uid: str, task: str, n: int, **kw: Any) -> None:
    crud.upsert_run(engine, uid, crud.RunIn(project="p", task=task, batch_size=32))
    if n:
        _add(engine, uid, n, **kw)


def _run_id(engine: Engine, uid: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(Run.id).where(Run.uid == uid)).scalar_one())


def _team(engine: Engine) -> None:
    """Runs of every kind in three tasks; then digests stored, then some runs get samples."""
    sizes = [0, 30, 64, 90, 200, 640, 1300]
    for i, n in enumerate(sizes * 2):
        # small batches and a wide spread of noise: windows narrow, wide and unmeasurable
        _run(engine, f"run{i}", f"task{i % 3}", n, b_small=2.0 + i, b_big=4.0 + 3 * i)
    _run(engine, "layers-only", "task0", 0)
    _add(engine, "layers-only", 300, series="layer.0")
    _run(engine, "archived", "task1", 200)
    crud.patch_run(engine, "archived", archived=True)
    for uid in ("run5", "run6", "run12"):
        crud.patch_run(engine, uid, status="finished")
        crud.compact_run(engine, _run_id(engine, uid))
    assert crud.refresh_digests(engine) > 0
    # after the digests: live runs log more, a compacted run gets a late sample
    _add(engine, "run4", 50, start=200)
    _add(engine, "run11", 700, start=200)
    _add(engine, "run3", 1, start=90)
    _add(engine, "run12", 1, start=5000)
    _add(engine, "layers-only", 10, start=300, series="layer.0")


def _stale(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return queries.stale_digests(conn)


def _direct(engine: Engine) -> list[Any]:
    """The task list computed here from every run's window read from its samples."""
    runs = queries.list_runs(engine, limit=1_000_000, current=False)
    groups: dict[tuple[str, str], list[tuple[int, float | None]]] = {}
    with engine.connect() as conn:
        for r in runs:
            run_id = _run_id(engine, r.uid)
            n = queries.sample_counts(conn, [run_id]).get(run_id, (0, 0))[0]
            b = read_current(conn, run_id, n)["b_simple"] if n else None
            groups.setdefault((r.project, r.task), []).append((n, b))
    out = []
    for key, members in sorted(groups.items()):
        bs = [b for _, b in members if b is not None]
        median = statistics.median(bs) if bs else None
        out.append((*key, len(members), sum(n for n, _ in members), len(bs), median, bs))
    return out


def _digest_answers(engine: Engine) -> list[Any]:
    return [
        (t.project, t.task, t.n_runs, t.n_samples, t.n_measured, t.b_simple_median,
         [t.b_simple_min, t.b_simple_max])
        for t in queries.task_summaries(engine)
    ]  # fmt: skip


def _reads() -> Any:
    """Both homes of ``read_current`` the lists call, watched."""
    watched = mock.Mock(wraps=read_current)
    return (
        mock.patch.multiple(_runs, read_current=watched),
        mock.patch.multiple(_tasks, read_current=watched),
        watched,
    )


def test_the_task_list_from_digests_is_the_direct_one(engine: Engine) -> None:
    _team(engine)
    assert {_run_id(engine, u) for u in ("run4", "run11", "run3", "run12", "layers-only")} == set(
        _stale(engine)
    )
    fast = _digest_answers(engine)
    direct = _direct(engine)
    assert [row[:6] for row in fast] == [row[:6] for row in direct]
    for row, truth in zip(fast, direct, strict=True):
        assert row[6] == ([min(truth[6]), max(truth[6])] if truth[6] else [None, None])
    assert any(row[4] for row in fast) and any(row[4] < row[2] for row in fast)
    assert all(t.n_behind == 0 for t in queries.task_summaries(engine))
    lists = (queries.list_runs(engine, archived="include"), queries.get_run(engine, "run12"))
    with engine.begin() as conn:  # no digest at all: every window read from the samples
        conn.execute(delete(RunDigest))
    assert _digest_answers(engine) == fast
    assert (queries.list_runs(engine, archived="include"), queries.get_run(engine, "run12")) == (
        lists
    )


def test_quiet_runs_are_read_from_their_digests(engine: Engine) -> None:
    """Only the runs that got whole-model samples since the last refresh are read sample by
    sample (one with only per-layer samples since has the same window)."""
    _team(engine)
    in_runs, in_tasks, read = _reads()
    with in_runs, in_tasks:
        queries.task_summaries(engine)
    read_ids = {c.args[1] for c in read.call_args_list}
    assert read_ids == {_run_id(engine, u) for u in ("run4", "run11", "run3", "run12")}
    assert crud.refresh_digests(engine) == 5
    assert _stale(engine) == []
    in_runs, in_tasks, read = _reads()
    with in_runs, in_tasks:
        queries.task_summaries(engine)
        queries.list_runs(engine)
    assert read.call_count == 0


def test_beyond_the_read_limit_lagging_runs_are_taken_from_their_digests_and_counted(
    engine: Engine,
) -> None:
    """With one window to read, the run farthest behind (run11, 700 samples) is read; run3 and
    run12 (one sample behind) answer from their digests, run4 (its digest gone) is unmeasured:
    each counted behind in its task, the other tasks' answers exact."""
    _team(engine)
    with engine.begin() as conn:
        conn.execute(delete(RunDigest).where(RunDigest.run_id == _run_id(engine, "run4")))
        stored = {
            int(r): _runs.stored_current(str(c))
            for r, c in conn.execute(select(RunDigest.run_id, RunDigest.current))
        }
    in_runs, in_tasks, read = _reads()
    with in_runs, in_tasks, mock.patch.object(_tasks, "STALE_READ_LIMIT", 1):
        lagged = queries.task_summaries(engine)
    assert {c.args[1] for c in read.call_args_list} == {_run_id(engine, "run11")}
    by_task = {t.task: t for t in lagged}
    assert {k: t.n_behind for k, t in by_task.items()} == {"task0": 2, "task1": 1, "task2": 0}
    # run4 has no digest: not read at all, told apart from the runs answering from theirs
    assert {k: t.n_unread for k, t in by_task.items()} == {"task0": 0, "task1": 1, "task2": 0}
    # the answers expected: the direct ones with run3 and run12 as digested, run4 unmeasured
    values: dict[str, list[float]] = {}
    for r in queries.list_runs(engine, limit=1_000_000, archived="exclude"):
        b = r.b_simple
        if r.uid in ("run3", "run12"):
            fields = stored[_run_id(engine, r.uid)]
            assert fields is not None
            b = fields["b_simple"]
        if r.uid == "run4":
            b = None
        if b is not None:
            values.setdefault(r.task, []).append(b)
    exact = {t.task: t for t in queries.task_summaries(engine)}
    for task, t in by_task.items():
        found = values.get(task, [])
        assert t.n_measured == len(found)
        assert t.b_simple_median == (statistics.median(found) if found else None)
        assert (t.n_runs, t.n_samples) == (exact[task].n_runs, exact[task].n_samples)
    assert by_task["task2"] == exact["task2"]
    assert exact["task0"].n_behind == exact["task1"].n_behind == 0
    assert exact["task0"].n_unread == exact["task1"].n_unread == 0


def test_a_digest_is_never_stored_over_one_read_at_larger_counts(engine: Engine) -> None:
    """Two workers storing one run's digest at once: the one read at fewer samples loses."""
    _run(engine, "raced", "t", 200)
    run_id = _run_id(engine, "raced")
    with engine.connect() as conn:
        older = queries.run_digests(conn, [run_id])
    _add(engine, "raced", 100, start=200)
    assert crud.refresh_digests(engine) == 1
    with engine.begin() as conn:
        _digests._upsert(conn, older)  # the slower worker's, read before the last samples
    assert _stale(engine) == []
    with engine.connect() as conn:
        assert conn.execute(select(RunDigest.n_samples)).scalar_one() == 300


def test_a_digest_read_while_a_sample_came_is_not_stored(engine: Engine) -> None:
    """Counts only grow: a run whose counts changed while its digest was read is left stale."""
    _run(engine, "busy", "t", 200)
    _run(engine, "quiet", "t", 200)
    real = queries.run_digests

    def read_then_log(conn: Any, run_ids: Any) -> Any:
        found = real(conn, run_ids)
        _add(engine, "busy", 10, start=200)
        return found

    with mock.patch.object(queries, "run_digests", read_then_log):
        assert crud.refresh_digests(engine) == 1
    assert _stale(engine) == [_run_id(engine, "busy")]
    assert crud.refresh_digests(engine) == 1
    assert queries.get_run(engine, "busy").n_samples == 210


def test_a_started_server_stores_the_digests_it_finds_stale_within_seconds(
    engine: Engine, db_url: str
) -> None:
    """A server started on runs that got samples since their digests were stored (a restart)
    stores them within seconds, not a whole ``compact_every`` (60 s) later, and again for a
    run that logs while it runs: the digest keeper looks every ``DIGEST_EVERY`` seconds."""
    import time

    from harness import ServerProcess

    _team(engine)
    assert _stale(engine)
    with ServerProcess(db_url):
        # half of compact_every (60 s): a first round only after a whole one fails here
        deadline = time.monotonic() + 30.0
        while _stale(engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _stale(engine) == []
        _add(engine, "run4", 20, start=250)
        assert _stale(engine) == [_run_id(engine, "run4")]
        deadline = time.monotonic() + 30.0
        while _stale(engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _stale(engine) == []


def test_the_docs_give_the_keepers_cadence_and_the_read_limit() -> None:
    from pathlib import Path

    from noisescope_server.compactor import DIGEST_EVERY

    root = Path(__file__).resolve().parents[2] / "docs"
    for name in ("api.md", "deployment.md"):
        text = (root / name).read_text()
        assert f"every {DIGEST_EVERY:g} s" in " ".join(text.split())
        assert f"most {queries.STALE_READ_LIMIT} " in " ".join(text.split())


def test_one_workers_keeper_looks_at_a_time(engine: Engine) -> None:
    """Of several workers on one database, one keeper reads the stale windows; the others
    skip their look (each would read them all again), and look again once it is done."""
    from noisescope_server.compactor import Compactor

    _team(engine)
    first, second = (
        Compactor(engine, every=60.0, finished_after=1e9, quiet_after=1e9) for _ in range(2)
    )
    with db.try_exclusive(engine, "digests") as mine:  # another worker's keeper, looking
        assert mine
        assert second.keep_digests() is None
        assert _stale(engine)
    assert first.keep_digests() == 5
    assert _stale(engine) == []


def test_a_keeper_that_cannot_store_says_so_once_and_again_when_it_can(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A database outage fails every look; the log says so once, not every 2 s of it."""
    import logging
    import time

    from noisescope_server import compactor as module

    looks: list[float] = []

    def look(self: module.Compactor, touched_since: object = None) -> int:
        looks.append(time.monotonic())
        if len(looks) <= 5:
            raise RuntimeError("database unreachable")
        return 0

    keeper = module.Compactor(engine, every=0.02, finished_after=1e9, quiet_after=1e9)
    with (
        mock.patch.object(module, "DIGEST_EVERY", 0.02),
        mock.patch.object(module.Compactor, "keep_digests", look),
        caplog.at_level(logging.INFO, logger="noisescope_server"),
    ):
        keeper.start()
        deadline = time.monotonic() + 30
        while len(looks) < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        keeper.stop()
    digests = [r for r in caplog.records if "run digests" in r.getMessage()]
    assert len(looks) >= 7
    assert [r.getMessage() for r in digests] == [
        "storing run digests failed; retrying until it works",
        "storing run digests works again",
    ]


def test_a_look_since_a_time_reads_only_the_runs_written_to_since(engine: Engine) -> None:
    """The keeper's looks between its whole ones read the counts of the runs an ingest
    touched since (the others' blocks are not read): a stale run untouched for an hour waits
    for the whole look, which stores it."""
    from datetime import timedelta

    from sqlalchemy import update

    from noisescope_server.compactor import Compactor
    from noisescope_server.utc import utcnow

    _team(engine)
    with engine.begin() as conn:
        idle = utcnow() - timedelta(hours=1)
        conn.execute(update(Run).where(Run.uid == "run4").values(last_seen_at=idle))
    keeper = Compactor(engine, every=60.0, finished_after=1e9, quiet_after=1e9)
    assert keeper.keep_digests(utcnow() - timedelta(minutes=1)) == 4
    assert _stale(engine) == [_run_id(engine, "run4")]
    assert keeper.keep_digests() == 1
    assert _stale(engine) == []
