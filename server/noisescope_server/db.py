"""Engine factory, write transactions and start-up migrations.

SQLite gets WAL (readers never block the writer), ``busy_timeout`` (a second writer waits
instead of failing with "database is locked") and ``synchronous=NORMAL`` (durable at each
checkpoint, no fsync per commit; WAL keeps the file consistent). Write transactions on SQLite
start with ``BEGIN IMMEDIATE``: a deferred transaction that reads first and then writes cannot
wait for the lock (SQLITE_BUSY is returned at once, whatever the timeout), which is the classic
source of "database is locked" under concurrent writers. PostgreSQL gets ``pool_pre_ping`` so a
database restart costs one reconnect rather than one failed request per pooled connection, and,
in the server's engine, new connections that the database refuses are retried for up to
``CONNECT_WAIT`` seconds: a restart shorter than that makes requests wait instead of failing
(``python -m reliability --only outage`` measures it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "DatabaseNewer",
    "current_revision",
    "head_revision",
    "make_engine",
    "sqlite_path",
    "upgrade",
    "write_transaction",
]

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: How long the server's engine retries a PostgreSQL connection the database refuses (seconds)
#: before the request gets its 503; below the client's 10 s request timeout.
CONNECT_WAIT = 5.0


def _lock_key(name: str) -> int:
    """The PostgreSQL advisory lock key of a cross-process lock (a constant 56-bit integer)."""
    return int.from_bytes(hashlib.sha256(f"noisescope-{name}".encode()).digest()[:7], "big")


def _lock_path(database: Path, name: str) -> Path:
    """The file a cross-process lock takes beside a SQLite database."""
    return database.with_name(f"{database.name}.{name}-lock")


#: Key of the PostgreSQL advisory lock held while migrating.
_MIGRATION_LOCK_KEY = _lock_key("migrate")


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL, None for other backends or in-memory databases."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database).expanduser()


def make_engine(
    url: str, *, pool_size: int = 5, connect_wait: float = 0.0, **kwargs: Any
) -> Engine:
    """An engine configured for noisescope's access pattern on SQLite or PostgreSQL;
    ``connect_wait`` > 0 retries refused PostgreSQL connections for that many seconds."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"check_same_thread": False, **kwargs.pop("connect_args", {})}
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        _configure_sqlite(engine)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_size", pool_size)
        kwargs.setdefault("max_overflow", pool_size)
        engine = create_engine(url, pool_pre_ping=True, **kwargs)
        if connect_wait > 0:
            _retry_connections(engine, connect_wait)
        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _retry_connections(engine: Engine, wait_s: float) -> None:
    """Retry refused connections (a restarting or starting database) for up to ``wait_s``."""

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Let us emit BEGIN ourselves (pysqlite's implicit transactions are always DEFERRED).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        # Foreign keys stay off (SQLite's default): a per-row parent lookup costs 20-40% of the
        # insert rate, and crud, the one write path, only ever inserts rows for a run it
        # has just found under the write lock, so no orphan can arise. PostgreSQL enforces them.
        cursor.execute("PRAGMA foreign_keys = OFF")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("noisescope_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction for one write request: committed on success, rolled back on error.

    On SQLite it takes the write lock up front (``BEGIN IMMEDIATE``), so the whole request sees
    one consistent state and waits politely (busy_timeout) behind other writers.
    """
    with engine.connect() as conn:
        conn.execution_options(noisescope_write=True)
        with conn.begin():
            yield conn


# --- migrations ---------------------------------------------------------------------------


def _alembic_config(conn: Connection | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def migrations_dir() -> str:
    """Where the Alembic scripts live: package ``noisescope_server.migrations`` (installed from
    the top-level ``migrations/`` folder through pyproject's package-dir)."""
    import importlib.util

    spec = importlib.util.find_spec("noisescope_server.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("noisescope_server.migrations is missing from this installation")
    return os.fspath(next(iter(spec.submodule_search_locations)))


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    """Every revision this noisescope's migrations know."""
    from alembic.script import ScriptDirectory

    return {r.revision for r in ScriptDirectory.from_config(_alembic_config()).walk_revisions()}


class DatabaseNewer(RuntimeError):
    """The database is at a revision this noisescope does not know: a newer noisescope
    migrated it. Nothing is changed; the message names both revisions and the remedy."""

    def __init__(self, current: str, head: str) -> None:
        self.current, self.head = current, head
        super().__init__(
            f"the database is at revision {current}, newer than this noisescope (whose newest "
            f"revision is {head}): it was migrated by a newer noisescope; upgrade noisescope "
            "to that version (pip install -U noisescope-server) or use another database "
            "(--database-url); the database was left unchanged"
        )


def newer_than_code(current: str | None) -> bool:
    """Whether ``current`` (a database's revision) is one this noisescope does not know."""
    return current is not None and current not in known_revisions()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@contextlib.contextmanager
def _migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection held under the cross-process migration lock (N workers, N test servers).

    On SQLite the file lock is taken before connecting: a new connection's PRAGMAs (switching
    a new file to WAL needs it alone) must not race another worker's migration, where SQLite
    may answer "database is locked" at once, whatever the busy timeout.
    """
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                conn.commit()
        return
    path = sqlite_path(str(engine.url)) if engine.dialect.name == "sqlite" else None
    if path is None:
        with engine.connect() as conn:
            yield conn
        return
    import fcntl

    with open(_lock_path(path, "migrate"), "a+b") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


@contextlib.contextmanager
def try_exclusive(engine: Engine, name: str) -> Iterator[bool]:
    """Whether this process holds the cross-process lock ``name`` (for the block), without
    waiting: of several workers on one database, one does a chore at a time and the others
    skip it. A PostgreSQL advisory lock of the session, or a file lock beside the SQLite file;
    either goes with a process that dies holding it."""
    if engine.dialect.name == "postgresql":
        key = _lock_key(name)
        with engine.connect() as conn:
            mine = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
            conn.commit()
            try:
                yield mine
            finally:
                if mine:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
        return
    path = sqlite_path(str(engine.url)) if engine.dialect.name == "sqlite" else None
    if path is None:  # an in-memory database: one process
        yield True
        return
    import fcntl

    with open(_lock_path(path, name), "a+b") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Apply migrations up to ``revision`` under a cross-process lock.

    Returns (revision before, revision after). Safe to call from every worker at start-up:
    the first one migrates, the others find the database already at head. A database at a
    revision these migrations do not know (a newer noisescope's) raises ``DatabaseNewer``
    before anything is written.
    """
    from alembic import command

    with _migration_connection(engine) as conn:
        before = _current(conn)
        if newer_than_code(before):
            assert before is not None
            raise DatabaseNewer(before, head_revision())
        if before != revision or revision == "head":
            with conn.begin():
                command.upgrade(_alembic_config(conn), revision)
        after = _current(conn)
        conn.commit()
    return before, after


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    with _migration_connection(engine) as conn, conn.begin():
        command.downgrade(_alembic_config(conn), revision)


def _current(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    rev = MigrationContext.configure(conn).get_current_revision()
    conn.rollback()
    return rev
