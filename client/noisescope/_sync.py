"""``noisescope sync [DIR]``: deliver spooled runs (offline mode, or ended during an outage).

The W&B offline/sync workflow: each run directory under the spool root holds the run's PUT body
and its batches (``_spool.py``). Sync creates the run (PUT is idempotent on the client's run id),
posts every batch (idempotent on (run, seq)), sends the final status, and deletes what the
server acknowledged. Directories locked by a live process are skipped, so syncing while a job
is still running is safe. Sync writes nothing to the spool (it only reads and deletes), so it
works on a full disk.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisescope import _wire
from noisescope._config import resolve, server_hint, url_argument
from noisescope._request import build_request, is_loopback
from noisescope._retry import classify, is_html, not_noisescope
from noisescope._spool import RunSpool, replay_requests, spooled_run_ids
from noisescope._transport import HTTPTransport, Response, Transport, TransportError

logger = logging.getLogger("noisescope")

#: Samples per request when syncing (well under the server's per-request limit).
SYNC_BATCH = 10_000


@dataclass
class SyncResult:
    synced: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    samples: int = 0


def _sender(transport: Transport, compress: bool) -> Callable[[str, str, dict[str, Any]], Response]:
    def send(method: str, path: str, payload: dict[str, Any]) -> Response:
        request = build_request(method, path, payload, compress=compress)
        return transport.handle_request(request)

    return send


class Refused(RuntimeError):
    """The server's answer to a request of the sync was not a success."""


class NotNoisescope(Refused):
    """An answer no noisescope server gives (``_retry.not_noisescope``): the wrong URL."""


def _check(response: Response, what: str) -> None:
    if classify(response) == "ok":
        return
    if not_noisescope(response):
        page = " and a web page" if is_html(response) else ""
        raise NotNoisescope(f"{what}: HTTP {response.status}{page}")
    raise Refused(f"{what}: HTTP {response.status}: {response.detail()}")


def _recorded_run_id(spool: RunSpool, meta: dict[str, Any]) -> str:
    """The run id run.json names (a planted or corrupt one is refused before any request)."""
    run_id = meta.get("run_id") or spool.run_id
    problem = _wire.run_id_problem(run_id)
    if problem is not None:
        raise RuntimeError(f"{spool.dir / 'run.json'}: {problem}")
    return str(run_id)


def sync_run(
    spool: RunSpool, transport: Transport, *, compress: bool = True, end: str | None = None
) -> int:
    """Deliver one locked run directory; returns the number of samples posted. ``compress``:
    gzip large bodies (pointless for a server on this machine). ``end``: the final status to
    send if the spool recorded none (a run whose ``finish()`` could not write it)."""
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
    posted = 0
    for path in spool.seal():
        for _, kind, payload in replay_requests(spool.read(path), 0, SYNC_BATCH):
            if kind == "events":
                response = send("POST", _wire.events_path(run_id), payload)
                _check(response, "posting events")
                continue
            response = send("POST", _wire.samples_path(run_id), payload)
            _check(response, "posting samples")
            posted += len(payload["columns"]["seq"])
        spool.discard(path)
    if isinstance(final, dict):
        _check(send("PATCH", _wire.runs_path(run_id), final), "finishing the run")
    return posted


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
    wait for an explicit ``noisescope sync``; runs locked by a live process are skipped.
    Returns why delivery stopped, if it failed (the rest waits for the next run or sync)."""
    for folder in spooled_run_ids(own.root):
        if folder == own.dir.name or stop():
            continue
        orphan = RunSpool.at(own.root, folder)  # a valid name: spooled_run_ids
        meta = orphan.read_meta() or {}
        if meta.get("mode") != "online" or meta.get("url") != url:
            continue
        try:
            if not orphan.acquire():
                continue
        except OSError:
            continue
        try:
            count = sync_run(orphan, transport, compress=compress)
            orphan.remove_if_empty()
            logger.info("noisescope: delivered %d spooled samples of run %s", count, folder)
        except Exception as exc:
            return f"could not deliver spooled run {folder}: {exc}"
        finally:
            orphan.release()
    return None


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
    for run_id in run_ids or spooled_run_ids(root):
        try:
            spool = RunSpool.at(root, run_id)
        except ValueError as exc:
            result.failed[run_id] = str(exc)
            continue
        recorded = spool.read_meta()  # None also for a folder that resolves outside the root
        if recorded is None:
            result.failed[run_id] = f"no spooled run at {spool.dir}"
            continue
        try:
            _recorded_run_id(spool, recorded)
            if not spool.acquire():
                result.skipped[run_id] = "in use by a live process"
                continue
        except (RuntimeError, OSError) as exc:
            result.failed[run_id] = str(exc)
            continue
        own = None
        try:
            use = transport
            if use is None:
                meta = spool.read_meta() or {}
                from_env = settings.url if _env_url() else None  # checked by resolve
                target = explicit_url or from_env or str(meta.get("url") or settings.url)
                own = use = HTTPTransport(target, settings.token, settings.request_timeout)
            else:
                target = explicit_url or settings.url
            result.samples += sync_run(spool, use, compress=not is_loopback(target), end=end)
            result.synced.append(run_id)
            spool.remove_if_empty()
        except NotNoisescope as exc:
            result.failed[run_id] = (
                f"{target} is not a noisescope server ({exc}); {server_hint(target)} (--url)"
            )
        except Refused as exc:
            result.failed[run_id] = f"{target}: {exc}"
        except (RuntimeError, TransportError, OSError) as exc:
            result.failed[run_id] = str(exc)
        finally:
            spool.release()
            if own is not None:
                own.close()
    return result


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
    if args.end is not None and not args.runs:
        print("noisescope sync: --end needs --run RUN_ID", file=sys.stderr)
        return 2
    try:
        result = sync(root, url=args.url, token=args.token, run_ids=args.runs, end=args.end)
    except ValueError as exc:  # a setting from the environment (NOISESCOPE_URL, ...)
        print(f"noisescope sync: {exc}", file=sys.stderr)
        return 2
    for run_id in result.synced:
        print(f"synced {run_id}")
    for run_id, why in result.skipped.items():
        print(f"skipped {run_id}: {why}")
    for run_id, why in result.failed.items():
        print(f"failed {run_id}: {why}", file=sys.stderr)
    total = len(result.synced) + len(result.skipped) + len(result.failed)
    if total == 0:
        print(f"nothing to sync under {resolve(dir=root).dir}")
    print(f"{len(result.synced)} runs, {result.samples} samples sent")
    return 1 if result.failed else 0
