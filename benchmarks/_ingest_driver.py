"""The storage limit ``benchmarks.ingest`` measures HTTP ingest against: the same sample rows
inserted by the database driver itself (``executemany``, or the server's own INSERT with its
parameters built beforehand) into a migrated database, and the throw-away PostgreSQL databases
the benchmarks write to. ``load_runs`` (fill a database fast, for the read benchmarks) and
``make_columns`` (the sample batches every ingest benchmark sends) live here too."""

from __future__ import annotations

import os
import random
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from noisescope import _wire
from noisescope_server.models import SAMPLE_COLUMNS

PG_ADMIN = os.environ.get("NOISESCOPE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
COLUMNS = _wire.SAMPLE_COLUMNS


def make_columns(n: int, start: int, seed: int) -> dict[str, list[Any]]:
    rng = random.Random(seed)
    seq = list(range(start, start + n))
    return {
        "seq": seq,
        "step": list(seq),
        "examples": [s * 256.0 for s in seq],
        "b_small": [64.0] * n,
        "b_big": [256.0] * n,
        "g_small_sq": [1.0 + 40.0 / 64 + rng.random() for _ in seq],
        "g_big_sq": [1.0 + 40.0 / 256 + 0.2 * rng.random() for _ in seq],
        "loss": [2.0 / (1 + 1e-3 * s) for s in seq],
        "lr": [0.1] * n,
        "time": [1.7e9 + s for s in seq],
        "series": [""] * n,
    }


def load_runs(url: str, runs: Iterable[tuple[str, Any, int, int]], batch: int = 20_000) -> float:
    """Migrate the database at ``url``, then load ``runs`` (uid, ``crud.RunIn``, samples, seed):
    each run and ``make_columns``' samples through ``crud``, the server's write path (so
    ``sample_block`` is maintained as in production). Seconds the loading took."""
    from noisescope_server import crud, db

    engine = db.make_engine(url)
    db.upgrade(engine)
    t0 = time.perf_counter()
    for uid, run, n, seed in runs:
        crud.upsert_run(engine, uid, run)
        for start in range(0, n, batch):
            cols = make_columns(min(batch, n - start), start, seed + start)
            samples = crud.validate_samples({"columns": cols}, max_samples=batch)
            crud.ingest_samples(engine, uid, samples)
    engine.dispose()
    return time.perf_counter() - t0


def sample_rows(run_id: int, cols: dict[str, list[Any]]) -> list[tuple[Any, ...]]:
    """The stored rows of these samples (``models.SAMPLE_COLUMNS`` after ``run_id``): the wire
    columns, the series as its number (these are the whole model's, ``models.WHOLE_MODEL``)."""
    from noisescope_server.models import SERIES_COLUMN, WHOLE_MODEL

    stored = {**cols, SERIES_COLUMN: [WHOLE_MODEL] * len(cols["seq"])}
    return list(zip([run_id] * len(cols["seq"]), *(stored[c] for c in SAMPLE_COLUMNS), strict=True))


def _insert_sql(mark: str) -> str:
    """The driver's plain INSERT of one stored row, with ``mark`` for each parameter."""
    marks = ", ".join([mark] * (1 + len(SAMPLE_COLUMNS)))
    return f"INSERT INTO sample (run_id, {', '.join(SAMPLE_COLUMNS)}) VALUES ({marks})"


def prepare_schema(url: str, run_uid: str = "driver-baseline") -> int:
    from noisescope_server import crud, db

    engine = db.make_engine(url)
    db.upgrade(engine)
    ref, _ = crud.upsert_run(engine, run_uid, crud.RunIn(project="bench", task="driver"))
    engine.dispose()
    return ref.id


def _sqlite_server_statements(
    conn: sqlite3.Connection, chunk: list[tuple[Any, ...]]
) -> list[tuple[str, list[Any]]]:
    """The server's multi-row insert-or-ignore statements for these rows, parameters flat."""
    from noisescope_server.crud import _sql

    per_insert = _sql.sqlite_rows_per_insert(conn)
    return [
        (
            _sql.sqlite_sample_insert(len(chunk[i : i + per_insert])),
            [v for row in chunk[i : i + per_insert] for v in row],
        )
        for i in range(0, len(chunk), per_insert)
    ]


def _pg_server_arrays(chunk: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The server's ``unnest`` parameters (one array per column) for these rows."""
    return {name: [row[k] for row in chunk] for k, name in enumerate(("run_id", *SAMPLE_COLUMNS))}


def sqlite_insert_batches(
    conn: sqlite3.Connection,
    chunks: list[list[tuple[Any, ...]]],
    statement: str,
    clock: Callable[[], float],
) -> float:
    """Insert the batches, one transaction each; the ``clock`` time it took (parameters of the
    server's statements are built before the clock starts, like executemany's rows)."""
    sql = _insert_sql("?")
    prepared = [
        _sqlite_server_statements(conn, chunk) if statement == "server" else [] for chunk in chunks
    ]
    t0 = clock()
    for chunk, statements in zip(chunks, prepared, strict=True):
        conn.execute("BEGIN")
        if statement == "server":
            for server_sql, params in statements:
                conn.execute(server_sql, params)
        else:
            conn.executemany(sql, chunk)
        conn.execute("COMMIT")
    return clock() - t0


def driver_rate(url: str, n: int, batch: int, round_: int = 0, *, statement: str = "") -> float:
    """Rows/s of the raw driver into the migrated sample table (a fresh run), one transaction per
    batch: ``executemany`` of one-row INSERTs, or with ``statement="server"`` the statement
    the server uses (its parameters built before the clock starts, like executemany's rows)."""
    run_id = prepare_schema(url, f"driver-{statement or 'executemany'}-{round_}")
    rows = sample_rows(run_id, make_columns(n, 0, 1))
    chunks = [rows[i : i + batch] for i in range(0, n, batch)]
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        took = sqlite_insert_batches(conn, chunks, statement, time.perf_counter)
        conn.close()
    else:
        import psycopg

        from noisescope_server.crud import _sql

        conn_pg = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
        sql = _insert_sql("%s")
        arrays = [_pg_server_arrays(chunk) if statement == "server" else {} for chunk in chunks]
        t0 = time.perf_counter()
        for chunk, columns in zip(chunks, arrays, strict=True):
            with conn_pg.cursor() as cur:
                if statement == "server":
                    cur.execute(_sql.PG_SAMPLE_INSERT, columns)
                else:
                    cur.executemany(sql, chunk)
            conn_pg.commit()
        took = time.perf_counter() - t0
        conn_pg.close()
    return n / took


def pg_database() -> str | None:
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception:
        return None
    name = f"ns_bench_{uuid.uuid4().hex[:8]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def pg_url(name: str) -> str:
    """The SQLAlchemy URL of the benchmark database ``name`` (made by ``pg_database``)."""
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    return f"{base}/{name}"


def drop_pg(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
