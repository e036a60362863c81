"""Nothing lost without a count (issue 46), against real server processes: every sample or
event the client accepted is stored, spooled, or dropped and counted, whatever goes wrong.

Data classes (run on each backend, the client in this process, on an ``--auth write``
server): one bad sample among good ones (item 1), evaluations in bulk with the server up and
during an events-only outage (item 2), a token revoked mid-run (item 3). Process classes (the
client's own behaviour, run once on SQLite): runs in multiprocessing children (item 4), a
process ended by a signal, an exception or Ctrl-C (item 5, ``reliability._ending`` in its own
process), run fields over the server's limits (item 8), a password in the server URL (item 10,
the client's part): those in ``reliability._round3_process``. Each case is a ``Row`` whose
figures the report prints and whose ``held`` says whether the class holds at that size.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

import noisescope
from noisescope import HTTPTransport, Request, Response, TransportError, protocol
from noisescope._delivery._outbox import EVENTS_MAX
from noisescope._spool import decode_records
from reliability._client import B_BIG, B_SMALL, sample_values
from reliability._infra import (
    Server,
    database,
    engine_for,
    spooled_seqs,
    sync_spool,
)
from reliability._reconcile import check_run, stored_seqs

API = protocol.API_PREFIX
ADMIN = "round3-admin"
SEED = 46
#: One sample the server refuses, of each kind of issue 46 item 1: what replaces the good
#: sample's fields.
BAD: dict[str, dict[str, Any]] = {
    "b_small == b_big": {"b_small": B_BIG},
    "b_small 0": {"b_small": 0.0},
    "g_small_sq -1e-9": {"g_small_sq": -1e-9},
    "201-character series": {"series": "s" * 201},
    "NUL in series": {"series": "a\x00b"},
    "step 2^63": {"step": 2**63},
    "norm 1e300": {"g_small_sq": 1e300},
}


@dataclass(frozen=True)
class Round3Sizes:
    """Bigger than the tests' (tests/client/test_nothing_lost.py), small enough for minutes."""

    #: Samples of each run of items 1, 4, 5 (exception, Ctrl-C) and 10; item 3's token is
    #: revoked after this many, of three times as many.
    samples: int = 20_000
    #: Evaluations of each run of item 2.
    events: int = 50_000
    #: Item 5: how long the loop logs before the signal.
    signal_after_s: float = 4.0

    @property
    def revoke_samples(self) -> int:
        return 3 * self.samples


@dataclass
class Row:
    """One case: what the client logged and where it all ended up."""

    item: int
    case: str
    logged: str
    stored: int | None
    spooled: int | None
    dropped: int | None
    status: str
    held: bool
    note: str = ""

    def cells(self) -> dict[str, str]:
        def n(value: int | None) -> str:
            return "—" if value is None else f"{value:,}"

        return {
            "item": str(self.item),
            "case": self.case,
            "logged": self.logged,
            "stored": n(self.stored),
            "spooled": n(self.spooled),
            "dropped (counted)": n(self.dropped),
            "status": self.status,
            "held": "yes" if self.held else "**NO**",
            "note": self.note.replace("\n", " ")[:200],
        }


class Said(logging.Handler):
    """The client's log messages while a case runs (a warning is said once, or it is noise)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, needle: str) -> int:
        return sum(needle in m for m in self.messages)

    def __enter__(self) -> Said:
        logging.getLogger("noisescope").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("noisescope").removeHandler(self)


@contextlib.contextmanager
def write_auth_server(backend: str, workdir: Path) -> Iterator[Server]:
    """``--auth write`` with an admin token: projects' tokens are made and revoked over HTTP."""
    env = {"NOISESCOPE_ADMIN_TOKEN": ADMIN}
    with database(backend, workdir) as url, Server(url, auth="write", env=env) as srv:
        yield srv


def make_token(server: Server, project: str) -> tuple[str, int]:
    """A new token of ``project`` (made by the admin token): its secret and its id."""
    made = httpx.post(
        f"{server.url}{API}/projects/{project}/tokens",
        json={"name": "round3"},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    made.raise_for_status()
    return str(made.json()["token"]), int(made.json()["id"])


def run_status(server: Server, run_id: str) -> str:
    """The run's status as every reader sees it (computed by the server at read time)."""
    try:
        return server.api().run(run_id).status
    except noisescope.ApiError as exc:
        return f"unreadable: {exc}"[:80]


def _good(step: int) -> dict[str, Any]:
    g_small_sq, g_big_sq, loss = sample_values(SEED, step)
    return {"step": step, "b_small": B_SMALL, "b_big": B_BIG, "g_small_sq": g_small_sq,
            "g_big_sq": g_big_sq, "loss": loss, "series": ""}  # fmt: skip


def _log_sample(run: noisescope.Run, fields: dict[str, Any]) -> None:
    run.log_sample(
        fields["step"], fields["b_small"], fields["b_big"], fields["g_small_sq"],
        fields["g_big_sq"], loss=fields["loss"], series=fields["series"],
    )  # fmt: skip


# -- item 1: one bad sample -------------------------------------------------------------------


def one_bad_sample(server: Server, workdir: Path, samples: int) -> list[Row]:
    """Per kind, one run of ``samples`` with the middle one bad: the others are all stored
    with their values, the bad one is counted dropped, and the client says so once."""
    token, _ = make_token(server, "one-bad")
    engine = engine_for(server.database_url)
    rows: list[Row] = []
    bad_at = samples // 2
    try:
        for i, (kind, bad) in enumerate(BAD.items()):
            with Said() as said:
                run = noisescope.init(
                    url=server.url, token=token, project="one-bad", task="t", name=kind,
                    batch_size=B_BIG, dir=workdir / f"one-bad-{i}", quiet=True,
                )  # fmt: skip
                for step in range(samples):
                    _log_sample(run, _good(step) | bad if step == bad_at else _good(step))
                status = run.finish(timeout=120)
            check = check_run(engine, run.id, SEED, samples)
            said_once = said.count("left out, the server would refuse them") == 1
            held = (
                (status.sent, status.spooled, status.dropped, status.queued)
                == (samples - 1, 0, 1, 0)
                and check.stored == check.distinct == samples - 1
                and check.missing == 1
                and check.values_ok
                and said_once
            )
            note = f"values {'match' if check.values_ok else 'DIFFER'}; said once: "
            note += "yes" if said_once else f"NO ({said.count('left out')} times)"
            rows.append(Row(1, f"one bad of {samples:,}: {kind}", f"{samples:,} samples",
                            check.stored, status.spooled, status.dropped,
                            run_status(server, run.id), held, note))  # fmt: skip
    finally:
        engine.dispose()
    return rows


# -- item 2: evaluations in bulk --------------------------------------------------------------


class EventsOutage:
    """The client's ``HTTPTransport`` with events requests failing while ``down``: an outage
    only events see (samples keep going)."""

    def __init__(self, url: str, token: str) -> None:
        self.inner = HTTPTransport(url, token)
        self.down = False

    def handle_request(self, request: Request) -> Response:
        if self.down and request.path.endswith("/events"):
            raise TransportError("events unreachable (reliability round 3)")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def spooled_events(run_dir: Path) -> int:
    """Events in a run folder's spool segments (CRC-valid records only, as a replay reads)."""
    total = 0
    for path in sorted(run_dir.glob("seg-*.jsonl")):
        with contextlib.suppress(OSError):  # a segment delivered and deleted meanwhile
            total += sum(len(r.get("events", [])) for r in decode_records(path.read_bytes()))
    return total


def settled(read: Callable[[], int], timeout: float = 30.0) -> int:
    """``read()`` once it gave the same figure twice 0.5 s apart (an outage's sender moves
    what waits in memory to the spool between its retries)."""
    deadline = time.monotonic() + timeout
    last = read()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = read()
        if now == last:
            return now
        last = now
    return last


def stored_events(engine: Any, run_id: str) -> tuple[int, int]:
    """(eval events stored, distinct steps among them) of a run."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT e.step) FROM event e JOIN run r "
                "ON r.id = e.run_id WHERE r.uid = :uid AND e.kind = 'eval'"
            ),
            {"uid": run_id},
        ).one()
    return int(row[0]), int(row[1])


def eval_events(server: Server, workdir: Path, events: int) -> list[Row]:
    """``events`` evaluations (``run.log(step=s, eval_loss=...)``, as fast as the client takes
    them): with the server up; during an events-only outage that ends before finish (beyond
    EVENTS_MAX in memory they go to the spool); and the same without a usable spool (beyond
    EVENTS_MAX they are counted in ``status().dropped_events`` and said once)."""
    token, _ = make_token(server, "evals")
    blocker = workdir / "not-a-folder"
    blocker.write_text("")  # a spool root under a file cannot be made
    cases = [
        ("server up", workdir / "evals-up", False),
        ("events-only outage, then up", workdir / "evals-outage", True),
        ("events-only outage, no spool", blocker / "spool", True),
    ]
    engine = engine_for(server.database_url)
    rows: list[Row] = []
    try:
        for label, spool, down in cases:
            transport = EventsOutage(server.url, token)
            transport.down = down
            with Said() as said:
                run = noisescope.init(
                    url=server.url, token=token, project="evals", task="t", name=label,
                    dir=spool, transport=transport, backoff_max=0.2, quiet=True,
                )  # fmt: skip
                for step in range(events):
                    run.log(step=step, eval_loss=1.0 / (step + 1))
                in_spool = settled(partial(spooled_events, spool / run.id)) if down else 0
                dropped_during = run.status().dropped_events
                transport.down = False
                status = run.finish(timeout=300)
            stored, distinct = stored_events(engine, run.id)
            no_spool = "no spool" in label
            expected_drop = max(0, events - EVENTS_MAX) if no_spool else 0
            held = (
                status.dropped_events == dropped_during == expected_drop
                and stored == distinct == events - expected_drop
            )
            note = f"in memory at most {EVENTS_MAX:,}"
            if down:
                note += f"; {in_spool:,} in the spool when the outage ended"
            if no_spool:
                said_once = said.count("dropping new events") == 1
                held &= said_once
                note += "; the drop said once: " + ("yes" if said_once else "NO")
            rows.append(Row(2, f"{events:,} evaluations, {label}", f"{events:,} events",
                            stored, in_spool if down else None, status.dropped_events,
                            run_status(server, run.id), held, note))  # fmt: skip
    finally:
        engine.dispose()
    return rows


# -- item 3: a token revoked mid-run ----------------------------------------------------------


def revoked_token(server: Server, workdir: Path, samples: int, revoke_at: int) -> list[Row]:
    """The run's token is revoked after ``revoke_at`` of ``samples`` were acknowledged: the
    rest is spooled (none dropped), and ``noisescope sync --token NEW`` stores every one and
    the run's end."""
    token, token_id = make_token(server, "revoked")
    spool = workdir / "revoked"
    run = noisescope.init(
        url=server.url, token=token, project="revoked", task="t", name="revoked",
        batch_size=B_BIG, dir=spool, quiet=True,
    )  # fmt: skip
    for step in range(revoke_at):
        _log_sample(run, _good(step))
    flushed = run.flush(120)
    sent_before = run.status().sent
    gone = httpx.delete(
        f"{server.url}{API}/tokens/{token_id}",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    for step in range(revoke_at, samples):
        _log_sample(run, _good(step))
    status = run.finish(timeout=120)
    engine = engine_for(server.database_url)
    try:
        stored_at_finish = len(stored_seqs(engine, run.id))
        status_at_finish = run_status(server, run.id)
        fresh, _ = make_token(server, "revoked")
        code, output = sync_spool(spool, server.url, token=fresh)
        check = check_run(engine, run.id, SEED, samples)
    finally:
        engine.dispose()
    left = len(spooled_seqs(spool, run.id)) if (spool / run.id).is_dir() else 0
    end = run_status(server, run.id)
    says_token = "--token" in (status.last_error or "")
    held_finish = (
        flushed
        and gone.status_code == 204
        and (sent_before, status.sent, status.spooled, status.dropped)
        == (revoke_at, revoke_at, samples - revoke_at, 0)
        and stored_at_finish == revoke_at
        and says_token
    )
    held_sync = (
        code == 0
        and check.stored == check.distinct == samples
        and check.values_ok
        and left == 0
        and end == "finished"
    )
    logged = f"{samples:,} samples"
    case = f"token revoked after {revoke_at:,} of {samples:,}"
    last_error = (status.last_error or "none").replace(token, "<TOKEN>")
    for said, shown in ((str(spool), "SPOOL"), (server.url, "URL"), (run.id, "RUN")):
        last_error = last_error.replace(said, shown)
    sync_line = output.splitlines()[-1] if output else f"exit {code}"
    return [
        Row(3, f"{case}: at finish", logged, stored_at_finish, status.spooled, status.dropped,
            status_at_finish, held_finish, f"last_error: {last_error}"),
        Row(3, f"{case}: after `noisescope sync --token NEW`", logged, check.stored, left, 0,
            end, held_sync, f"values {'match' if check.values_ok else 'DIFFER'}; sync: "
            f"{sync_line}"),
    ]  # fmt: skip


def data_classes(backend: str, workdir: Path, sizes: Round3Sizes) -> list[Row]:
    """Items 1, 2 and 3 on one ``--auth write`` server of ``backend``."""
    workdir = workdir / "data"
    workdir.mkdir()
    with write_auth_server(backend, workdir) as srv:
        return [
            *one_bad_sample(srv, workdir, sizes.samples),
            *eval_events(srv, workdir, sizes.events),
            *revoked_token(srv, workdir, sizes.revoke_samples, sizes.samples),
        ]
