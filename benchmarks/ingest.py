"""End-to-end ingest throughput over HTTP vs the database driver's own executemany.

For SQLite (temp file) and PostgreSQL (a fresh database on 127.0.0.1:5432, skipped if absent):

1. *driver executemany*: the same rows (every stored sample column: the wire columns, the
   series as its number; the per-sample estimates are derived where read, never stored)
   inserted with ``sqlite3`` / ``psycopg`` ``executemany`` into the migrated ``sample`` table, one
   transaction per batch: the storage limit, no HTTP, no validation.
2. *driver, the server's INSERT*: the same rows through the driver with the statement the
   server itself uses (multi-row ``VALUES`` on SQLite, one ``unnest`` per batch on PostgreSQL),
   parameters built beforehand: what is left of the storage limit once the SQL is as good as
   the server's, so the second ratio shows how thin the rest of the path is.
3. *noisescope over HTTP*: a real server (``python -m noisescope_server``) fed by several
   concurrent client processes, each POSTing pre-encoded columnar JSON batches over keep-alive
   connections: parse, validate, estimates, insert-or-ignore, block sums, commit.

The ratio HTTP / driver executemany is the figure of merit (target >= 50%). A second table measures
keep-alive request latency against a multi-worker server: noisescope's own socket (TCP_NODELAY)
beside stock ``uvicorn --workers 2`` (uvicorn issue 3149: ~40 ms stalls per request).

Run: ``python -m benchmarks.ingest [--quick]``.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import requests

from benchmarks import _cli
from benchmarks._ingest_driver import (
    PG_ADMIN,
    driver_rate,
    drop_pg,
    make_columns,
    pg_database,
    prepare_schema,
    sample_rows,
    sqlite_insert_batches,
)
from benchmarks._venv import competitor_python
from harness import ServerProcess, free_port, wait_for_health


def _post_bodies(args: tuple[str, list[bytes], Any]) -> None:
    """One client process: waits at the barrier, then POSTs each JSON body to ``url`` in turn."""
    url, bodies, barrier = args
    session = requests.Session()
    headers = {"Content-Type": "application/json"}
    barrier.wait()
    for body in bodies:
        session.post(url, data=body, headers=headers).raise_for_status()


def _race(jobs: list[tuple[str, list[bytes]]]) -> float | None:
    """Seconds until one forked client per ``(url, bodies)``, all released together, has posted
    all its bodies; None when a client failed."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(jobs) + 1)
    procs = [
        ctx.Process(target=_post_bodies, args=((url, bodies, barrier),)) for url, bodies in jobs
    ]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    took = time.perf_counter() - t0
    return None if any(p.exitcode != 0 for p in procs) else took


def http_rate(server: ServerProcess, n: int, batch: int, clients: int) -> float:
    """Samples/s over HTTP from ``clients`` concurrent processes (fresh runs) into ``server``."""
    per_client = n // clients
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
    urls = [f"{server.url}/api/v1/runs/{uid}/samples" for uid in uids]
    took = _race(list(zip(urls, payloads, strict=True)))
    if took is None:
        raise RuntimeError(f"a client failed; server log:\n{server.log()[-3000:]}")
    total = 0
    for uid in uids:
        total += requests.get(f"{server.url}/api/v1/runs/{uid}").json()["n_samples"]
    if total != per_client * clients:
        raise RuntimeError(f"stored {total} samples, expected {per_client * clients}")
    return per_client * clients / took


@dataclass
class Comparison:
    """Medians over rounds, and the per-round ratios HTTP / driver."""

    driver: float
    driver_server_sql: float
    http: float
    ratios: list[float]
    ratios_server_sql: list[float]
    bytes_per_sample: float


def compare(
    driver_url: str, http_url: str, n: int, batch: int, clients: int, workers: int, rounds: int
) -> Comparison:
    """Alternate driver and HTTP rounds (the machine's load drifts)."""
    drivers: list[float] = []
    drivers_server_sql: list[float] = []
    https: list[float] = []
    with ServerProcess(database_url=http_url, workers=workers) as server:
        for r in range(rounds):
            if r % 2 == 1:
                https.append(http_rate(server, n, batch, clients))
            drivers.append(driver_rate(driver_url, n, batch, r))
            drivers_server_sql.append(driver_rate(driver_url, n, batch, r, statement="server"))
            if r % 2 == 0:
                https.append(http_rate(server, n, batch, clients))
    return Comparison(
        statistics.median(drivers),
        statistics.median(drivers_server_sql),
        statistics.median(https),
        [h / d for h, d in zip(https, drivers, strict=True)],
        [h / d for h, d in zip(https, drivers_server_sql, strict=True)],
        bytes_per_sample(http_url),
    )


def bytes_per_sample(url: str) -> float:
    """On-disk bytes of ``sample`` + ``sample_block`` (tables and indexes) per stored sample."""
    from sqlalchemy import text

    from noisescope_server import db

    engine = db.make_engine(url)
    with engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM sample")).scalar_one()
        if engine.dialect.name == "postgresql":
            size = conn.execute(
                text(
                    "SELECT pg_total_relation_size('sample') "
                    "+ pg_total_relation_size('sample_block')"
                )
            ).scalar_one()
        else:
            page = conn.execute(text("PRAGMA page_size")).scalar_one()
            pages = conn.execute(text("PRAGMA page_count")).scalar_one()
            free = conn.execute(text("PRAGMA freelist_count")).scalar_one()
            size = page * (pages - free)  # whole file: samples dominate it
    engine.dispose()
    return float(size) / max(int(count), 1)


def _ratio_cells(c: Comparison) -> str:
    def ratio(ratios: list[float]) -> str:
        spread = ", ".join(f"{r:.0%}" for r in ratios)
        return f"{statistics.median(ratios):.0%} ({spread})"

    return (
        f"{c.driver:,.0f} | {c.driver_server_sql:,.0f} | {c.http:,.0f} | {ratio(c.ratios)} | "
        f"{ratio(c.ratios_server_sql)} | {c.bytes_per_sample:.0f} |"
    )


def _proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_sample(tmp: Path, n: int, batch: int) -> tuple[float, float, float]:
    """CPU microseconds per row: the driver's executemany and the driver with the server's
    INSERT (this process), and the whole server process per sample over HTTP (one sequential
    client). Unlike wall-clock rates this does not depend much on how busy the machine is."""
    url = f"sqlite:///{tmp / 'cpu-driver.db'}"
    driver_us: list[float] = []
    for statement in ("executemany", "server"):
        run_id = prepare_schema(url, f"cpu-{statement}")
        rows = sample_rows(run_id, make_columns(n, 0, 1))
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        chunks = [rows[i : i + batch] for i in range(0, n, batch)]
        took = sqlite_insert_batches(conn, chunks, statement, time.process_time)
        driver_us.append(took / n * 1e6)
        conn.close()
    with ServerProcess(database_url=f"sqlite:///{tmp / 'cpu-http.db'}") as server:
        assert server.proc is not None
        uid = uuid.uuid4().hex
        requests.put(
            f"{server.url}/api/v1/runs/{uid}", json={"project": "bench", "task": "cpu"}
        ).raise_for_status()
        cols = make_columns(n, 0, 2)
        bodies = [
            orjson.dumps({"columns": {c: v[i : i + batch] for c, v in cols.items()}})
            for i in range(0, n, batch)
        ]
        session = requests.Session()
        c0 = _proc_cpu_s(server.proc.pid)
        for body in bodies:
            session.post(f"{server.url}/api/v1/runs/{uid}/samples", data=body).raise_for_status()
        server_us = (_proc_cpu_s(server.proc.pid) - c0) / n * 1e6
    return driver_us[0], driver_us[1], server_us


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
    prepare_schema(url)
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


def mlflow_rate(tmp: Path, n: int, clients: int) -> float | None:
    """Metric points/s into ``mlflow server`` (SQLite backend) via log-batch, 1000 per request
    (MLflow's limit), from ``clients`` processes; None without the competitors' venv."""
    python, _why_not = competitor_python()
    if python is None:
        return None
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    workdir = tmp / "mlflow"
    workdir.mkdir()
    log = open(workdir / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(python),
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{workdir / 'mlflow.db'}",
            "--default-artifact-root",
            str(workdir / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        exp = requests.post(
            f"{base}/api/2.0/mlflow/experiments/create", json={"name": "bench"}
        ).json()["experiment_id"]
        per_client = n // clients
        payloads = []
        for k in range(clients):
            run = requests.post(
                f"{base}/api/2.0/mlflow/runs/create",
                json={"experiment_id": exp, "start_time": int(time.time() * 1000)},
            ).json()["run"]["info"]["run_id"]
            rng = random.Random(k)
            payloads.append(
                [
                    orjson.dumps(
                        {
                            "run_id": run,
                            "metrics": [
                                {
                                    "key": "b_simple",
                                    "value": rng.random(),
                                    "timestamp": 1_700_000_000_000 + s,
                                    "step": s,
                                }
                                for s in range(i, min(i + 1000, per_client))
                            ],
                        }
                    )
                    for i in range(0, per_client, 1000)
                ]
            )
        took = _race([(f"{base}/api/2.0/mlflow/runs/log-batch", bodies) for bodies in payloads])
        return None if took is None else per_client * clients / took
    finally:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def run(quick: bool) -> str:
    n = 40_000 if quick else 200_000
    batch = 2_000 if quick else 5_000
    clients = 4
    rounds = 2 if quick else 3
    lines = [
        "## Server: ingest throughput",
        "",
        f"{n:,} samples per round in batches of {batch:,}; HTTP from {clients} concurrent "
        "client processes (one run each, keep-alive, pre-encoded JSON) into one server; driver "
        "= the same rows through the driver's own `executemany`, one transaction per batch, "
        "same schema (the issue's target: HTTP >= 50% of it), and through the driver with the "
        "server's own statement (multi-row `VALUES` of 500 rows on SQLite, one `unnest` per "
        "batch on PostgreSQL; parameters built before the clock starts): the stricter "
        f"comparison, how thin the rest of the path is. {rounds} rounds alternating driver "
        "and HTTP (this 2-core machine is shared and its load drifts); medians, and the "
        "per-round ratios in brackets. The HTTP clients run on the same 2 cores as the server. "
        "Command: `python -m benchmarks.ingest" + (" --quick" if quick else "") + "`.",
        "",
        "| backend | driver executemany (rows/s) | driver, the server's INSERT (rows/s) "
        "| noisescope over HTTP (samples/s) | HTTP / executemany (per round) "
        "| HTTP / server's INSERT (per round) | stored bytes/sample |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="ns-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for workers in (1, 2):
            sqlite = compare(
                f"sqlite:///{tmp / f'driver{workers}.db'}",
                f"sqlite:///{tmp / f'http{workers}.db'}",
                n,
                batch,
                clients,
                workers,
                rounds,
            )
            if workers == 1:
                sqlite_http = sqlite.http
            lines.append(
                f"| SQLite ({workers} worker{'s' * (workers > 1)}) | " + _ratio_cells(sqlite)
            )
        driver_us, driver_server_sql_us, server_us = cpu_per_sample(tmp, n, batch)
        cpu_lines = [
            "",
            "CPU per sample, less dependent on the machine's load (SQLite; driver = this "
            "process's CPU for `executemany`, and for the server's multi-row INSERT with its "
            "parameters built beforehand; server = the whole server process's CPU per sample "
            "over HTTP from one sequential client: HTTP, JSON parsing, validation, estimates, "
            "insert-or-ignore, block sums, commit):",
            "",
            "| driver executemany (µs/row) | driver, the server's INSERT (µs/row) "
            "| noisescope server (µs/sample) | executemany / server (the rate ratio one server "
            "core can reach) | server's INSERT / server |",
            "|---:|---:|---:|---:|---:|",
            f"| {driver_us:.2f} | {driver_server_sql_us:.2f} | {server_us:.2f} "
            f"| {driver_us / server_us:.0%} | {driver_server_sql_us / server_us:.0%} |",
        ]
        n_mlflow = min(n, 40_000)
        mlflow = mlflow_rate(tmp, n_mlflow, clients)
        pg_names = [pg_database(), pg_database()]
        if None in pg_names:
            lines.append("| PostgreSQL | unreachable at 127.0.0.1:5432: skipped | | | | | |")
        else:
            try:
                base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
                pg = compare(
                    f"{base}/{pg_names[0]}", f"{base}/{pg_names[1]}", n, batch, clients, 2, rounds
                )
                lines.append("| PostgreSQL (2 workers) | " + _ratio_cells(pg))
            finally:
                for name in pg_names:
                    if name:
                        drop_pg(name)
        lines += cpu_lines
        if mlflow is None:
            lines += [
                "",
                "MLflow: its venv could not be made (see `benchmarks/_venv.py`) or its server "
                "failed: skipped.",
            ]
        else:
            lines += [
                "",
                "Beside MLflow's tracking server (`mlflow server`, SQLite backend, 1 worker; "
                f"{n_mlflow:,} metric points via `log-batch`, 1000 per request, from {clients} "
                "processes): one MLflow metric point is one number, one noisescope sample carries "
                "ten, so counting a sample as one point understates noisescope's advantage.",
                "",
                "| server (SQLite) | points or samples / s | noisescope / MLflow |",
                "|---|---:|---:|",
                f"| `mlflow server` log-batch | {mlflow:,.0f} metric points | 1x |",
                f"| `noisescope server` samples | {sqlite_http:,.0f} samples | "
                f"{sqlite_http / mlflow:.1f}x |",
            ]
        lines += [
            "",
            "Keep-alive latency against a multi-worker server (uvicorn issue 3149: without "
            "TCP_NODELAY on the listening socket each request after the first can stall ~40 ms "
            "on delayed ACKs):",
            "",
            latency_table(tmp, 50 if quick else 300),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.ingest", __doc__, run))
