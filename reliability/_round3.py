"""Nothing lost without a count (issue 46), against real server processes: every sample or
event the client accepted is stored, spooled, or dropped and counted, whatever goes wrong.

Data classes (run on each backend, the client in this process, on an ``--auth write``
server): one bad sample among good ones (item 1), evaluations in bulk with the server up and
during an events-only outage (item 2), a token revoked mid-run (item 3). Process classes (the
client's own behaviour, run once on SQLite): runs in multiprocessing children (item 4), a
process ended by a signal, an exception or Ctrl-C (item 5, ``reliability._ending`` in its own
process), run fields over the server's limits (item 8), a password in the server URL (item 10,
the client's part). Each case is a ``Row`` whose figures the report prints and whose ``held``
says whether the class holds at that size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
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
from reliability._ending import SEED as ENDING_SEED
from reliability._infra import (
    REPO,
    Server,
    database,
    engine_for,
    port,
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
#: Run fields the server would refuse (item 8): the field init must name, and the fields.
OVER_LIMITS: dict[str, tuple[str, dict[str, Any]]] = {
    "a 1 MiB config": ("config", {"config": {"weights": "x" * (1 << 20)}}),
    "10,000 tags": ("tags", {"tags": [str(i) for i in range(10_000)]}),
    "a 201-character name": ("name", {"name": "n" * 201}),
    "a 201-character project": ("project", {"project": "p" * 201}),
    "a blank project": ("project", {"project": "  "}),
    "a NUL in the task": ("task", {"task": "a\x00"}),
}
#: The password of item 10: it must appear nowhere the client writes or says.
PASSWORD = "hunter22-round3"


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


# -- items 4, 5 and 10: how a training process ends ------------------------------------------


@dataclass
class Ended:
    """A ``reliability._ending`` process after it ended."""

    run_id: str
    code: int
    logged: int
    output: str
    spool: Path

    def spooled(self) -> int:
        """Samples left in the run's spool when the process ended."""
        if not self.run_id or not (self.spool / self.run_id).is_dir():
            return 0
        return len(spooled_seqs(self.spool, self.run_id))


def _client_env() -> dict[str, str]:
    """This checkout's client and harness, and none of the caller's NOISESCOPE_* settings."""
    paths = [str(REPO / "client"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    return env | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_ending(
    url: str, workdir: Path, case: str, samples: int, *, stop: int = 0, after_s: float = 0.0
) -> Ended:
    """``python -m reliability._ending CASE`` against ``url``, in its own spool folder; with
    ``stop``, that signal is sent ``after_s`` seconds after the run started."""
    tag = f"{case}-{stop}" if stop else case
    spool, progress = workdir / f"spool-{tag}", workdir / f"progress-{tag}"
    cmd = [sys.executable, "-m", "reliability._ending", case, url, str(spool), str(samples),
           str(progress)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_client_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    if stop and run_id:
        time.sleep(after_s)
        proc.send_signal(stop)
    try:
        rest, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    try:
        logged = int(progress.read_bytes() or b"0")
    except (OSError, ValueError):
        logged = 0
    return Ended(run_id, proc.returncode, logged, run_id + "\n" + rest, spool)


def _delivered(server: Server, ended: Ended, item: int, case: str, want: str, exact: bool) -> Row:
    """Deliver what the process left in its spool (``noisescope sync``), then its row: every
    logged sample stored with its values, no gap in the steps (``exact``: exactly the
    ``SAMPLES`` it logged; else at least what its progress file says, as a signal may land
    between a log call and the progress write), and the run's status ``want``."""
    spooled = ended.spooled()
    sync = ""
    if ended.run_id and (ended.spool / ended.run_id).is_dir():
        code, output = sync_spool(ended.spool, server.url)
        sync = f"; sync: exit {code}, " + (output.splitlines()[-1] if output else "")
    engine = engine_for(server.database_url)
    try:
        seqs = stored_seqs(engine, ended.run_id) if ended.run_id else []
        check = check_run(engine, ended.run_id, ENDING_SEED, len(seqs)) if seqs else None
    finally:
        engine.dispose()
    stored = len(seqs)
    no_gap = seqs == list(range(stored))
    enough = stored == ended.logged if exact else ended.logged <= stored <= ended.logged + 1
    status = run_status(server, ended.run_id) if ended.run_id else "no run id"
    values = check is not None and check.values_ok
    held = no_gap and enough and values and status == want and stored > 0
    note = f"exit {ended.code}; steps without a gap: {'yes' if no_gap else 'NO'}; values "
    note += ("match" if values else "DIFFER") + sync
    if not ended.run_id or (ended.code not in (0, 1) and ended.code >= 0):
        note += f"; output: {ended.output[-300:]}"
    return Row(item, case, f"{ended.logged:,} samples", stored, spooled, 0, status, held, note)


def children(server: Server, workdir: Path, samples: int) -> list[Row]:
    """Item 4: a run started in a fork- or spawn-context child that returns without finish()
    is finished by the child's finalizers, with every sample stored."""
    rows = []
    for method in ("fork", "spawn"):
        ended = run_ending(server.url, workdir, method, samples)
        row = _delivered(server, ended, 4, f"run in a {method}-context child, no finish()",
                         "finished", exact=True)  # fmt: skip
        row.held &= ended.code == 0 and row.spooled == 0
        rows.append(row)
    return rows


def endings(server: Server, workdir: Path, samples: int, after_s: float) -> list[Row]:
    """Item 5: SIGTERM or SIGHUP ``after_s`` into a logging loop, or an uncaught exception or
    KeyboardInterrupt without ``with run:``: everything logged is stored or spooled (stored
    after ``noisescope sync``), the run is "failed", and a signal still ends the process."""
    rows = []
    for sig in (signal.SIGTERM, signal.SIGHUP):
        ended = run_ending(server.url, workdir, "signal", 0, stop=sig, after_s=after_s)
        row = _delivered(server, ended, 5, f"{sig.name} {after_s:g} s into the loop",
                         "failed", exact=False)  # fmt: skip
        row.held &= ended.code == -sig
        rows.append(row)
    for case, label in (("exception", "uncaught RuntimeError"), ("interrupt", "KeyboardInterrupt")):
        ended = run_ending(server.url, workdir, case, samples)
        row = _delivered(server, ended, 5, f"{label} after {samples:,}, no `with run:`",
                         "failed", exact=True)  # fmt: skip
        row.held &= ended.code != 0
        rows.append(row)
    return rows


def run_fields(server: Server, workdir: Path) -> list[Row]:
    """Item 8: init refuses run fields the server would refuse, naming the field, before
    anything is spooled or sent."""
    engine = engine_for(server.database_url)

    def runs() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM run")).scalar_one())

    rows = []
    try:
        for i, (label, (name, fields)) in enumerate(OVER_LIMITS.items()):
            spool = workdir / f"fields-{i}"
            before = runs()
            try:
                run = noisescope.init(url=server.url, dir=spool, quiet=True, **fields)
            except ValueError as exc:
                said = str(exc)
            else:
                run.finish(timeout=10)
                said = "accepted"
            files = sum(1 for p in spool.rglob("*") if p.is_file()) if spool.exists() else 0
            made = runs() - before
            held = said != "accepted" and name in said and files == 0 and made == 0
            rows.append(Row(8, f"init with {label}", "—", made, files, None,
                            "ValueError" if said != "accepted" else "accepted", held,
                            said[:140]))  # fmt: skip
    finally:
        engine.dispose()
    return rows


def password_in_url(server: Server, workdir: Path, samples: int) -> list[Row]:
    """Item 10 (the client's part): a password in the server URL appears in none of what the
    client says (warnings, the finish line, ``last_error``), writes (every spool file, run.json
    included) or ``noisescope sync`` prints; with the server up, and unreachable (spooled,
    then synced)."""
    live = server.url.replace("http://", f"http://ada:{PASSWORD}@")
    dead = f"http://ada:{PASSWORD}@127.0.0.1:{port()}"
    rows = []
    for label, url in (("server up", live), ("server unreachable, then sync", dead)):
        ended = run_ending(url, workdir, "password", samples)
        run_dir = ended.spool / ended.run_id
        files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
        written = b"".join(p.read_bytes() for p in files).decode(errors="replace")
        spooled = ended.spooled()
        said = ended.output
        if run_dir.is_dir():
            code, output = sync_spool(ended.spool, live)
            said += output + f"\nsync exit {code}"
        engine = engine_for(server.database_url)
        try:
            stored = len(stored_seqs(engine, ended.run_id)) if ended.run_id else 0
        finally:
            engine.dispose()
        leaked = PASSWORD in said or PASSWORD in written
        masked = "ada:***@" in written if files else True
        # unreachable, the warnings name the server: the URL is there, with its password masked
        named = "127.0.0.1" in said or url == live
        held = not leaked and masked and named and stored == samples
        note = (
            f"looked in {len(said.splitlines())} lines of output (warnings, finish line, "
            f"last_error, sync) and {len(files)} spool files; password found: "
            + ("**YES**" if leaked else "no")
            + (f"; run.json names the URL masked: {'yes' if masked else 'NO'}" if files else "")
        )
        rows.append(Row(10, f"password in the URL, {label}", f"{ended.logged:,} samples",
                        stored, spooled, 0, run_status(server, ended.run_id), held,
                        note))  # fmt: skip
    return rows


def process_classes(workdir: Path, sizes: Round3Sizes) -> list[Row]:
    """Items 4, 5, 8 and 10 on one SQLite server (auth off)."""
    workdir = workdir / "process"
    workdir.mkdir()
    steps: list[Callable[[Server], list[Row]]] = [
        lambda srv: children(srv, workdir, sizes.samples),
        lambda srv: endings(srv, workdir, sizes.samples, sizes.signal_after_s),
        lambda srv: run_fields(srv, workdir),
        lambda srv: password_in_url(srv, workdir, sizes.samples),
    ]
    with database("sqlite", workdir) as url, Server(url) as srv:
        return [row for step in steps for row in step(srv)]
