"""The task list and the Runs page at team size, this checkout beside an earlier revision
(``--baseline``, default 67499fa), on SQLite and PostgreSQL.

* GET /tasks (``queries.task_summaries``, what the route answers) at 3,000 live runs (running,
  not compacted) x 200 samples in 120 tasks: each version in a worker subprocess with its code
  first on ``PYTHONPATH`` (``benchmarks._versions``), both reading the same database, the
  versions alternating round by round; in four states: live runs with no digest (a database
  no digest keeper has looked at yet), after the keeper of this version looked
  (``crud.refresh_digests``: every run's current window and last loss stored), after 10% of
  the runs got a sample since it looked, and after every run did (their digests stale). CPU
  seconds of the worker per call (``time.process_time``; the machine is shared). Beside it,
  what storing a digest with each ingest request would cost: the CPU of reading the digests of
  the runs that just got a one-sample request, over the requests' own.
* The Runs page's first paint at 10,000 runs x 200 samples (100 running, the rest finished, none
  compacted): each version's own server (``python -m noisescope_server``, its compactor off)
  and dashboard (``streamlit run``), a fresh Chromium page per visit (Debian's, through
  Playwright), from ``goto`` to the first table drawn (first paint: the page draws the newest
  runs while it reads the rest) and to the whole list's table (the caption "10,000 of 10,000
  runs" and the table's canvas). One visit first pays the dashboard's imports; each timed
  visit comes after the dashboard's data cache expired (``_data.TTL_S``), as a first visit
  does. Both versions after one compactor round, the baseline first. Beside it, GET
  /runs?limit=10000 (what the page reads), wall from the client.

Run: ``python -m benchmarks.tasks [--quick] [--baseline REV]`` (quick: 600 runs for the task
list, 2,000 for the page, 3 rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks._versions import ROOT, Worker, code_env, export, reply, worker_process

#: main before the Runs page drew the newest runs first and before the server's first
#: compactor round came seconds after start-up.
BASELINE = "67499fa"
TASKS = 120
SAMPLES = 200
#: Of the page's runs, this many are running (the rest finished).
RUNNING = 100
#: Runs on the page whose first paint is the floor (what the page costs with hardly any).
FLOOR_RUNS = 20
#: Seconds of silence after which the task list's worker reads a running run as crashed.
CRASH_AFTER = 1e9


# --- the databases -----------------------------------------------------------------------------


def _build(url: str, n_runs: int, running: int) -> float:
    """``n_runs`` runs of ``SAMPLES`` samples in ``TASKS`` tasks through ``crud``; the first
    ``running`` stay running, the others finish. Seconds taken."""
    from benchmarks._ingest_driver import make_columns
    from noisescope_server import crud, db

    start = time.perf_counter()
    engine = db.make_engine(url)
    db.upgrade(engine)
    for i in range(n_runs):
        uid = f"team-{i:05d}"
        crud.upsert_run(engine, uid, crud.RunIn(project="team", task=f"task{i % TASKS}"))
        cols = make_columns(SAMPLES, 0, seed=i)
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))
        if i >= running:
            crud.patch_run(engine, uid, status="finished")
    engine.dispose()
    return time.perf_counter() - start


@contextlib.contextmanager
def _databases(tmp: Path) -> Iterator[list[tuple[str, Callable[[str], str]]]]:
    """(backend, a fresh database's URL by name): SQLite files, and PostgreSQL databases
    (dropped afterwards) when 127.0.0.1:5432 answers."""
    from benchmarks._ingest_driver import drop_pg, pg_database, pg_url

    made: list[str] = []

    def pg(_: str) -> str:
        name = pg_database()
        if name is None:
            raise RuntimeError("PostgreSQL unreachable")
        made.append(name)
        return pg_url(name)

    backends: list[tuple[str, Callable[[str], str]]] = [
        ("SQLite", lambda name: f"sqlite:///{tmp / f'{name}.db'}")
    ]
    probe = pg_database()
    if probe is not None:
        drop_pg(probe)
        backends.append(("PostgreSQL", pg))
    try:
        yield backends
    finally:
        for name in made:
            drop_pg(name)


def _export(rev: str, dest: Path) -> str:
    """``git archive rev`` of the code a server and a dashboard run (migrations inside the
    server package, where an installed one has them); the short hash."""
    commit = export(rev, dest, ("client", "server", "dashboard", "migrations"))
    (dest / "migrations").rename(dest / "server" / "noisescope_server" / "migrations")
    return commit


# --- the task list: one worker per version -------------------------------------------------------


def _worker(url: str) -> int:
    """Answer JSON lines: ``{"op": "tasks", "repeat": k}`` (CPU and wall of k task lists after
    one untimed, the answer's sha256 and its runs behind), ``{"op": "refresh"}`` (the digest
    keeper's look) and ``{"op": "tick", "every": k, "seq": s}`` (a sample at ``s`` for every
    k-th run, and the CPU of those requests and of reading those runs' digests)."""
    import orjson

    import noisescope
    import noisescope_server
    from benchmarks._ingest_driver import make_columns
    from noisescope_server import crud, db, queries

    engine = db.make_engine(url)
    reply({"modules": [noisescope.__file__, noisescope_server.__file__]})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "tasks":
            # runs silent for 120 s read as crashed, which would change the answers as the
            # benchmark runs: here a running run stays running
            answer = orjson.loads(
                orjson.dumps(queries.task_summaries(engine, crash_after=CRASH_AFTER))
            )
            # the answers compared without n_behind, which the baseline has not
            behind = sum(task.pop("n_behind", 0) for task in answer)
            body = orjson.dumps(answer)
            cpu, wall = [], []
            for _ in range(cmd["repeat"]):
                t0, c0 = time.perf_counter(), time.process_time()
                queries.task_summaries(engine, crash_after=CRASH_AFTER)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - t0)
            sha = hashlib.sha256(body).hexdigest()
            reply({"cpu": cpu, "wall": wall, "sha": sha, "behind": behind})
        elif cmd["op"] == "refresh":
            t0, c0 = time.perf_counter(), time.process_time()
            stored = crud.refresh_digests(engine)
            spent = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
            reply({"stored": stored, **spent})
        elif cmd["op"] == "tick":
            # one more sample for every k-th run: CPU of the ingest requests, and of reading
            # those runs' digests right after (what storing them with each request would add)
            with engine.connect() as conn:
                rows = conn.exec_driver_sql("SELECT id, uid FROM run ORDER BY uid").all()
            ticked = rows[:: cmd["every"]]
            cols = make_columns(1, cmd.get("seq", SAMPLES), seed=0)
            batch = crud.validate_samples({"columns": cols})
            c0 = time.process_time()
            for _, uid in ticked:
                crud.ingest_samples(engine, str(uid), batch)
            ingest = time.process_time() - c0
            c0 = time.process_time()
            with engine.connect() as conn:
                for run_id, _ in ticked:
                    queries.run_digests(conn, [int(run_id)])
            digest = time.process_time() - c0
            reply({"ticked": len(ticked), "ingest": ingest, "digest": digest})
    engine.dispose()
    return 0


def _spread(values: list[float], scale: float = 1000.0, digits: int = 0) -> str:
    """Median with q1-q3, in ms (``scale``)."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{scale * q[1]:.{digits}f} ({scale * q[0]:.{digits}f}-{scale * q[2]:.{digits}f})"


def _agreement(state: Alternated) -> str:
    """Whether both versions answered the same bytes, or how many runs this one had behind."""
    _, same, behind, _ = state
    if same:
        return "same bytes" + (f" ({behind:,} behind)" if behind else "")
    return f"differ: {behind:,} runs behind" if behind else "ANSWERS DIFFER"


def _write_cost(found: dict[str, Any]) -> str:
    """The digests' CPU over the ingest requests' (``op: tick``), as a ratio, both ticks."""
    ticks = [found["tick10"], found["tick_all"]]
    ratio = sum(t["digest"] for t in ticks) / sum(t["ingest"] for t in ticks)
    per = 1000 * sum(t["digest"] for t in ticks) / sum(t["ticked"] for t in ticks)
    return f"{ratio:.1f}x ({per:.2f} ms a digest)"


def _ratio(new: list[float], old: list[float]) -> str:
    """The median of the per-round ratios new/old, min-max in brackets."""
    ratios = [n / o for n, o in zip(new, old, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


#: CPU seconds per task list of each version, whether every answer of both was the same
#: bytes (``n_behind`` aside), this version's ``n_behind`` over all tasks, and the wall
#: seconds (PostgreSQL's own work is in them, not in the CPU).
Alternated = tuple[dict[str, list[float]], bool, int, dict[str, list[float]]]


def _alternate(workers: dict[str, Worker], rounds: int) -> Alternated:
    """Each version's task lists, alternating (the order flips every round)."""
    cpu: dict[str, list[float]] = {label: [] for label in workers}
    wall: dict[str, list[float]] = {label: [] for label in workers}
    shas = set()
    behind = 0
    for r in range(rounds):
        order = list(workers) if r % 2 == 0 else list(workers)[::-1]
        for label in order:
            answer = workers[label].ask({"op": "tasks", "repeat": 1})
            cpu[label] += answer["cpu"]
            wall[label] += answer["wall"]
            shas.add(answer["sha"])
            if label == "current":
                behind = answer["behind"]
    return cpu, len(shas) == 1, behind, wall


def task_list(url: str, roots: dict[str, Path], tmp: Path, rounds: int) -> dict[str, Any]:
    """The three states' CPU per version, the refresh's cost and whether answers agreed."""
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        workers = {}
        for label, root in roots.items():
            env = code_env(root, ("client", "server"))
            log = tmp / f"tasks-{label}.log"
            workers[label] = stack.enter_context(
                worker_process(label, "benchmarks.tasks", [url], env, log)
            )
            workers[label].check_modules(root)
        current = workers["current"]
        out["live"] = _alternate(workers, rounds)
        out["refresh"] = current.ask({"op": "refresh"})
        out["round"] = _alternate(workers, rounds)
        out["tick10"] = current.ask({"op": "tick", "every": 10})
        out["stale"] = _alternate(workers, rounds)
        current.ask({"op": "refresh"})
        out["tick_all"] = current.ask({"op": "tick", "every": 1, "seq": SAMPLES + 1})
        out["every"] = _alternate(workers, rounds)
    return out


# --- the Runs page's first paint ---------------------------------------------------------------

#: Seconds of each visit to the first table drawn and to the whole table, and of GET /runs.
Paint = tuple[list[float], list[float], list[float]]


def _visit(browser: Any, base: str, caption: str) -> tuple[float, float]:
    """Seconds from ``goto`` to the first table drawn (the newest runs, where the page draws
    them first) and to the whole list's table (its caption and its canvas)."""
    from harness.dashboard_stack import READY

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        start = time.perf_counter()
        page.goto(f"{base}/runs", wait_until="domcontentloaded")
        page.wait_for_selector("[data-testid='stDataFrame'] canvas", timeout=180_000)
        first = time.perf_counter() - start
        page.wait_for_selector(f"text={caption}", timeout=180_000)
        page.wait_for_selector("[data-testid='stDataFrame'] canvas", timeout=180_000)
        whole = time.perf_counter() - start
        page.wait_for_selector(READY, timeout=180_000)
        return first, whole
    finally:
        page.close()


def first_paint(url: str, n_runs: int, root: Path | None, visits: int, chromium: str) -> Paint:
    """Seconds to the Runs page's first paint and to its whole table (``visits`` of each) and
    of GET /runs, with the server and dashboard of the checkout at ``root`` (None: this
    one)."""
    import httpx
    from playwright.sync_api import sync_playwright

    from harness import dashboard_stack
    from harness.servers import ServerProcess
    from noisescope_dashboard import _data

    env = {"NOISESCOPE_COMPACT_EVERY": "0"}
    if root is not None:
        env["PYTHONPATH"] = code_env(root, ("client", "server"))["PYTHONPATH"]
    caption = f"{n_runs:,} of {n_runs:,} runs"
    paints: list[float] = []
    wholes: list[float] = []
    gets: list[float] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ns-bench-page-")))
        server = stack.enter_context(ServerProcess(url, env=env, log_path=tmp / "server.log"))
        base = stack.enter_context(
            dashboard_stack.dashboard(server.url, tmp / "dashboard.log", code=root)
        )
        playwright = stack.enter_context(sync_playwright())
        browser = dashboard_stack.browser(playwright, chromium)
        stack.callback(browser.close)
        _visit(browser, base, caption)  # the dashboard's imports, once
        for _ in range(visits):
            time.sleep(_data.TTL_S + 0.5)  # the data cache expired: read anew
            first, whole = _visit(browser, base, caption)
            paints.append(first)
            wholes.append(whole)
            start = time.perf_counter()
            httpx.get(f"{server.url}/api/v1/runs", params={"limit": n_runs}, timeout=300)
            gets.append(time.perf_counter() - start)
    return paints, wholes, gets


def _refresh(url: str) -> None:
    from noisescope_server import crud, db

    engine = db.make_engine(url)
    crud.refresh_digests(engine)
    engine.dispose()


# --- the section -------------------------------------------------------------------------------


def run(quick: bool = False, baseline: str = BASELINE) -> str:
    from harness.dashboard_stack import chromium

    n_tasks_runs = 600 if quick else 3000
    n_page_runs = 2000 if quick else 10_000
    rounds = 3 if quick else 7
    visits = 3 if quick else 5
    browser = chromium()
    lists: dict[str, dict[str, Any]] = {}
    pages: dict[str, dict[str, Paint]] = {}
    builds: dict[str, tuple[float, float]] = {}
    floor: Paint = ([], [], [])
    with tempfile.TemporaryDirectory(prefix="ns-bench-tasks-") as tmp_name:
        tmp = Path(tmp_name)
        old_root = tmp / "baseline"
        commit = _export(baseline, old_root)
        roots = {"baseline": old_root, "current": ROOT}
        with _databases(tmp) as backends:
            for backend, url_of in backends:
                url = url_of("tasks")
                built = _build(url, n_tasks_runs, running=n_tasks_runs)
                lists[backend] = task_list(url, roots, tmp, rounds)
                page_s = 0.0
                if browser is not None:
                    url = url_of("page")
                    page_s = _build(url, n_page_runs, running=RUNNING)
                    _refresh(url)  # the digest keeper's look: the digests both versions read
                    pages[backend] = {
                        "baseline": first_paint(url, n_page_runs, old_root, visits, browser)
                    }
                    pages[backend]["current"] = first_paint(url, n_page_runs, None, visits, browser)
                    if backend == "SQLite":  # what the page costs with hardly any runs
                        url = url_of("floor")
                        _build(url, FLOOR_RUNS, running=1)
                        _refresh(url)
                        floor = first_paint(url, FLOOR_RUNS, None, visits, browser)
                builds[backend] = (built, page_s)
    return _section(
        quick, commit, (n_tasks_runs, n_page_runs), rounds, visits, lists, pages, builds, floor
    )


def _section(
    quick: bool,
    commit: str,
    sizes: tuple[int, int],
    rounds: int,
    visits: int,
    lists: dict[str, dict[str, Any]],
    pages: dict[str, dict[str, Paint]],
    builds: dict[str, tuple[float, float]],
    floor: Paint,
) -> str:
    # (here, not at the top: the workers import this module with the baseline's code first)
    from noisescope_server.compactor import DIGEST_EVERY
    from noisescope_server.queries import STALE_READ_LIMIT

    n_tasks_runs, n_page_runs = sizes
    backends = list(lists)
    head = "| | " + " | ".join(backends) + " |"
    rule = "|---|" + "---:|" * len(backends)
    states = [
        ("live", "live runs, no digest (a database no keeper has looked at yet)"),
        ("round", "after the digest keeper looked"),
        ("stale", "after 10% of the runs got a sample since it looked"),
        ("every", "after every run got a sample since it looked"),
    ]
    rows = []
    for key, words in states:
        for label, name in (("baseline", commit), ("current", "this version")):
            cells = [_spread(lists[b][key][0][label]) for b in backends]
            rows.append(f"| {words}: {name} | " + " | ".join(cells) + " |")
        ratios = [_ratio(lists[b][key][0]["current"], lists[b][key][0]["baseline"]) for b in lists]
        same = [_agreement(lists[b][key]) for b in backends]
        walls = [
            f"{_spread(lists[b][key][3]['baseline'])} / {_spread(lists[b][key][3]['current'])}"
            for b in backends
        ]
        rows.append(f"| {words}: ratio | " + " | ".join(ratios) + " |")
        rows.append(f"| {words}: wall ms, {commit} / this version | " + " | ".join(walls) + " |")
        rows.append(f"| {words}: answers of both | " + " | ".join(same) + " |")
    refresh = [
        f"{lists[b]['refresh']['wall']:.1f} s wall, {lists[b]['refresh']['cpu']:.1f} s CPU "
        f"({lists[b]['refresh']['stored']:,} digests)"
        for b in backends
    ]
    rows.append("| the keeper storing every run's digest | " + " | ".join(refresh) + " |")
    write_cost = [_write_cost(lists[b]) for b in backends]
    rows.append(
        "| a digest stored with each ingest request instead: its CPU over the request's "
        "(one sample) | " + " | ".join(write_cost) + " |"
    )
    lines = [
        "## Server: the task list and the Runs page at team size",
        "",
        f"`python -m benchmarks.tasks{' --quick' if quick else ''}`: this checkout beside "
        f"revision {commit} (`--baseline`), each in its own worker subprocess with its code "
        "first on `PYTHONPATH`, reading the same database. The issue's goals: GET /tasks at "
        "most 250 ms at 3,000 runs, the Runs page's first paint at most 3 s with 10,000 runs.",
        "",
        f"GET /tasks (`queries.task_summaries`, what the route answers) at {n_tasks_runs:,} "
        f"live runs (running, not compacted) x {SAMPLES} samples in {TASKS} tasks (built "
        + ", ".join(f"{b} in {builds[b][0]:.0f} s" for b in backends)
        + f"): CPU ms of the worker per call, median (q1-q3) of {rounds} rounds, the versions "
        "alternating; the ratio is this version / the baseline, the median of the per-round "
        "ratios (min-max); beside them the wall ms of the same calls (PostgreSQL's own work is "
        "in them, not in the worker's CPU; on a shared machine they include waiting for a "
        "core). A digest (`run_digest`) holds a run's current window and last loss "
        "for the sample counts it was read at; both versions read a digest whose counts still "
        "match. The baseline reads every other run's window from its samples; this version "
        f"reads at most {STALE_READ_LIMIT} of them (the farthest behind first) and takes the "
        "others' digests as stored, counted in `TaskSummary.n_behind` (the answers compare "
        "without it). Its digest keeper (`crud.refresh_digests`) stores the digests of the "
        f"runs that got samples every {DIGEST_EVERY:g} s in a server (the baseline's "
        "compactor, every `compact_every`: 60 s by default); here the benchmark calls it. "
        "Last row: what storing a run's digest in each ingest request would cost instead, "
        "the CPU of reading the digests of the runs that just got a one-sample request over "
        "the requests' own through the write path (`crud.ingest_samples`, no HTTP).",
        "",
        head,
        rule,
        *rows,
    ]
    if not pages:
        lines += ["", "The Runs page: Chromium is not installed (apt-get install chromium)."]
        return "\n".join(lines) + "\n"
    page_rows = []
    for label, name in (("baseline", commit), ("current", "this version")):
        paint = [_spread(pages[b][label][0], 1.0, 2) for b in pages]
        whole = [_spread(pages[b][label][1], 1.0, 2) for b in pages]
        get = [_spread(pages[b][label][2], 1.0, 2) for b in pages]
        page_rows.append(f"| first paint (s): {name} | " + " | ".join(paint) + " |")
        page_rows.append(f"| the whole table (s): {name} | " + " | ".join(whole) + " |")
        page_rows.append(f"| GET /runs (s): {name} | " + " | ".join(get) + " |")
    lines += [
        "",
        f"The Runs page's first paint at {n_page_runs:,} runs x {SAMPLES} samples ({RUNNING} "
        f"running, none compacted; built "
        + ", ".join(f"{b} in {builds[b][1]:.0f} s" for b in pages)
        + f"): seconds from `goto` to the first table drawn (first paint: the newest "
        "runs, where the page draws them before it has read the rest) and to the whole list's "
        f"table, median (q1-q3) of {visits} visits, each "
        "a fresh Chromium page after the dashboard's data cache expired; GET /runs?limit="
        f"{n_page_runs} (what the page reads) right after each visit, wall from the client. "
        "Wall time on a shared machine: it includes waiting for a core.",
        "",
        "| | " + " | ".join(pages) + " |",
        "|---|" + "---:|" * len(pages),
        *page_rows,
    ]
    if floor[0]:
        lines += [
            "",
            f"The page with hardly any runs, the same way: {FLOOR_RUNS} runs on SQLite, drawn "
            f"whole at once (filters included) in {_spread(floor[0], 1.0, 2)} s (GET /runs "
            f"{_spread(floor[2], 1.0, 2)} s): Streamlit's script run, the websocket and "
            "Chromium's drawing, whatever the runs; the first table of the newest runs comes "
            "before the filters, so it can come sooner.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = _cli.parser("benchmarks.tasks", __doc__)
    parser.add_argument(
        "--baseline", default=BASELINE, metavar="REV", help="the earlier revision (%(default)s)"
    )
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.worker[0])
    print(run(args.quick, args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
