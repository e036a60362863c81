"""Storage: bytes per sample of a finished run as rows (today's layout) and compacted into
chunks, on SQLite and PostgreSQL, with one series and with 48 per-layer series; and what
compaction costs the paths around it, side by side in one run.

Every sample goes through the server's own write path (``crud.validate_samples`` +
``crud.ingest_samples``, so ``sample_block`` is maintained as in production), then the run is
compacted (``crud.compact_run``). Bytes are those the database uses for the samples: on SQLite
the used pages of the file (page_count - freelist_count) less those of the empty schema; on
PostgreSQL ``pg_total_relation_size`` of ``sample``, ``sample_block``, ``sample_chunk`` and
``run_digest`` (with their indexes and TOAST) after ``VACUUM FULL`` of ``sample``, which hands
the compacted rows' space back to the system as SQLite's freelist keeps it for reuse.

Side by side, alternating rounds:

* ingest: ``crud.ingest_samples`` as it is (which first looks for chunks to reopen around the
  batch) beside the same with that lookup taken out (today's path before compaction existed),
  into fresh runs of one database;
* the series read at 1M samples (2,000 points, as the Run page asks): the run as rows, then
  the same run compacted; and a 20,000-sample run, read sample by sample (decoded chunks);
* the task list (GET /tasks) at 3,000 runs x 200 samples in 120 tasks: this version beside
  the list built from every run's summary (the code before, copied here), runs as rows and
  compacted.

Run: ``python -m benchmarks.storage [--quick]`` (quick: 20,000 samples per cell, 200,000 for
the series read, 600 runs for the task list).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from sqlalchemy import Engine, text

from benchmarks import _cli
from benchmarks.ingest import _drop_pg, _pg_database, make_columns, pg_url
from noisescope_server import crud, db, queries
from noisescope_server.crud import _samples

#: The per-layer series: names as a GPT-2 probe logs them.
_PARTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
LAYERS = [f"layer.transformer.h.{i // 4}.{_PARTS[i % 4]}.weight" for i in range(48)]
BATCH = 10_000


def _engine(url: str) -> Engine:
    engine = db.make_engine(url)
    db.upgrade(engine)
    return engine


def _used_bytes(engine: Engine) -> int:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            tables = ("sample", "sample_block", "sample_chunk", "run_digest")
            total = " + ".join(f"pg_total_relation_size('{t}')" for t in tables)
            return int(conn.execute(text(f"SELECT {total}")).scalar_one())
        page = conn.execute(text("PRAGMA page_size")).scalar_one()
        pages = conn.execute(text("PRAGMA page_count")).scalar_one()
        free = conn.execute(text("PRAGMA freelist_count")).scalar_one()
        return int(page * (pages - free))


def _settle(engine: Engine) -> None:
    """Checkpoint (SQLite) or hand back dead rows' space (PostgreSQL) before measuring."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM FULL sample"))
            conn.execute(text("VACUUM FULL sample_block"))
    else:
        with engine.connect() as conn:
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))


def _ingest(engine: Engine, uid: str, n: int, layers: list[str]) -> None:
    """``n`` samples of one run: one series, or each step logged once per layer."""
    crud.upsert_run(engine, uid, crud.RunIn(project="bench", task="storage", batch_size=256))
    names = layers or [""]
    steps = n // len(names)
    for start in range(0, steps, BATCH):
        count = min(BATCH, steps - start)
        for k, name in enumerate(names):
            cols = make_columns(count, start, seed=k)
            cols["seq"] = [s * len(names) + k for s in cols["seq"]]
            cols["series"] = [name] * count
            crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))


def _run_id(engine: Engine, uid: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM run WHERE uid = :u"), {"u": uid}).scalar_one())


def bytes_cells(url: str, n: int, layers: list[str]) -> tuple[float, float]:
    """Bytes per sample as rows, then compacted, for one run of ``n`` samples."""
    engine = _engine(url)
    _settle(engine)
    empty = _used_bytes(engine)
    _ingest(engine, "cell", n, layers)
    _settle(engine)
    rows = _used_bytes(engine) - empty
    crud.compact_run(engine, _run_id(engine, "cell"))
    _settle(engine)
    packed = _used_bytes(engine) - empty
    engine.dispose()
    return rows / n, packed / n


def _median_time(call: Callable[[], Any], rounds: int) -> float:
    """The median CPU seconds of this process per call: SQLite runs in it, so this is the
    read's whole cost, which the other load on this shared machine does not blur."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return statistics.median(times)


def ingest_rates(url: str, n: int, rounds: int) -> tuple[float, float]:
    """Samples per CPU second through ``crud.ingest_samples`` (SQLite: all in this process):
    as it is, and without the chunk lookup."""
    engine = _engine(url)
    as_is: list[float] = []
    before: list[float] = []
    for r in range(rounds):
        for lookup in (True, False) if r % 2 == 0 else (False, True):
            uid = f"rate-{r}-{lookup}"
            start = time.process_time()
            if lookup:
                _ingest(engine, uid, n, [])
            else:
                with mock.patch.object(_samples, "reopen_chunks", return_value=0):
                    _ingest(engine, uid, n, [])
            (as_is if lookup else before).append(n / (time.process_time() - start))
    engine.dispose()
    return statistics.median(as_is), statistics.median(before)


def series_times(url: str, n: int, rounds: int) -> list[tuple[str, float, float]]:
    """Seconds per read, of a run as rows beside a copy of it compacted, alternating: the
    series (2,000 points) of a long run (blocks) and of a 20,000-sample one (samples), and
    the CSV export of the short one."""
    engine = _engine(url)
    for form in ("rows", "packed"):
        _ingest(engine, f"long-{form}", n, [])
        _ingest(engine, f"short-{form}", 20_000, [])
    for uid in ("long-packed", "short-packed"):
        crud.compact_run(engine, _run_id(engine, uid))

    def reads(form: str) -> list[Callable[[], Any]]:
        return [
            lambda: queries.run_series(engine, f"long-{form}", max_points=2000),
            lambda: queries.run_series(engine, f"short-{form}", max_points=2000),
            lambda: "".join(queries.raw_samples_csv(engine, f"short-{form}")),
        ]

    names = [
        f"series, {n:,}-sample run (blocks)",
        "series, 20,000-sample run (samples)",
        "CSV export, 20,000-sample run",
    ]
    times: dict[str, list[list[float]]] = {"rows": [[], [], []], "packed": [[], [], []]}
    for r in range(rounds):
        for form in ("rows", "packed") if r % 2 == 0 else ("packed", "rows"):
            for i, call in enumerate(reads(form)):
                times[form][i].append(_median_time(call, 1))
    engine.dispose()
    return [
        (name, statistics.median(times["rows"][i]), statistics.median(times["packed"][i]))
        for i, name in enumerate(names)
    ]


def _tasks_from_run_list(engine: Engine) -> list[Any]:
    """GET /tasks as it was built before (every run's whole summary from ``list_runs``, then
    grouped): today's side of the task-list comparison, copied here."""
    runs = queries.list_runs(engine, limit=1_000_000)
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in runs:
        groups.setdefault((r.project, r.task), []).append(r)
    out = []
    for key, members in sorted(groups.items()):
        b_values = [r.b_simple for r in members if r.b_simple is not None]
        median = statistics.median(b_values) if b_values else None
        out.append((key, len(members), sum(r.n_samples for r in members), median))
    return out


def task_list_times(url: str, n_runs: int, rounds: int) -> list[tuple[str, float, float]]:
    """Seconds for the task list (``queries.task_summaries``, what GET /tasks answers) and
    the run list's first 200 runs, beside the list built from every run's summary: the runs
    as rows (finished, not compacted yet), then compacted."""
    engine = _engine(url)
    for i in range(n_runs):
        uid = f"team-{i}"
        crud.upsert_run(engine, uid, crud.RunIn(project="team", task=f"task{i % 120}"))
        cols = make_columns(200, 0, seed=i)
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))
        crud.patch_run(engine, uid, status="finished")
    reads: list[tuple[str, Callable[[], Any]]] = [
        ("task list (this version)", lambda: queries.task_summaries(engine)),
        ("task list from every run's summary (before)", lambda: _tasks_from_run_list(engine)),
        ("run list, first 200", lambda: queries.list_runs(engine)),
    ]
    rows = [_median_time(call, rounds) for _, call in reads]
    for run_id in crud.runs_to_compact(engine, finished_after=0.0):
        crud.compact_run(engine, run_id)
    packed = [_median_time(call, rounds) for _, call in reads]
    engine.dispose()
    return [(name, t, p) for (name, _), t, p in zip(reads, rows, packed, strict=True)]


def run(quick: bool) -> str:
    n = 20_000 if quick else 100_000
    n_series = 200_000 if quick else 1_000_000
    rounds = 3 if quick else 5
    lines = [
        "## Server: storage per sample, rows and compacted",
        "",
        f"One finished run of {n:,} samples through the server's write path, as rows (today's "
        "layout: a `sample` row per sample and the `sample_block` sums) and after compaction "
        "(`sample_chunk`: compressed column chunks per run and series; the block sums stay), "
        "in the same run of the benchmark; with one whole-model series, and with 48 per-layer "
        "series (names like `layer.transformer.h.3.mlp.c_fc.weight`, each step logged once per "
        "layer). The issue's goal: at most 30 B/sample in all four compacted cells. "
        "Command: `python -m benchmarks.storage" + (" --quick" if quick else "") + "`.",
        "",
        "| backend | layout | rows (B/sample) | compacted (B/sample) | compacted / rows |",
        "|---|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="ns-bench-storage-") as tmp_name:
        tmp = Path(tmp_name)
        backends: list[tuple[str, Callable[[str], str]]] = [
            ("SQLite", lambda cell: f"sqlite:///{tmp / f'{cell}.db'}")
        ]
        pg_names: list[str] = []

        def pg(cell: str) -> str:
            name = _pg_database()
            if name is None:
                raise RuntimeError("PostgreSQL unreachable")
            pg_names.append(name)
            return pg_url(name)

        probe = _pg_database()
        if probe is not None:
            _drop_pg(probe)
            backends.append(("PostgreSQL", pg))
        try:
            for backend, url_of in backends:
                for label, layers in (("one series", []), ("48 per-layer series", LAYERS)):
                    rows, packed = bytes_cells(url_of(f"{label[:2]}-bytes"), n, layers)
                    lines.append(
                        f"| {backend} | {label} | {rows:.1f} | {packed:.1f} | {packed / rows:.0%} |"
                    )
            if probe is None:
                lines.append("| PostgreSQL | unreachable at 127.0.0.1:5432: skipped | | | |")
            as_is, before = ingest_rates(backends[0][1]("rates"), n, rounds)
            times = series_times(backends[0][1]("series"), n_series, rounds)
            n_runs = 600 if quick else 3000
            tasks = task_list_times(backends[0][1]("tasks"), n_runs, rounds)
        finally:
            for name in pg_names:
                _drop_pg(name)
    lines += [
        "",
        f"Ingest (SQLite, {n:,} samples per round in batches of {BATCH:,}, {rounds} rounds "
        "alternating, medians of samples per CPU second of the process, which the other load "
        "on this shared machine blurs less than wall time): `crud.ingest_samples` looks for "
        "chunks to reopen around each batch (one indexed lookup; a live run has none), beside "
        "the same path without it.",
        "",
        "| ingest path | samples per CPU second | ratio |",
        "|---|---:|---:|",
        f"| with the chunk lookup (this version) | {as_is:,.0f} | {as_is / before:.2f} |",
        f"| without it (before compaction) | {before:,.0f} | 1.00 |",
        "",
        f"Reads (SQLite, median of {rounds} alternating rounds, CPU seconds): a run as rows beside "
        "a copy of it compacted. Long runs read the block sums either way; a short run "
        "compacted is decoded and summed in Python.",
        "",
        "| read | rows (s) | compacted (s) | compacted / rows |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {t:.4f} | {p:.4f} | {p / t:.2f} |" for name, t, p in times]
    lines += [
        "",
        f"The task list at team size (SQLite, {n_runs:,} finished runs x 200 samples in 120 "
        f"tasks, median of {rounds}, CPU seconds; the issue's goal for GET /tasks: 250 ms): "
        "`queries.task_summaries` reads the runs in one query and each compacted run's "
        "current B_simple from its stored digest; a run not compacted yet (a live one) has "
        "its window read as before.",
        "",
        "| read | runs as rows (s) | compacted (s) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {t:.3f} | {p:.3f} |" for name, t, p in tasks]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.storage", __doc__, run))
