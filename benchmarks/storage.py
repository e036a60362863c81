"""Storage: bytes per sample of a finished run as rows (the live layout) and compacted into
chunks, on SQLite and PostgreSQL, with one series and with 48 per-layer series; ingest and the
reads around it; each beside an earlier commit's code (``--baseline``, default ``BASELINE``:
main before the series names were stored once and the per-sample estimates dropped), side by
side in one run.

Every sample goes through the server's own write path (``crud.validate_samples`` +
``crud.ingest_samples``, so ``sample_block`` is maintained as in production), then the run is
compacted (``crud.compact_run``). Bytes are those the database uses for the samples: on SQLite
the used pages of the file (page_count - freelist_count) less those of the empty schema; on
PostgreSQL ``pg_total_relation_size`` of the sample tables (``sample``, ``sample_block``,
``sample_chunk``, ``run_digest`` and ``series`` where it exists, with their indexes and TOAST)
after ``VACUUM FULL`` of ``sample`` and ``sample_block``, which hands the compacted rows' space
back to the system as SQLite's freelist keeps it for reuse.

Each version runs in a worker subprocess of its own (``--worker``; the baseline's code exported
with ``git archive``, first on ``PYTHONPATH``; this checkout's as installed), on databases of
its own (each version's schema), alternating rounds (the order flips every round):

* bytes per sample, each cell once per version;
* ingest: ``crud.ingest_samples`` of a fresh run per round (CPU seconds of the worker on
  SQLite, which runs in it; wall seconds on PostgreSQL, whose server does the work);
* the series read at 1M samples (2,000 points, as the Run page asks) and of a 20,000-sample run
  (sample by sample), and the CSV export of the short one, each as rows and compacted;
* the task list (GET /tasks) at 3,000 runs x 200 samples in 120 tasks, this version only:
  beside the list built from every run's summary (the code before, copied here), runs as rows
  and compacted.

Run: ``python -m benchmarks.storage [--quick] [--baseline REV]`` (quick: 20,000 samples per
cell, 200,000 for the series read, 600 runs for the task list).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, inspect, text

from benchmarks import _cli
from benchmarks._ingest_driver import PG_ADMIN, drop_pg, make_columns, pg_database
from benchmarks._versions import ROOT, Worker, code_env, export_code, reply, worker_process
from noisescope_server import crud, db, queries

#: main before the series names were stored once and the per-sample estimates dropped.
BASELINE = "22e08bf"

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
            tables = {"sample", "sample_block", "sample_chunk", "run_digest", "series"}
            tables &= set(inspect(conn).get_table_names())
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


#: The reads timed per version, by index: (label, run, what).
READS = (
    ("series, {n:,}-sample run (blocks)", "long", "series"),
    ("series, 20,000-sample run (samples)", "short", "series"),
    ("CSV export, 20,000-sample run", "short", "csv"),
)


def build_reads(engine: Engine, n: int) -> None:
    """The runs the reads time: a long (``n``) and a short run, as rows and compacted."""
    for form in ("rows", "packed"):
        _ingest(engine, f"long-{form}", n, [])
        _ingest(engine, f"short-{form}", 20_000, [])
    for uid in ("long-packed", "short-packed"):
        crud.compact_run(engine, _run_id(engine, uid))


#: Calls per read and round: the least is the round's time (the load of this shared machine
#: only ever adds CPU time: the same read measured 0.063 to 0.15 s within a minute).
CALLS = 3


def read_once(engine: Engine, index: int, form: str) -> float:
    """CPU seconds of a read of ``READS[index]`` of the run as ``form`` (rows, packed): the
    least of ``CALLS`` calls."""
    _, run, what = READS[index]
    uid = f"{run}-{form}"
    if what == "csv":
        return _least_time(lambda: "".join(queries.raw_samples_csv(engine, uid)), CALLS)
    return _least_time(lambda: queries.run_series(engine, uid, max_points=2000), CALLS)


def _least_time(call: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times)


def _worker(_args: list[str]) -> int:
    """One version's side: answers JSON lines (``cmd``: bytes, ingest, build, read)."""
    import noisescope
    import noisescope_server

    reply({"modules": [noisescope.__file__, noisescope_server.__file__]})
    engines: dict[str, Engine] = {}

    def engine_of(url: str) -> Engine:
        if url not in engines:
            engines[url] = _engine(url)
        return engines[url]

    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "bytes":
            rows, packed = bytes_cells(cmd["url"], cmd["n"], LAYERS if cmd["layers"] else [])
            reply({"rows": rows, "packed": packed})
        elif cmd["cmd"] == "ingest":
            engine = engine_of(cmd["url"])
            cpu, wall = time.process_time(), time.perf_counter()
            _ingest(engine, cmd["uid"], cmd["n"], [])
            reply({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall})
        elif cmd["cmd"] == "build":
            build_reads(engine_of(cmd["url"]), cmd["n"])
            reply({})
        else:
            reply({"cpu": read_once(engine_of(cmd["url"]), cmd["index"], cmd["form"])})
    for engine in engines.values():
        engine.dispose()
    return 0


def _alternating(workers: dict[str, Worker], rounds: int) -> list[list[tuple[str, Worker]]]:
    """The versions' order per round: as given, then reversed, and so on."""
    pairs = list(workers.items())
    return [pairs if r % 2 == 0 else pairs[::-1] for r in range(rounds)]


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


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run(quick: bool = False, baseline: str = BASELINE) -> str:
    n = 20_000 if quick else 100_000
    n_series = 200_000 if quick else 1_000_000
    rounds = 3 if quick else 5
    n_runs = 600 if quick else 3000
    with tempfile.TemporaryDirectory(prefix="ns-bench-storage-") as tmp_name:
        tmp = Path(tmp_name)
        pg_names: list[str] = []

        def sqlite(cell: str) -> str:
            return f"sqlite:///{tmp / f'{cell}.db'}"

        def pg(cell: str) -> str:
            name = pg_database()
            if name is None:
                raise RuntimeError("PostgreSQL unreachable")
            pg_names.append(name)
            base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
            return f"{base}/{name}"

        backends: list[tuple[str, Callable[[str], str]]] = [("SQLite", sqlite)]
        probe = pg_database()
        if probe is not None:
            drop_pg(probe)
            backends.append(("PostgreSQL", pg))
        commit = export_code(baseline, tmp / "baseline")
        envs = {
            "baseline": code_env(tmp / "baseline", ("client", "server")),
            "current": code_env(ROOT, ()),  # this checkout as installed (its migrations too)
        }
        envs["current"].pop("PYTHONPATH")
        try:
            with contextlib.ExitStack() as stack:
                workers: dict[str, Worker] = {}
                for label, env in envs.items():
                    workers[label] = stack.enter_context(
                        worker_process(label, "benchmarks.storage", [], env, tmp / f"{label}.log")
                    )
                workers["baseline"].check_modules(tmp / "baseline")
                workers["current"].check_modules(ROOT)
                cells = _bytes_rows(workers, backends, n)
                ingest = _ingest_rows(workers, backends, n, rounds)
                reads = _read_rows(workers, sqlite, n_series, rounds)
            tasks = task_list_times(sqlite("tasks"), n_runs, rounds)
        finally:
            for name in pg_names:
                drop_pg(name)
    return _section(quick, commit, n, n_series, rounds, n_runs, cells, ingest, reads, tasks)


def _bytes_rows(
    workers: dict[str, Worker], backends: list[tuple[str, Callable[[str], str]]], n: int
) -> list[tuple[str, str, dict[str, dict[str, float]]]]:
    """Per backend and layout, each version's (rows, packed) bytes per sample."""
    out = []
    for backend, url_of in backends:
        for label, layers in (("one series", False), ("48 per-layer series", True)):
            found = {}
            for version, worker in workers.items():
                cmd = {"cmd": "bytes", "url": url_of(f"{version}-{label[:2]}"), "n": n}
                found[version] = worker.ask({**cmd, "layers": layers})
            out.append((backend, label, found))
    return out


def _ingest_rows(
    workers: dict[str, Worker],
    backends: list[tuple[str, Callable[[str], str]]],
    n: int,
    rounds: int,
) -> list[tuple[str, dict[str, float]]]:
    """Per backend, each version's median samples per second (CPU on SQLite, wall on
    PostgreSQL), a fresh run per round in one database per version."""
    out = []
    for backend, url_of in backends:
        urls = {version: url_of(f"{version}-rates") for version in workers}
        rates: dict[str, list[float]] = {version: [] for version in workers}
        for r, order in enumerate(_alternating(workers, rounds)):
            for version, worker in order:
                got = worker.ask({"cmd": "ingest", "url": urls[version], "n": n, "uid": f"r{r}"})
                rates[version].append(n / got["cpu" if backend == "SQLite" else "wall"])
        out.append((backend, {version: _median(v) for version, v in rates.items()}))
    return out


def _read_rows(
    workers: dict[str, Worker], sqlite: Callable[[str], str], n: int, rounds: int
) -> list[tuple[str, dict[str, dict[str, float]]]]:
    """Per read, each version's median CPU seconds of the run as rows and compacted."""
    urls = {version: sqlite(f"{version}-reads") for version in workers}
    for version, worker in workers.items():
        worker.ask({"cmd": "build", "url": urls[version], "n": n})
    times: dict[str, dict[str, list[list[float]]]] = {
        v: {f: [[] for _ in READS] for f in ("rows", "packed")} for v in workers
    }
    for order in _alternating(workers, rounds):
        for version, worker in order:
            for form in ("rows", "packed"):
                for index in range(len(READS)):
                    cmd = {"cmd": "read", "url": urls[version], "index": index, "form": form}
                    times[version][form][index].append(worker.ask(cmd)["cpu"])
    return [
        (
            label.format(n=n),
            {v: {f: _median(times[v][f][i]) for f in ("rows", "packed")} for v in workers},
        )
        for i, (label, _, _) in enumerate(READS)
    ]


def _section(
    quick: bool,
    commit: str,
    n: int,
    n_series: int,
    rounds: int,
    n_runs: int,
    cells: list[tuple[str, str, dict[str, dict[str, float]]]],
    ingest: list[tuple[str, dict[str, float]]],
    reads: list[tuple[str, dict[str, dict[str, float]]]],
    tasks: list[tuple[str, float, float]],
) -> str:
    command = "python -m benchmarks.storage" + (" --quick" if quick else "")
    lines = [
        "## Server: storage per sample, rows and compacted",
        "",
        f"One finished run of {n:,} samples through the server's write path, as rows (the "
        "live layout: a `sample` row per sample and the `sample_block` sums) and after "
        "compaction (`sample_chunk`: compressed column chunks per run and series; the block "
        "sums stay); with one whole-model series, and with 48 per-layer series (names like "
        "`layer.transformer.h.3.mlp.c_fc.weight`, each step logged once per layer). This "
        "version (a row stores the wire columns and its series' number; the names once per run "
        f"in `series`, the per-sample estimates derived where read) beside {commit} (each row "
        "with its series' name and both estimates), each in a worker process of its own on "
        "databases of its own, in the same run of the benchmark. The issue's goal: at most 30 "
        f"B/sample in all four compacted cells. Command: `{command}`.",
        "",
        f"| backend | layout | rows, {commit} (B/sample) | rows (B/sample) | rows / {commit} "
        f"| compacted, {commit} (B/sample) | compacted (B/sample) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for backend, label, found in cells:
        old, new = found["baseline"], found["current"]
        lines.append(
            f"| {backend} | {label} | {old['rows']:.1f} | {new['rows']:.1f} | "
            f"{new['rows'] / old['rows']:.0%} | {old['packed']:.1f} | {new['packed']:.1f} |"
        )
    if not any(backend == "PostgreSQL" for backend, _, _ in cells):
        lines.append("| PostgreSQL | unreachable at 127.0.0.1:5432: skipped | | | | | |")
    lines += [
        "",
        f"Ingest ({n:,} samples per round in batches of {BATCH:,} through "
        f"`crud.ingest_samples`, a fresh run per round, {rounds} rounds, the versions "
        "alternating; medians): on SQLite samples per CPU second of the worker, which runs "
        "the database too (the other load on this shared machine blurs it less than wall "
        "time); on PostgreSQL samples per wall second (its server does much of the work).",
        "",
        f"| backend | {commit} (samples/s) | this version (samples/s) | this / {commit} |",
        "|---|---:|---:|---:|",
    ]
    for backend, rates in ingest:
        was, now = rates["baseline"], rates["current"]
        unit = "CPU" if backend == "SQLite" else "wall"
        lines.append(f"| {backend} ({unit}) | {was:,.0f} | {now:,.0f} | {now / was:.2f} |")
    lines += [
        "",
        f"Reads (SQLite, CPU seconds of the worker: the least of {CALLS} calls per round, the "
        f"median of {rounds} rounds, the versions alternating): "
        "each version's run as rows beside a copy of it compacted. Long runs read the block "
        "sums either way; a short run is read sample by sample, as rows in SQL (in this "
        "version the estimates as SQL from the estimators' formula, in "
        f"{commit} the stored ones) and compacted in Python over the decoded chunks; the "
        "CSV export reads each sample (in this version its estimates derived in Python).",
        "",
        f"| read | rows, {commit} (s) | rows (s) | rows / {commit} | compacted, {commit} (s) "
        "| compacted (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, found in reads:
        old, new = found["baseline"], found["current"]
        lines.append(
            f"| {name} | {old['rows']:.4f} | {new['rows']:.4f} | "
            f"{new['rows'] / old['rows']:.2f} | {old['packed']:.4f} | {new['packed']:.4f} |"
        )
    lines += [
        "",
        f"The task list at team size (SQLite, this version, {n_runs:,} finished runs x 200 "
        f"samples in 120 tasks, median of {rounds}, CPU seconds; the issue's goal for GET "
        "/tasks: 250 ms): `queries.task_summaries` reads the runs in one query and each "
        "compacted run's current B_simple from its stored digest; a run not compacted yet (a "
        "live one) has its window read as before.",
        "",
        "| read | runs as rows (s) | compacted (s) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {t:.3f} | {p:.3f} |" for name, t, p in tasks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return _cli.main_beside("benchmarks.storage", __doc__, BASELINE, run, _worker, argv)


if __name__ == "__main__":
    sys.exit(main())
