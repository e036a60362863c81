"""``noisescope runs list|archive|restore|delete|rename|tag``: find and change stored runs
from a shell.

``list`` prints runs with their full ids (``--json`` for scripts). Each other subcommand is one
``noisescope.Api`` call per run, so the CLI, a notebook and the dashboard change runs through
the same requests; a run is named by its id or by a unique start of it (the 8 characters the
pages and the client's lines show: ``protocol.run_ids_matching``). ``delete`` is for good: it
asks on a terminal unless ``--yes``, and refuses without ``--yes`` when nobody can answer (stdin
not a terminal), so a script never deletes by accident; ``archive`` is the restorable way to
remove a run. Exit codes: 0 when every run was changed (or listed), 1 when one was not (each
failure said on stderr: an id that names no run, or several), 2 for bad arguments or a refused
deletion.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from noisescope._api import Api, ApiError, NotFoundError
from noisescope._config import url_argument
from noisescope._results import RunSummary
from noisescope._wire import run_id_problem, run_ids_matching

__all__ = ["make_api", "register"]


def make_api(url: str | None, token: str | None) -> Api:
    """The client the subcommands call (tests put one on an in-process server here)."""
    return Api(url, token=token)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="list, archive, restore, delete, rename or re-tag runs",
        description=(
            "List and change stored runs, each named by its id or a unique start of it (as "
            "the pages show it). Archive is the restorable way to remove a run from lists, "
            "sweeps and comparisons; delete removes its samples and events for good."
        ),
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def action(name: str, help_text: str, *, many: bool | None = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        said = "the run's id, or a unique start of it (e.g. the 8 characters a page shows)"
        if many:
            p.add_argument("run_ids", nargs="+", metavar="RUN_ID", help=said)
        elif many is not None:
            p.add_argument("run_id", metavar="RUN_ID", help=said)
        p.add_argument(
            "--url", type=url_argument, default=None, help="server URL (default: NOISESCOPE_URL)"
        )
        p.add_argument(
            "--token",
            default=None,
            help="API token of the run's project (default: NOISESCOPE_TOKEN)",
        )
        return p

    listing = action("list", "list runs, newest first, with their full ids", many=None)
    listing.add_argument("--project", default=None, help="only this project's runs")
    listing.add_argument("--task", default=None, help="only this task's runs")
    listing.add_argument("--tag", default=None, help="only runs with this tag")
    listing.add_argument("--status", default=None, help="only runs with this status")
    listing.add_argument("--search", default=None, help="only runs whose name holds this")
    listing.add_argument(
        "--archived",
        choices=("exclude", "include", "only"),
        default="exclude",
        help="archived runs: left out (default), listed too, or only they",
    )
    listing.add_argument("--limit", type=int, default=10_000, help="at most this many runs")
    listing.add_argument("--json", action="store_true", help="one JSON list of the runs")
    action("archive", "archive runs: gone from lists, sweeps and comparisons; restorable")
    action("restore", "bring archived runs back")
    delete = action("delete", "delete runs with their samples and events, for good")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rename = action("rename", "give a run a new name", many=False)
    rename.add_argument("name", help="the new name")
    tag = action("tag", "replace a run's tags", many=False)
    tag.add_argument("tags", nargs="*", metavar="TAG", help="the run's tags from now on")
    tag.add_argument("--clear", action="store_true", help="remove every tag (no TAG given)")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    command = f"noisescope runs {args.action}"
    if args.action == "tag" and not args.tags and not args.clear:
        print(f"{command}: give the tags, or --clear to remove them all", file=sys.stderr)
        return 2
    if args.action == "tag" and args.tags and args.clear:
        print(f"{command}: --clear takes no tags", file=sys.stderr)
        return 2
    try:
        api = make_api(args.url, args.token)
    except ValueError as exc:  # a setting from the environment (NOISESCOPE_URL)
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    with api:
        if args.action == "list":
            return _list(command, api, args)
        given = args.run_ids if hasattr(args, "run_ids") else [args.run_id]
        try:
            listing = functools.cache(
                lambda: [r.uid for r in api.runs(current=False, archived="include")]
            )  # read once, and only when an id given is not a full one
            resolved = [_full_id(command, g, api, listing) for g in given]
        except ApiError as exc:
            print(f"{command}: {exc}", file=sys.stderr)
            return 1
        run_ids = [r for r in resolved if r]
        failed = len(given) - len(run_ids)
        if args.action == "delete" and run_ids and not args.yes and not _confirmed(api, run_ids):
            return 2
        return 1 if _each(command, api, args, run_ids) or failed else 0


def _full_id(command: str, given: str, api: Api, listing: Callable[[], list[str]]) -> str | None:
    """``given`` when the server has a run of that id (one read of it, whatever the number of
    runs), else the one id it begins among the server's runs (``listing``, ``_resolve``)."""
    if run_id_problem(given) is None:
        try:
            api.run(given)
            return given
        except NotFoundError:
            pass  # a prefix, or no run at all
    return _resolve(command, given, listing(), api.url)


def _resolve(command: str, given: str, known: list[str], url: str) -> str | None:
    """The full id ``given`` names among the server's runs; None (said on stderr) when it
    names none or several."""
    found = run_ids_matching(given, known)
    if len(found) == 1:
        return found[0]
    if not found:
        why = f"no run on {url} has this id or an id starting with it"
    else:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        why = f"{len(found)} runs' ids start with it ({shown}): give more of the id"
    print(f"{command} {given}: {why} (noisescope runs list shows the ids)", file=sys.stderr)
    return None


def _list(command: str, api: Api, args: argparse.Namespace) -> int:
    """The runs asked for, one line each (full id first), or ``--json``."""
    if args.limit < 1:
        print(f"{command}: --limit must be at least 1, got {args.limit}", file=sys.stderr)
        return 2
    try:
        runs = api.runs(
            project=args.project,
            task=args.task,
            tag=args.tag,
            status=args.status,
            search=args.search,
            limit=args.limit,
            current=False,
            archived=args.archived,
        )
    except ApiError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([_as_json(r) for r in runs], indent=1))
        return 0
    if not runs:
        print(f"{command}: no runs match", file=sys.stderr)
        return 0
    rows = [("ID", "PROJECT/TASK", "NAME", "STATUS", "SAMPLES", "STARTED (UTC)")]
    for r in runs:
        started = f"{r.started_at:%Y-%m-%d %H:%M}" if r.started_at else "-"
        status = r.status + (" (archived)" if r.archived_at is not None else "")
        rows.append((r.uid, f"{r.project}/{r.task}", r.name, status, f"{r.n_samples:,}", started))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def _as_json(run: RunSummary) -> dict[str, Any]:
    return {
        k: v.isoformat() if isinstance(v, datetime) else v
        for k, v in dataclasses.asdict(run).items()
    }


def _each(command: str, api: Api, args: argparse.Namespace, run_ids: list[str]) -> int:
    """Apply the action to each run id; 1 when any failed (each failure said on stderr)."""

    def rename(run_id: str) -> None:
        api.rename_run(run_id, args.name)

    def tag(run_id: str) -> None:
        api.set_tags(run_id, list(args.tags))

    calls: dict[str, Callable[[str], None]] = {
        "archive": api.archive_run,
        "restore": api.restore_run,
        "delete": api.delete_run,
        "rename": rename,
        "tag": tag,
    }
    call = calls[args.action]
    if args.action == "rename":
        done = f"renamed {args.name!r}"
    elif args.action == "tag":
        done = f"tagged {', '.join(args.tags)}" if args.tags else "tags cleared"
    else:
        done = f"{args.action}d"  # archived, restored, deleted
    failed = 0
    for run_id in run_ids:
        try:
            call(run_id)
        except ApiError as exc:
            print(f"{command} {run_id}: {exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"{run_id}: {done}")
    return 1 if failed else 0


def _confirmed(api: Api, run_ids: list[str]) -> bool:
    """Whether the person at the terminal agreed to delete ``run_ids``; False (said why) when
    stdin is not a terminal: nobody is there to ask, so only ``--yes`` deletes."""
    if not sys.stdin.isatty():
        print(
            "noisescope runs delete: not deleting: stdin is not a terminal to confirm on; "
            "add --yes to delete without asking (or archive the runs: restorable)",
            file=sys.stderr,
        )
        return False
    for run_id in run_ids:
        print(f"  {_describe(api, run_id)}")
    try:
        answer = input(f"Delete {len(run_ids)} run(s) and their samples for good? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("noisescope runs delete: nothing deleted", file=sys.stderr)
        return False
    return True


def _describe(api: Api, run_id: str) -> str:
    """A run as the confirmation names it: id, name, task and samples, as far as known."""
    try:
        run = api.run(run_id)
    except ApiError as exc:
        return f"{run_id} (not read: {exc.detail})"
    name = f" {run.name!r}" if run.name else ""
    return f"{run_id}{name} in {run.project}/{run.task}: {run.n_samples:,} samples"
