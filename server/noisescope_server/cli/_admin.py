"""``noisescope db`` and ``noisescope token``: migrations, and the projects' API tokens."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from noisescope_server.cli._database import describe_url, migrate, open_database, settings_from
from noisescope_server.tokens import DEFAULT_SCOPES, SCOPES

if TYPE_CHECKING:
    from sqlalchemy import Engine


def cmd_db_upgrade(args: argparse.Namespace) -> int:

    settings = settings_from(args)
    engine = open_database(settings)
    before, after = migrate(engine, settings, "noisescope db upgrade")
    engine.dispose()
    print(f"{describe_url(settings.database_url)}: {before or 'empty'} -> {after}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from noisescope_server import db

    engine = open_database(settings_from(args))
    current = db.current_revision(engine)
    engine.dispose()
    head = db.head_revision()
    if current == head:
        state = "up to date"
    elif db.newer_than_code(current):
        state = (
            "newer than this noisescope: upgrade noisescope (pip install -U noisescope-server) "
            "to the version that migrated it; do not run `noisescope db upgrade` with this one"
        )
    else:
        state = "needs `noisescope db upgrade`"
    print(f"current: {current or 'empty'}  head: {head}  ({state})")
    return 0


def cmd_db_compact(args: argparse.Namespace) -> int:
    """Compact runs now: the named ones (``--run``), else every finished run and every run
    silent for ``--quiet-after`` seconds."""
    from sqlalchemy import select

    from noisescope_server import crud
    from noisescope_server.models import Run

    engine = _engine(args, "noisescope db compact")
    if args.run:
        with engine.connect() as conn:
            query = select(Run.uid, Run.id).where(Run.uid.in_(args.run))
            found = {str(uid): int(run_id) for uid, run_id in conn.execute(query)}
        missing = [uid for uid in args.run if uid not in found]
        if missing:
            print(f"no run {', '.join(map(repr, missing))} in this database", file=sys.stderr)
            return 1
        run_ids = [int(found[uid]) for uid in args.run]
    else:
        run_ids = crud.runs_to_compact(engine, finished_after=0.0, quiet_after=args.quiet_after)
    samples = chunks = 0
    for run_id in run_ids:
        done = crud.compact_run(engine, run_id, chunk_rows=args.chunk_rows)
        samples, chunks = samples + done.samples, chunks + done.chunks
    engine.dispose()
    print(f"compacted {len(run_ids)} run(s): {samples:,} samples into {chunks:,} chunks")
    return 0


def _engine(args: argparse.Namespace, command: str | None = None) -> Engine:
    """The command's database, migrated; ``command`` names it in messages (default: the
    ``token`` action)."""
    settings = settings_from(args)
    engine = open_database(settings)
    migrate(engine, settings, command or f"noisescope token {args.token_command}")
    return engine


def cmd_token_create(args: argparse.Namespace) -> int:
    from noisescope_server import crud
    from noisescope_server.tokens import parse_scopes

    try:
        scopes = parse_scopes(args.scope or list(DEFAULT_SCOPES))
    except ValueError as exc:
        print(f"noisescope token create: --scope: {exc}", file=sys.stderr)
        return 2
    engine = _engine(args)
    created = crud.create_token(engine, args.project, args.name, scopes)
    print(
        f"token {created.id} ({created.name}) for project {created.project!r}, "
        f"scopes: {', '.join(created.scopes)}:"
    )
    print(created.secret)
    print("Store it now: it is shown only once (the server keeps only its sha256).")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from noisescope_server.tokens import list_tokens

    engine = _engine(args)
    rows = list_tokens(engine, args.project)
    print(f"{'id':>5}  {'project':<20} {'name':<24} {'scopes':<18} {'created':<20} status")
    for t in rows:
        status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        scopes = ",".join(s for s in SCOPES if s in t.scopes)
        created = f"{t.created_at:%Y-%m-%d %H:%M:%S}"
        print(f"{t.id:>5}  {t.project:<20} {t.name:<24} {scopes:<18} {created}  {status}")
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from noisescope_server import crud

    engine = _engine(args)
    if crud.revoke_token(engine, args.token_id, project=args.project):
        print(f"token {args.token_id} revoked")
        return 0
    print(
        f"no active token {args.token_id}"
        + (f" in project {args.project!r}" if args.project else ""),
        file=sys.stderr,
    )
    return 1
