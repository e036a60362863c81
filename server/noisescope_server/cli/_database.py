"""Settings from a command's arguments and the environment, and the database it names: anything
wrong ends the command with one line (password hidden) and status 2."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from noisescope_server.settings import Settings, default_database_url

if TYPE_CHECKING:
    from sqlalchemy import Engine


def settings_from(args: argparse.Namespace, **extra: object) -> Settings:
    """The settings, or one line saying which environment variable is wrong (status 2)."""
    try:
        return Settings.from_env(database_url=getattr(args, "database_url", None), **extra)
    except ValueError as exc:
        print(f"noisescope: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def open_database(settings: Settings) -> Engine:
    """The engine of ``settings.database_url``, connected once.

    Every command opens its database here, so a bad URL, a missing driver or an unreachable
    database ends any of them the same way: one line naming the URL (password hidden) and what
    is wrong, exit status 2, no traceback from deep inside SQLAlchemy.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from noisescope_server import db

    url = settings.database_url
    try:
        path = db.sqlite_path(url)
        # the default file's directory is created (zero setup); a directory named in a URL
        # given by the user must exist: a typo should not silently start an empty database
        if path is not None and url != default_database_url() and not path.parent.is_dir():
            state = "is not a directory" if path.parent.exists() else "does not exist"
            raise FileNotFoundError(f"directory {path.parent} {state}")
        engine = db.make_engine(url, **_connect_args(url))
        try:
            with engine.connect():
                pass
        except BaseException:
            engine.dispose()
            raise
    except (SQLAlchemyError, ImportError, OSError, ValueError) as exc:
        print(
            f"noisescope: cannot open database {describe_url(url)}: {_why(exc, url)}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from None
    return engine


def migrate(engine: Engine, settings: Settings, command: str) -> tuple[str | None, str | None]:
    """``db.upgrade``, or, for a database a newer noisescope migrated, one line naming both
    revisions and the remedy, and status 2 (the database untouched)."""
    from noisescope_server import db

    try:
        before, after = db.upgrade(engine)
    except db.DatabaseNewer as exc:
        engine.dispose()
        print(f"{command}: {describe_url(settings.database_url)}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if before is not None and before < SCOPES_REVISION <= (after or ""):
        print(f"{command}: {SCOPES_NOTE}", flush=True)
    return before, after


#: The revision that gave tokens scopes, and what a command that applies it says.
SCOPES_REVISION = "0005"
SCOPES_NOTE = (
    "tokens now have scopes: every existing token got read and write (what a job and a "
    "dashboard need); renaming, tagging, archiving, restoring and deleting runs need a token "
    "with the manage scope: `noisescope token create --project NAME --scope manage`"
)


def _connect_args(url: str) -> dict[str, Any]:
    """A bounded first connect on PostgreSQL: libpq's default waits for the OS (minutes)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    libpq = u.get_backend_name() == "postgresql" and u.get_driver_name() in ("psycopg", "psycopg2")
    if libpq and "connect_timeout" not in u.query:
        return {"connect_args": {"connect_timeout": 10}}
    return {}


def _why(exc: BaseException, url: str) -> str:
    """What is wrong, on one line, without the URL's password."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    if isinstance(exc, NoSuchModuleError):
        scheme = url.partition(":")[0]
        text = f"unknown database kind {scheme!r} (use sqlite:///PATH or postgresql+psycopg://...)"
    elif isinstance(exc, ArgumentError):
        text = "not a database URL (use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
    elif isinstance(exc, ImportError):
        text = f"its driver is not installed ({exc})"
    elif isinstance(exc, DBAPIError):
        text = str(exc.orig)
    elif isinstance(exc, OSError):
        text = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)
    elif isinstance(exc, ValueError):  # half-parsed, e.g. a port that is not a number
        text = f"not a valid URL ({exc})"
    else:
        text = str(exc) or type(exc).__name__
    password = _password(url)
    if password and len(password) >= 3:  # shorter: replacing it would garble the message
        text = text.replace(password, "***")
    return " ".join(text.split())


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        match = re.search(r"://[^:/@]*:([^@]*)@", url)
        return match.group(1) if match else None


def describe_url(url: str) -> str:
    """The URL to print: its password never shown, even when it does not parse."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not parseable: still never print its password
        return repr(re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url))
