"""``noisescope sync [DIR]``: deliver spooled runs (offline mode, or ended during an outage).

The W&B offline/sync workflow: each run directory under the spool root holds the run's PUT body
and its batches (``_spool.py``). Sync creates the run (PUT is idempotent on the client's run id),
posts every batch (idempotent on (run, seq)), sends the final status, and deletes what the
server acknowledged. Directories locked by a live process are skipped, so syncing while a job
is still running is safe. On an undamaged spool sync writes nothing (it only reads and
deletes), so it works on a full disk.

A damaged spool (issue 46) costs only its damaged records: ``RunSpool.read`` sets aside what
cannot be sent, samples the server refuses (a 4xx naming rows, or one record alone) are set
aside too, each named with its count, and every other record and run is delivered. Counts are
what the server stored (its ``inserted``), so a duplicated segment is not counted twice. The
exit code says whether anything was left behind: 0 when everything is on the server. A second
sync on the same spool waits for the first on each run both hold, and says which runs the first
delivered.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisescope import _wire
from noisescope._config import Settings, resolve, server_hint, url_argument
from noisescope._format import plural
from noisescope._progress import Progress
from noisescope._records import select_rows
from noisescope._request import build_request, is_loopback
from noisescope._retry import classify, inserted, is_html, not_noisescope, refused_rows
from noisescope._spool import (
    Columns,
    Foreign,
    RunSpool,
    SetAside,
    batch_size,
    held,
    replay_requests,
    spooled_run_ids,
)
from noisescope._transport import HTTPTransport, Response, Transport, TransportError

logger = logging.getLogger("noisescope")

#: Samples per request when syncing (well under the server's per-request limit).
SYNC_BATCH = 10_000
#: The server's answer about the samples' values: the samples it names (``rows``) are set aside
#: and the rest sent.
_INVALID = 422
#: Too large a request: a merge is sent again record by record (one record alone that is still
#: too large fails the run, whose spool stays: a limit is not a damaged record).
_TOO_LARGE = 413


@dataclass
class Delivered:
    """One run's delivery: samples the server took (``sent``) and stored anew (``stored``, its
    ``inserted``), records set aside, files that are not the spool's, segments kept on disk."""

    sent: int = 0
    stored: int = 0
    set_aside: list[SetAside] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    next_segment: str = ""
    #: Why the run's final status was not sent though its spool has an end file, if so.
    end_problem: str | None = None

    def left(self) -> list[str]:
        """What the run left behind, not on the server: a sentence each."""
        said = [aside.sentence() for aside in self.set_aside]
        return said + [f.sentence(self.next_segment) for f in self.foreign if f.new_records]

    def notes(self) -> list[str]:
        """What else is on disk, with nothing of it missing from the server."""
        notes = [f.sentence(self.next_segment) for f in self.foreign if not f.new_records]
        notes += [self.end_problem] if self.end_problem else []
        unsent = {aside.source for aside in self.set_aside if aside.copy is None}
        return notes + [
            f"{name} stays in the spool: {why}; its records are on the server (a later sync "
            "sends them again, and the server does not store them twice)"
            for name, why in self.kept.items()
            if name not in unsent
        ]


@dataclass
class SyncResult:
    synced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Samples the server stored anew (its ``inserted``): a sample it had already is not counted.
    samples: int = 0
    #: Samples the server took, stored anew or already there.
    sent: int = 0
    #: Runs another sync (or their own run) delivered while this one ran: by whom, a phrase.
    elsewhere: dict[str, str] = field(default_factory=dict)
    #: What each delivered run's delivery did (``left()``: what it left behind, ``notes()``).
    delivered: dict[str, Delivered] = field(default_factory=dict)
    #: Runs deleted on the server (410): what their spools held, not sent and removed.
    deleted: dict[str, str] = field(default_factory=dict)

    @property
    def left(self) -> dict[str, list[str]]:
        """Per delivered run: what it left behind (not on the server), a sentence each."""
        return {run_id: done.left() for run_id, done in self.delivered.items() if done.left()}

    @property
    def complete(self) -> bool:
        """Whether everything this sync found is on the server (runs in use by a live process
        aside: they are their live run's to deliver)."""
        return not self.failed and not self.left and not self.deleted


def _sender(transport: Transport, compress: bool) -> Callable[[str, str, dict[str, Any]], Response]:
    def send(method: str, path: str, payload: dict[str, Any]) -> Response:
        request = build_request(method, path, payload, compress=compress)
        return transport.handle_request(request)

    return send


class Refused(RuntimeError):
    """The server's answer to a request of the sync was not a success."""


class Deleted(Refused):
    """The run was deleted on the server (410): it takes nothing more of it."""


class NotNoisescope(Refused):
    """An answer no noisescope server gives (``_retry.not_noisescope``): the wrong URL."""


def _check(response: Response, what: str) -> None:
    if classify(response) == "ok":
        return
    if not_noisescope(response):
        page = " and a web page" if is_html(response) else ""
        raise NotNoisescope(f"{what}: HTTP {response.status}{page}")
    if classify(response) == "gone":
        raise Deleted(response.detail())
    raise Refused(f"{what}: HTTP {response.status}: {response.detail()}")


def _recorded_run_id(spool: RunSpool, meta: dict[str, Any]) -> str:
    """The run id run.json names (a planted or corrupt one is refused before any request)."""
    run_id = meta.get("run_id") or spool.run_id
    problem = _wire.run_id_problem(run_id)
    if problem is not None:
        raise RuntimeError(f"{spool.dir / 'run.json'}: {problem}")
    return str(run_id)


class _Run:
    """The requests of one run's delivery, and what it set aside."""

    def __init__(self, spool: RunSpool, run_id: str, send: Callable[..., Response]) -> None:
        self.spool = spool
        self.run_id = run_id
        self.send = send
        self.done = Delivered()

    def segment(self, path: Path) -> None:
        """Every record of one segment sent or set aside, then the segment discarded."""
        numbered = self.spool.read_numbered(path)
        records = [record for _, record in numbered]
        first = 0
        for last, kind, payload in replay_requests(records, 0, SYNC_BATCH):
            parts = numbered[first : last + 1]
            first = last + 1
            if kind == "events":
                self.events(path, parts[-1][0], payload["events"])
            else:
                sizes = [(number, batch_size(record)) for number, record in parts]
                self.samples(path, payload["columns"], [(n, k) for n, k in sizes if k])
        self.spool.discard(path)

    def events(self, path: Path, line: int, events: list[Any]) -> None:
        response = self.send("POST", _wire.events_path(self.run_id), {"events": events})
        if response.status == _INVALID and not not_noisescope(response):
            why = f"the server refused them (HTTP {response.status}): {response.detail()}"
            self.spool.set_aside_events(path, [line], events, why)
            return
        _check(response, "posting events")

    def samples(self, path: Path, columns: Columns, parts: list[tuple[int, int]]) -> None:
        """POST ``columns`` (the records ``parts``: (line, samples) each). Samples a 422 names
        are set aside and the rest sent again; a merge refused whole is sent again record by
        record. A record refused whole with no sample named fails the run, whose spool stays:
        it passed the client's checks, so the refusal is not about its values (a server that
        does not know a column, a limit)."""
        count = len(columns["seq"])
        response = self.send("POST", _wire.samples_path(self.run_id), {"columns": columns})
        if classify(response) == "ok":
            self.done.sent += count
            self.done.stored += inserted(response, count)
            return
        invalid = response.status == _INVALID and not not_noisescope(response)
        rows = refused_rows(response, count) if invalid else []
        if rows:
            why = f"the server refused them (HTTP {response.status}): {response.detail()}"
            lost = Counter(_line_of(parts, i) for i in rows)
            self.spool.set_aside_refused(path, sorted(lost), select_rows(columns, rows), why)
            refused = set(rows)
            rest = [i for i in range(count) if i not in refused]
            if rest:
                left = [(line, size - lost[line]) for line, size in parts if size > lost[line]]
                self.samples(path, select_rows(columns, rest), left)
            return
        if len(parts) > 1 and (invalid or response.status == _TOO_LARGE):
            offset = 0
            for line, size in parts:
                self.samples(
                    path, select_rows(columns, list(range(offset, offset + size))), [(line, size)]
                )
                offset += size
            return
        _check(response, "posting samples")


def _line_of(parts: list[tuple[int, int]], row: int) -> int:
    """The line of the record that holds ``row`` of a merge of ``parts``."""
    for line, size in parts:
        if row < size:
            return line
        row -= size
    return parts[-1][0]


def sync_run(
    spool: RunSpool,
    transport: Transport,
    *,
    compress: bool = True,
    end: str | None = None,
    into: Delivered | None = None,
) -> Delivered:
    """Deliver one claimed run directory: what was sent and stored, set aside, left in place.
    ``compress``: gzip large bodies (pointless for a server on this machine). ``end``: the
    final status to send if the spool recorded none (a run whose ``finish()`` could not).
    ``into``: the record to fill, which keeps what was stored should a request fail."""
    send = _sender(transport, compress)
    meta = spool.read_meta()
    if meta is None or not isinstance(meta.get("run"), dict):
        raise RuntimeError(f"{spool.dir} has no readable run.json")
    run_id = _recorded_run_id(spool, meta)
    # spools written by earlier clients keep the end in run.json
    final = spool.read_end() or meta.get("final")
    if not isinstance(final, dict) and end is not None:
        final = {"status": end, "ended_at": spool.last_written()}
    _check(send("PUT", _wire.runs_path(run_id), meta["run"]), "creating the run")
    delivery = _Run(spool, run_id, send)
    if into is not None:
        delivery.done = into
    for path in spool.seal():
        delivery.segment(path)
    if isinstance(final, dict):
        _check(send("PATCH", _wire.runs_path(run_id), final), "finishing the run")
    done = delivery.done
    done.set_aside = list(spool.set_aside)
    done.kept = dict(spool.kept)
    done.foreign = spool.foreign()
    done.next_segment = spool.next_segment_name()
    if not isinstance(final, dict) and spool.end_damaged():
        done.end_problem = (
            "its end file is damaged: its final status was not sent (the server shows the run "
            "crashed once it has been silent a while; every sample was delivered)"
        )
    return done


def deliver_orphans(
    own: RunSpool,
    url: str,
    transport: Transport,
    *,
    compress: bool,
    stop: Callable[[], bool],
) -> str | None:
    """Deliver the spools that earlier *online* runs to ``url`` left under ``own``'s root (a
    job killed during an outage), as a live run does once its own data is sent. Offline runs
    wait for an explicit ``noisescope sync``; runs held by a live process or another delivery
    are skipped. Returns what went wrong or was left behind, if anything (delivery stops at the
    first failure; the rest waits for the next run or sync)."""
    said: list[str] = []
    for folder in spooled_run_ids(own.root):
        if folder == own.dir.name or stop():
            continue
        orphan = RunSpool.at(own.root, folder)  # a valid name: spooled_run_ids
        meta = orphan.read_meta() or {}
        if meta.get("mode") != "online" or meta.get("url") != url:
            continue
        try:
            if orphan.claim(wait=False) != "taken":
                continue
            done = sync_run(orphan, transport, compress=compress)
            orphan.remove_if_empty(done.foreign)
            logger.info(
                "noisescope: spooled run %s delivered: %d samples stored", folder, done.stored
            )
            said += [f"spooled run {folder}: {sentence}" for sentence in done.left()]
        except Deleted as exc:
            said.append(f"spooled run {folder}: {_drop_deleted(orphan, exc)}")
        except Exception as exc:  # one run's trouble never stops this run or its delivery
            said.append(f"could not deliver spooled run {folder}: {exc}")
            return "; ".join(said)
        finally:
            orphan.release()
    return "; ".join(said) or None


def _drop_deleted(spool: RunSpool, exc: Deleted) -> str:
    """A spooled run deleted on the server: its segments deleted, its folder removed (the
    server takes none of it, and a sync that kept it would try again forever); what it
    held, in a sentence."""
    samples, events = spool.drop_segments()
    spool.remove_if_empty()
    what = held(samples, 0, events)
    return (
        f"the run was deleted on the server ({exc}); {what} in its spool were not sent and "
        f"are removed with its spool folder {spool.dir}"
    )


def _listed(root: Path, run_ids: list[str] | None) -> list[tuple[str, bool]]:
    """The run folders to sync, each with whether it held a run.json when sync began."""
    if not run_ids:
        return [(run_id, True) for run_id in spooled_run_ids(root)]
    present = []
    for run_id in run_ids:
        try:
            there = (RunSpool.at(root, run_id).dir / "run.json").is_file()
        except (ValueError, OSError):
            there = False
        present.append((run_id, there))
    return present


def sync(
    dir: str | Path | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    run_ids: list[str] | None = None,
    transport: Transport | None = None,
    end: str | None = None,
) -> SyncResult:
    """Send every spooled run under ``dir`` (default ``NOISESCOPE_DIR``) to the server.

    ``url`` defaults to ``NOISESCOPE_URL``, else the URL the run was recorded with. ``end``
    (with ``run_ids`` only: a run that crashed recorded no end either) is the final status of
    runs whose spool recorded none, as ``finish()`` says when it could not.
    """
    if end is not None and not run_ids:
        raise ValueError("end= needs run_ids: the runs whose finish() could not record it")
    settings = resolve(url=url, token=token, dir=dir, mode="online")
    root = settings.dir
    result = SyncResult()
    explicit_url = settings.url if url else None
    listing = _listed(root, run_ids)
    with Progress(len(listing), "noisescope sync") as progress:
        for run_id, listed in listing:
            _sync_one(root, run_id, listed, settings, explicit_url, transport, end, result)
            progress.advance(note=f"{plural(result.samples, 'sample')} stored")
    return result


def _sync_one(
    root: Path,
    run_id: str,
    listed: bool,
    settings: Settings,
    explicit_url: str | None,
    transport: Transport | None,
    end: str | None,
    result: SyncResult,
) -> None:
    """Deliver one run folder of ``sync``, recording the outcome in ``result``."""
    try:
        spool = RunSpool.at(root, run_id)
    except ValueError as exc:
        result.failed[run_id] = str(exc)
        return
    recorded = spool.read_meta()  # None also for a folder that resolves outside the root
    if recorded is None:
        meta_path = spool.dir / "run.json"
        if spool.has_meta_file():
            result.failed[run_id] = (
                f"{meta_path} is unreadable or damaged: the run cannot be created without it"
            )
        elif listed and not meta_path.exists():
            result.elsewhere[run_id] = "by another sync (or its own run) meanwhile"
        else:
            result.failed[run_id] = f"no spooled run at {spool.dir}"
        return
    try:
        _recorded_run_id(spool, recorded)
        claimed = spool.claim(wait=True)
    except (RuntimeError, OSError) as exc:
        result.failed[run_id] = str(exc)
        return
    if claimed == "gone":
        who = "another sync" if spool.waited else "another sync (or its own run)"
        result.elsewhere[run_id] = f"by {who} meanwhile"
        return
    if claimed != "taken":
        result.skipped[run_id] = "in use by a live process"
        return
    spool.warn = False  # the sync says what it sets aside itself
    own = None
    target = explicit_url or settings.url
    done = Delivered()
    try:
        use = transport
        if use is None:
            meta = spool.read_meta() or {}
            from_env = settings.url if _env_url() else None  # checked by resolve
            target = explicit_url or from_env or str(meta.get("url") or settings.url)
            own = use = HTTPTransport(target, settings.token, settings.request_timeout)
        sync_run(spool, use, compress=not is_loopback(target), end=end, into=done)
        result.synced.append(run_id)
        result.delivered[run_id] = done
        spool.remove_if_empty(done.foreign)
    except Deleted as exc:
        result.deleted[run_id] = _drop_deleted(spool, exc)
    except NotNoisescope as exc:
        result.failed[run_id] = (
            f"{target} is not a noisescope server ({exc}); {server_hint(target)} (--url)"
        )
    except Refused as exc:
        result.failed[run_id] = f"{target}: {exc}"
    except (RuntimeError, TransportError, OSError) as exc:
        result.failed[run_id] = str(exc)
    except Exception as exc:  # one run's trouble never costs the others
        result.failed[run_id] = f"internal error: {type(exc).__name__}: {exc}"
    finally:
        spool.release()
        if own is not None:
            own.close()
    result.samples += done.stored
    result.sent += done.sent
    if run_id in result.failed and done.sent:
        result.failed[run_id] += (
            f" ({plural(done.stored, 'sample')} stored before that; the rest stays in the spool)"
        )


def _env_url() -> str | None:
    import os

    return os.environ.get("NOISESCOPE_URL") or None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sync",
        help="send spooled runs (offline mode or an outage) to the server",
        description=(
            "Send runs recorded offline, or left in the spool when the server was unreachable "
            "at finish, to a noisescope server. Safe to repeat: the server ignores duplicates."
        ),
    )
    parser.add_argument(
        "dir", nargs="?", default=None, help="spool directory (default: NOISESCOPE_DIR)"
    )
    parser.add_argument(
        "--url", type=url_argument, default=None, help="server URL (default: NOISESCOPE_URL)"
    )
    parser.add_argument("--token", default=None, help="API token (default: NOISESCOPE_TOKEN)")
    parser.add_argument("--run", action="append", dest="runs", help="only this run id")
    parser.add_argument(
        "--end",
        choices=[s for s in _wire.RUN_STATUSES if s != "running"],
        help="with --run: the final status to send for a run whose spool recorded none "
        "(finish() says so when a full disk kept it from recording its end)",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    root = Path(args.dir).expanduser() if args.dir else None
    if root is not None and not root.is_dir():  # a typo would otherwise read "nothing to sync"
        what = "is not a folder" if root.exists() else "does not exist"
        print(f"noisescope sync: {root} {what}: give the spool folder (NOISESCOPE_DIR)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.end is not None and not args.runs:
        print("noisescope sync: --end needs --run RUN_ID", file=sys.stderr)
        return 2
    try:
        result = sync(root, url=args.url, token=args.token, run_ids=args.runs, end=args.end)
    except ValueError as exc:  # a setting from the environment (NOISESCOPE_URL, ...)
        print(f"noisescope sync: {exc}", file=sys.stderr)
        return 2
    return report(result, resolve(dir=root).dir)


def report(result: SyncResult, root: Path) -> int:
    """Print what a sync did (``root``: its spool root) and return its exit code: 0 when
    everything it found is on the server, 1 when something was left behind (said in a last
    sentence on stderr). Counts are what the server stored."""
    for run_id in result.synced:
        done = result.delivered.get(run_id, Delivered())
        there = (
            f", {done.sent - done.stored:,} already on the server"
            if done.sent > done.stored
            else ""
        )
        print(f"synced {run_id}: {plural(done.stored, 'sample')} stored{there}")
        for sentence in done.left():
            print(f"not sent {run_id}: {sentence}")
        for sentence in done.notes():
            print(f"note {run_id}: {sentence}")
    for run_id, who in result.elsewhere.items():
        print(f"run {run_id} was delivered {who}")
    for run_id, why in result.skipped.items():
        print(f"skipped {run_id}: {why}")
    for run_id, why in result.failed.items():
        print(f"failed {run_id}: {why}", file=sys.stderr)
    for run_id, why in result.deleted.items():
        print(f"deleted {run_id}: {why}", file=sys.stderr)
    total = len(result.synced) + len(result.skipped) + len(result.failed) + len(result.elsewhere)
    total += len(result.deleted)
    if total == 0:
        print(f"nothing to sync under {root}")
    already = result.sent - result.samples
    print(
        f"{plural(len(result.synced), 'run')}, {plural(result.samples, 'sample')} stored"
        + (f" ({already:,} more sent were already on the server)" if already else "")
    )
    if result.complete:
        return 0
    print(f"noisescope sync: not everything is on the server: {_left_behind(result)}",
          file=sys.stderr)  # fmt: skip
    return 1


def _left_behind(result: SyncResult) -> str:
    """What a sync left behind, in one sentence's parts: records set aside, files not sent,
    runs failed."""
    done = result.delivered.values()
    aside = [a for d in done for a in d.set_aside]
    files = [f for d in done for f in d.foreign if f.new_records]
    parts = []
    if aside:
        records = sum(a.records for a in aside)
        what = held(
            *(sum(getattr(a, key) for a in aside) for key in ("samples", "unknown", "events"))
        )
        parts.append(f"{plural(records, 'record')} ({what}) set aside, named above")
    if files:
        samples = sum(f.new_samples for f in files)
        one = len(files) == 1
        parts.append(
            f"{plural(len(files), 'file')} that {'is' if one else 'are'} not the spool's "
            f"{'holds' if one else 'hold'} {plural(samples, 'sample')} not sent, named above"
        )
    if result.deleted:
        parts.append(f"{plural(len(result.deleted), 'run')} deleted on the server, named above")
    if result.failed:
        runs = plural(len(result.failed), "run")
        they = "it stays" if len(result.failed) == 1 else "they stay"
        parts.append(f"{runs} failed ({they} in the spool for the next sync)")
    return "; ".join(parts)
