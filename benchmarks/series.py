"""Series query latency at 10k, 100k and 1M samples on SQLite (target: 1M samples in < 200 ms).

One SQLite file holds three runs of 10k, 100k and 1M samples (ingested through the real write
path, ``crud.ingest_samples``, so ``sample_block`` is maintained as in production). For each run
we time ``queries.run_series(max_points=2000)`` (the call the dashboard makes) along steps and
along examples, and the same series over HTTP from a running server (JSON included), and, for
contrast, the naive query: one GROUP BY over every raw sample of the run.

Run: ``python -m benchmarks.series [--quick]`` (quick: 10k and 100k only).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests
from sqlalchemy import Engine, text

from benchmarks.ingest import make_columns
from noisescope_server import crud, db, queries
from tests.support.servers import ServerProcess

MAX_POINTS = 2000
BATCH = 20_000


def _build(engine: Engine, uid: str, n: int) -> None:
    crud.upsert_run(engine, uid, crud.RunIn(project="bench", task="series", batch_size=256))
    for start in range(0, n, BATCH):
        cols = make_columns(min(BATCH, n - start), start, start)
        crud.ingest_samples(
            engine, uid, crud.validate_samples({"columns": cols}, max_samples=BATCH)
        )


def _median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall and CPU (this process) milliseconds of ``fn`` after one warm-up call.

    The CPU figure is what the query costs on an idle core; on a shared, loaded machine the
    wall figure also includes waiting for a core.
    """
    fn()  # warm caches (page cache, statement cache)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def _naive(engine: Engine, uid: str) -> object:
    """Bucket every raw sample in one GROUP BY: the approach without pre-summed blocks."""
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE uid = :u"), {"u": uid}).scalar_one()
        lo, hi = conn.execute(
            text("SELECT min(step), max(step) FROM sample WHERE run_id = :r"), {"r": run_id}
        ).one()
        scale = MAX_POINTS / ((hi - lo) * (1 + 1e-9) or 1)
        return conn.execute(
            text(
                "SELECT CAST((step - :lo) * :s AS INTEGER) AS b, count(*), sum(g_sq_est), "
                "sum(trace_sigma_est), avg(loss), min(step), max(step) FROM sample "
                "WHERE run_id = :r AND series = '' GROUP BY b"
            ),
            {"lo": lo, "s": scale, "r": run_id},
        ).all()


def _measure(engine: Engine, base: str, uid: str, repeats: int) -> dict[str, tuple[float, float]]:
    session = requests.Session()
    return {
        "step": _median_ms(lambda: queries.run_series(engine, uid, max_points=MAX_POINTS), repeats),
        "step_no_iv": _median_ms(
            lambda: queries.run_series(engine, uid, max_points=MAX_POINTS, intervals=False),
            repeats,
        ),
        "examples": _median_ms(
            lambda: queries.run_series(engine, uid, x="examples", max_points=MAX_POINTS),
            repeats,
        ),
        "http": _median_ms(
            lambda: session.get(
                f"{base}/api/v1/runs/{uid}/series", params={"max_points": MAX_POINTS}
            ).raise_for_status(),
            repeats,
        ),
        "naive": _median_ms(lambda: _naive(engine, uid), max(3, repeats // 3)),
    }


def run(quick: bool) -> str:
    sizes = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    repeats = 5 if quick else 9
    rows = [
        "| samples in run | `run_series` x=step | same, `intervals=False` | x=examples "
        "| HTTP GET series | naive GROUP BY over raw samples | points (source) |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="ns-series-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'series.db'}"
        engine = db.make_engine(url)
        db.upgrade(engine)
        build_s = {}
        for n in sizes:
            t0 = time.perf_counter()
            _build(engine, f"run{n}", n)
            build_s[n] = time.perf_counter() - t0
        with ServerProcess(database_url=url) as server:
            for n in sizes:
                uid = f"run{n}"
                result = queries.run_series(engine, uid, max_points=MAX_POINTS)
                assert sum(p.n for p in result.points) == n
                m = _measure(engine, server.url, uid, repeats)

                def cell(key: str, m: dict[str, tuple[float, float]] = m) -> str:
                    wall, cpu = m[key]
                    return f"{wall:.0f} ({cpu:.0f})"

                rows.append(
                    f"| {n:,} | {cell('step')} | {cell('step_no_iv')} | {cell('examples')} "
                    f"| {m['http'][0]:.0f} | {cell('naive')} "
                    f"| {len(result.points)} ({result.source}) |"
                )
        engine.dispose()
    ingest_rate = sum(sizes) / sum(build_s.values())
    return (
        "## Server: series query latency\n\n"
        f"SQLite, one run per size, `max_points={MAX_POINTS}`; median milliseconds of {repeats} "
        "calls after a warm-up, wall (CPU of the querying process in brackets: the cost on an "
        "idle core; the difference is time spent waiting for a core on this shared machine). "
        "Runs of 64k+ samples are bucketed from `sample_block` (exact sums over 64 consecutive "
        "samples, maintained at ingest), shorter ones from the raw samples. `intervals=False` "
        "skips the per-bucket 90% interval. HTTP includes JSON encoding (wall only: the server "
        "is another process). Target: 1M samples < 200 ms. Building the runs through "
        f"`crud.ingest_samples` in-process ran at {ingest_rate:,.0f} samples/s. Command: "
        f"`python -m benchmarks.series{' --quick' if quick else ''}`.\n\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    from benchmarks._cli import main

    sys.exit(main("benchmarks.series", __doc__, run))
