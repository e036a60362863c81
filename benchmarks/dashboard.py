"""Dashboard render time: the Run page on a 1M-sample run and the Compare tasks page on 100 runs,
beside loading the same samples into pandas and plotting them with Altair (the naive way).

Data go in through the server's write path (``crud.ingest_samples``, so ``sample_block`` is
maintained as in production). "Render" is one cold run of the page script in Streamlit's
AppTest with empty caches: SQL, smoothing, intervals, chart specs and the Arrow payload, which
is everything the server does before the browser draws. The naive path reads every sample with
``pandas.read_sql``, takes per-sample ratios and serialises one Altair line chart of all of
them (what reaches the browser). Points shipped are the rows inside the chart payloads.

Run: ``python -m benchmarks.dashboard [--quick]`` (quick: 100k samples, 20 runs of 5k).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import sqlalchemy as sa

from benchmarks.ingest import make_columns
from noisescope_server import crud, db

APP = Path(__file__).resolve().parents[1] / "dashboard" / "noisescope_dashboard"
BATCH = 20_000


def _ingest(engine: sa.Engine, uid: str, n: int, task: str, seed: int) -> None:
    crud.upsert_run(
        engine,
        uid,
        crud.RunIn(project="bench", task=task, name=uid, batch_size=256, status="finished"),
    )
    for start in range(0, n, BATCH):
        cols = make_columns(min(BATCH, n - start), start, seed + start)
        crud.ingest_samples(
            engine, uid, crud.validate_samples({"columns": cols}, max_samples=BATCH)
        )


def _render(
    page: str, url: str, repeats: int, **query: str | list[str]
) -> tuple[float, float, int]:
    """Median wall and CPU seconds of a cold page run (caches cleared), and the most rows one
    chart ships.

    One warm-up run first pays for imports and AppTest's own start-up (component discovery),
    which a running dashboard server has already paid; each timed run then redoes the SQL,
    smoothing, intervals and charts from empty caches.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["NOISESCOPE_DATABASE_URL"] = url
    at = AppTest.from_file(str(APP / "views" / f"{page}.py"), default_timeout=600)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    times = []
    cpus = []
    for _ in range(repeats):
        st.cache_data.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        at.run()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].message}")
    rows = 0
    for element in at.get("vega_lite_chart"):
        for ds in element.proto.datasets:
            rows = max(rows, pa.ipc.open_stream(ds.data.data).read_all().num_rows)
    return statistics.median(times), statistics.median(cpus), rows


def _naive(url: str, run_filter: str) -> tuple[float, float, int]:
    """Every sample into pandas, per-sample ratios, one Altair chart of all of them."""
    t0, c0 = time.perf_counter(), time.process_time()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        frame = pd.read_sql(
            sa.text(
                "SELECT r.uid AS run, s.step, s.g_sq_est, s.trace_sigma_est, s.loss "
                "FROM sample s JOIN run r ON r.id = s.run_id "
                f"WHERE s.series = '' AND {run_filter} ORDER BY r.uid, s.step"
            ),
            conn,
        )
    engine.dispose()
    frame["b_simple"] = frame["trace_sigma_est"] / frame["g_sq_est"]
    with alt.data_transformers.disable_max_rows():
        chart = alt.Chart(frame).mark_line().encode(x="step:Q", y="b_simple:Q", detail="run:N")
        payload = json.dumps(chart.to_dict())
    del payload
    return time.perf_counter() - t0, time.process_time() - c0, len(frame)


def _median(fn: Callable[[], tuple[float, float, int]], repeats: int) -> tuple[float, float, int]:
    results = [fn() for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in results),
        statistics.median(r[1] for r in results),
        results[-1][2],
    )


def run(quick: bool = False) -> str:
    big_n = 100_000 if quick else 1_000_000
    n_runs, per_run = (20, 5_000) if quick else (100, 10_000)
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        engine = db.make_engine(url)
        db.upgrade(engine)
        t0 = time.perf_counter()
        _ingest(engine, "big" + "0" * 29, big_n, "one-big-run", 0)
        for i in range(n_runs):
            _ingest(engine, f"r{i:03d}" + "0" * 28, per_run, f"task{i % 5}", 1000 + i)
        build_s = time.perf_counter() - t0
        engine.dispose()

        rows: list[tuple[str, str, tuple[float, float, int], tuple[float, float, int]]] = []
        big_uid = "big" + "0" * 29
        rows.append(
            (
                f"Run page, one run of {big_n:,} samples",
                f"{big_n:,}",
                _render("run", url, repeats, run=big_uid),
                _median(lambda: _naive(url, f"r.uid = '{big_uid}'"), repeats),
            )
        )
        rows.append(
            (
                f"Compare tasks page, {n_runs} runs x {per_run:,} samples",
                f"{n_runs * per_run:,}",
                _render("compare_tasks", url, repeats, tasks=[f"bench/task{i}" for i in range(5)]),
                _median(lambda: _naive(url, "r.uid LIKE 'r%'"), repeats),
            )
        )
    lines = [
        "## Dashboard: page render time (issue 10)",
        "",
        "`python -m benchmarks.dashboard" + (" --quick" if quick else "") + "`: "
        "cold page render (the page script in AppTest after a warm-up, with empty data caches: "
        "SQL bucketing, smoothing, intervals, chart specs) against reading every sample into "
        "pandas and serialising one Altair chart of them. Median of "
        f"{repeats}; wall time includes waiting for a core on a shared 2-core machine, CPU time "
        f"is this process's (all threads); data built through `crud` in "
        f"{build_s:.0f} s. The dashboard sends at most 2000 points per series (Compare "
        "charts: at most 400 per run).",
        "",
        "| scenario | dashboard wall / CPU (s) | naive pandas + Altair wall / CPU (s) "
        "| naive / dashboard (CPU) | largest chart payload (rows): dashboard | naive |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, _samples, (d_wall, d_cpu, d_rows), (n_wall, n_cpu, n_rows) in rows:
        lines.append(
            f"| {name} | {d_wall:.2f} / {d_cpu:.2f} | {n_wall:.2f} / {n_cpu:.2f} "
            f"| {n_cpu / d_cpu:.1f}x | {d_rows:,} | {n_rows:,} |"
        )
    return "\n".join(lines) + "\n"


__all__: list[Any] = ["run"]


if __name__ == "__main__":
    from benchmarks._cli import main

    sys.exit(main("benchmarks.dashboard", __doc__, run))
