"""``noisescope runs archive|restore|delete|rename|tag``: change stored runs from a shell.

Each subcommand is one ``noisescope.Api`` call per run id, so the CLI, a notebook and the
dashboard change runs through the same requests. ``delete`` is for good: it asks on a terminal
unless ``--yes``, and refuses without ``--yes`` when nobody can answer (stdin not a terminal),
so a script never deletes by accident; ``archive`` is the restorable way to remove a run.
Exit codes: 0 when every run was changed, 1 when one was not (each failure said on stderr),
2 for bad arguments or a refused deletion.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from noisescope._api import Api, ApiError
from noisescope._config import url_argument

__all__ = ["make_api", "register"]


def make_api(url: str | None, token: str | None) -> Api:
    """The client the subcommands call (tests put one on an in-process server here)."""
    return Api(url, token=token)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="archive, restore, delete, rename or re-tag runs",
        description=(
            "Change stored runs. Archive is the restorable way to remove a run from lists, "
            "sweeps and comparisons; delete removes its samples and events for good."
        ),
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def action(name: str, help_text: str, *, many: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        if many:
            p.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="the run's id")
        else:
            p.add_argument("run_id", metavar="RUN_ID", help="the run's id")
        p.add_argument(
            "--url", type=url_argument, default=None, help="server URL (default: NOISESCOPE_URL)"
        )
        p.add_argument(
            "--token",
            default=None,
            help="API token of the run's project (default: NOISESCOPE_TOKEN)",
        )
        return p

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
        if args.action == "delete" and not args.yes and not _confirmed(api, args.run_ids):
            return 2
        return _each(command, api, args)


def _each(command: str, api: Api, args: argparse.Namespace) -> int:
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
    run_ids = args.run_ids if hasattr(args, "run_ids") else [args.run_id]
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
