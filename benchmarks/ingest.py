"""End-to-end ingest throughput over HTTP vs the database driver's own executemany (issue 9).

For SQLite (temp file) and PostgreSQL (a fresh database on 127.0.0.1:5432, skipped if absent):

1. *driver executemany*: the same rows (all sample columns, including the per-sample estimates)
   inserted with ``sqlite3`` / ``psycopg`` ``executemany`` into the migrated ``sample`` table, one
   transaction per batch: the storage limit, no HTTP, no validation.
2. *noisescope over HTTP*: a real server (``python -m noisescope_server``) fed by several
   concurrent client processes, each POSTing pre-encoded columnar JSON batches over keep-alive
   connections: parse, validate, estimates, insert-or-ignore, block sums, commit.

The ratio HTTP / driver is the figure of merit (target >= 50%). A second table measures
keep-alive request latency against a multi-worker server: noisescope's own socket (TCP_NODELAY)
beside stock ``uvicorn --workers 2`` (uvicorn issue 3149: ~40 ms stalls per request).

Run: ``python -m benchmarks.ingest [--quick]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import requests

from tests.support.servers import ServerProcess, free_port, wait_for_health

PG_ADMIN = os.environ.get("NOISESCOPE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
COLUMNS = (
    "seq",
    "step",
    "examples",
    "b_small",
    "b_big",
    "g_small_sq",
    "g_big_sq",
    "loss",
    "lr",
    "time",
    "series",
)


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


def _rows(run_id: int, cols: dict[str, list[Any]]) -> list[tuple[Any, ...]]:
    from noisescope.estimators import two_batch_estimates

    est = list(
        map(
            two_batch_estimates,
            cols["b_small"],
            cols["b_big"],
            cols["g_small_sq"],
            cols["g_big_sq"],
        )
    )
    return [
        (
            run_id,
            cols["seq"][i],
            cols["step"][i],
            cols["examples"][i],
            cols["b_small"][i],
            cols["b_big"][i],
            cols["g_small_sq"][i],
            cols["g_big_sq"][i],
            est[i][0],
            est[i][1],
            cols["loss"][i],
            cols["lr"][i],
            cols["time"][i],
            cols["series"][i],
        )
        for i in range(len(cols["seq"]))
    ]


_INSERT = (
    "INSERT INTO sample (run_id, seq, step, examples, b_small, b_big, g_small_sq, g_big_sq, "
    "g_sq_est, trace_sigma_est, loss, lr, time, series) VALUES ({})"
)


def _prepare_schema(url: str) -> None:
    from noisescope_server import crud, db

    engine = db.make_engine(url)
    db.upgrade(engine)
    crud.upsert_run(engine, "driver-baseline", crud.RunIn(project="bench", task="driver"))
    engine.dispose()


def driver_rate(url: str, n: int, batch: int) -> float:
    """Rows/s of the raw driver's executemany into the migrated sample table."""
    _prepare_schema(url)
    rows = _rows(1, make_columns(n, 0, 1))
    chunks = [rows[i : i + batch] for i in range(0, n, batch)]
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        sql = _INSERT.format(", ".join("?" * 14))
        t0 = time.perf_counter()
        for chunk in chunks:
            conn.execute("BEGIN")
            conn.executemany(sql, chunk)
            conn.execute("COMMIT")
        took = time.perf_counter() - t0
        conn.close()
    else:
        import psycopg

        conn_pg = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"))
        sql = _INSERT.format(", ".join(["%s"] * 14))
        t0 = time.perf_counter()
        for chunk in chunks:
            with conn_pg.cursor() as cur:
                cur.executemany(sql, chunk)
            conn_pg.commit()
        took = time.perf_counter() - t0
        conn_pg.close()
    return n / took


def _client(args: tuple[str, str, list[bytes], Any]) -> None:
    url, run_uid, bodies, barrier = args
    session = requests.Session()
    headers = {"Content-Type": "application/json"}
    barrier.wait()
    for body in bodies:
        r = session.post(f"{url}/api/v1/runs/{run_uid}/samples", data=body, headers=headers)
        r.raise_for_status()


def http_rate(url: str, n: int, batch: int, clients: int, workers: int) -> float:
    """Samples/s over HTTP from ``clients`` concurrent processes into one server."""
    per_client = n // clients
    with ServerProcess(database_url=url, workers=workers) as server:
        uids = []
        payloads = []
        for k in range(clients):
            uid = uuid.uuid4().hex
            r = requests.put(
                f"{server.url}/api/v1/runs/{uid}", json={"project": "bench", "task": "http"}
            )
            r.raise_for_status()
            uids.append(uid)
            cols = make_columns(per_client, 0, k)
            payloads.append(
                [
                    orjson.dumps({"columns": {c: v[i : i + batch] for c, v in cols.items()}})
                    for i in range(0, per_client, batch)
                ]
            )
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(clients + 1)
        procs = [
            ctx.Process(target=_client, args=((server.url, uids[k], payloads[k], barrier),))
            for k in range(clients)
        ]
        for p in procs:
            p.start()
        barrier.wait()
        t0 = time.perf_counter()
        for p in procs:
            p.join()
        took = time.perf_counter() - t0
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a client failed; server log:\n{server.log()[-3000:]}")
        total = 0
        for uid in uids:
            total += requests.get(f"{server.url}/api/v1/runs/{uid}").json()["n_samples"]
        if total != per_client * clients:
            raise RuntimeError(f"stored {total} samples, expected {per_client * clients}")
    return per_client * clients / took


def keepalive_latency_ms(base: str, requests_n: int) -> tuple[float, float]:
    """p50 and p90 of sequential keep-alive GETs on one connection (first request excluded)."""
    session = requests.Session()
    session.get(f"{base}/api/v1/health").raise_for_status()
    times = []
    for _ in range(requests_n):
        t0 = time.perf_counter()
        session.get(f"{base}/api/v1/runs?limit=1").raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.9 * len(times))]


def _stock_uvicorn(url: str, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "NOISESCOPE_DATABASE_URL": url}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "noisescope_server.app:app_from_env",
            "--factory",
            "--workers",
            str(workers),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    wait_for_health(base, 90, proc)
    return proc, base


def latency_table(tmp: Path, requests_n: int) -> str:
    import signal

    url = f"sqlite:///{tmp / 'latency.db'}"
    _prepare_schema(url)
    rows = ["| server (2 workers, keep-alive client) | p50 ms | p90 ms |", "|---|---:|---:|"]
    with ServerProcess(database_url=url, workers=2) as server:
        p50, p90 = keepalive_latency_ms(server.url, requests_n)
        rows.append(f"| `noisescope server --workers 2` | {p50:.1f} | {p90:.1f} |")
    proc, base = _stock_uvicorn(url, 2)
    try:
        p50, p90 = keepalive_latency_ms(base, requests_n)
        rows.append(f"| stock `uvicorn --workers 2` (same app) | {p50:.1f} | {p90:.1f} |")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(20)
    return "\n".join(rows)


def _pg_database() -> str | None:
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception:
        return None
    name = f"ns_bench_{uuid.uuid4().hex[:8]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def _drop_pg(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(quick: bool) -> str:
    n = 40_000 if quick else 400_000
    batch = 2_000 if quick else 5_000
    clients = 4
    lines = [
        "## Server: ingest throughput (issue 9)",
        "",
        f"{n:,} samples in batches of {batch:,}; HTTP from {clients} concurrent client "
        "processes (one run each, keep-alive, pre-encoded JSON) into one server; driver = the "
        "same rows through the driver's own `executemany`, one transaction per batch, same "
        "schema, same run. Command: `python -m benchmarks.ingest"
        + (" --quick" if quick else "")
        + "`.",
        "",
        "| backend | driver executemany (rows/s) | noisescope over HTTP (samples/s) "
        "| HTTP / driver |",
        "|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="ns-bench-") as tmp_name:
        tmp = Path(tmp_name)
        sqlite_driver = driver_rate(f"sqlite:///{tmp / 'driver.db'}", n, batch)
        sqlite_http = http_rate(f"sqlite:///{tmp / 'http.db'}", n, batch, clients, workers=1)
        lines.append(
            f"| SQLite (1 worker) | {sqlite_driver:,.0f} | {sqlite_http:,.0f} | "
            f"{sqlite_http / sqlite_driver:.0%} |"
        )
        pg_names = [_pg_database(), _pg_database()]
        if None in pg_names:
            lines.append("| PostgreSQL | unreachable at 127.0.0.1:5432: skipped | | |")
        else:
            try:
                base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
                pg_driver = driver_rate(f"{base}/{pg_names[0]}", n, batch)
                pg_http = http_rate(f"{base}/{pg_names[1]}", n, batch, clients, workers=2)
                lines.append(
                    f"| PostgreSQL (2 workers) | {pg_driver:,.0f} | {pg_http:,.0f} | "
                    f"{pg_http / pg_driver:.0%} |"
                )
            finally:
                for name in pg_names:
                    if name:
                        _drop_pg(name)
        lines += [
            "",
            "Keep-alive latency against a multi-worker server (uvicorn issue 3149: without "
            "TCP_NODELAY on the listening socket each request after the first can stall ~40 ms "
            "on delayed ACKs):",
            "",
            latency_table(tmp, 50 if quick else 300),
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest")
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
