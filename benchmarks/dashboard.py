"""Dashboard render time through the HTTP API, beside the dashboard that read the database.

Pages: the Run page on a 1M-sample run, the Compare tasks page on 100 runs (5 tasks) and the
Runs page (all 101 runs). Data go in through the server's write path (``crud.ingest_samples``,
so ``sample_block`` is maintained as in production) into one SQLite file.

Two dashboards render the same pages from that file, side by side in one invocation:

* new: today's pages (``dashboard/noisescope_dashboard/views``), which read every number from
  a real server (``python -m noisescope_server``, started on the file) through
  ``noisescope.Api`` (``NOISESCOPE_URL``);
* old: the pages of the ``--baseline`` revision (default ``3df171c``, the last before the
  rewrite), which read the database directly (``NOISESCOPE_DATABASE_URL``). Its ``client/``,
  ``server/``, ``dashboard/`` and ``migrations/`` are exported with ``git archive`` and put
  first on ``PYTHONPATH``, so ``noisescope``, ``noisescope_server`` and ``noisescope_dashboard``
  are the old code (each worker reports its modules' files; they are checked).

Each dashboard is a worker subprocess (``--worker``) that keeps one AppTest per page. "Render"
is one cold run of the page script: one warm-up run first pays for imports and AppTest's own
start-up (which a running dashboard has already paid), then every timed run starts from empty
data caches (``st.cache_data.clear()``), as a first visit does. The timed runs alternate old and
new, page by page. CPU time is the judge (the machine is shared): the worker's process time,
plus, for the new dashboard, the server process's (and its children's) CPU time over the same
render, read with psutil. Wall time is context.

Run: ``python -m benchmarks.dashboard [--quick] [--baseline REV] [--profile]`` (quick: 100k
samples, 20 runs of 5k, 2 repeats; ``--profile``: after the table, on stderr, each new page's
API calls (wall, dashboard CPU and server CPU per call) and cProfile of the new and the old
page's script thread).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _cli, _versions
from benchmarks._versions import ROOT, Worker, code_env, export, reply, worker_process

VIEWS = Path("noisescope_dashboard") / "views"
BASELINE = "3df171c"
TARGET = 1.5
BATCH = 20_000
#: Prefix of a worker's answers on its stdout (anything else there is ignored).
BIG_UID = "big" + "0" * 29


def _uid(i: int) -> str:
    return f"r{i:03d}" + "0" * 28


# --- data -------------------------------------------------------------------------------------


def _build(url: str, big_n: int, n_runs: int, per_run: int) -> float:
    """Ingest the runs through ``crud``; seconds taken."""
    from benchmarks._ingest_driver import load_runs
    from noisescope_server.crud import RunIn

    def run(uid: str, task: str) -> RunIn:
        return RunIn(project="bench", task=task, name=uid, batch_size=256, status="finished")

    small = [(_uid(i), run(_uid(i), f"task{i % 5}"), per_run, 1000 + i) for i in range(n_runs)]
    return load_runs(url, [(BIG_UID, run(BIG_UID, "one-big-run"), big_n, 0), *small], BATCH)


# --- the worker: one dashboard's pages in AppTest ----------------------------------------------


def _worker(views: Path, server_pid: int | None) -> int:
    """Answer render commands (JSON lines on stdin) with timings (``MARK`` + JSON on stdout)."""
    import cProfile
    import pstats

    import pyarrow as pa  # type: ignore[import-untyped]
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import noisescope
    import noisescope_dashboard
    import noisescope_server

    server_cpu = _versions.server_cpu(server_pid) if server_pid else lambda: 0.0

    def check(at: AppTest, page: str) -> dict[str, int]:
        """Fail on an exception or an error message; count what the page drew."""
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].message}")
        if at.error:
            raise RuntimeError(f"{page}: error shown: {at.error[0].value}")
        chart_rows = [
            pa.ipc.open_stream(ds.data.data).read_all().num_rows
            for element in at.get("vega_lite_chart")
            for ds in element.proto.datasets
        ]
        table_rows = [len(frame.value) for frame in at.dataframe]
        shown = {
            "charts": len(at.get("vega_lite_chart")),
            "chart_rows": max(chart_rows, default=0),
            "table_rows": max(table_rows, default=0),
        }
        if not shown["charts"] and not shown["table_rows"]:
            said = "; ".join(str(w.value) for w in [*at.warning, *at.info]) or "nothing"
            raise RuntimeError(f"{page}: no chart and no table; the page said: {said}")
        return shown

    calls: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def api_calls() -> Iterator[None]:
        """Time ``noisescope.Api``'s public methods: wall, own CPU and server CPU per call."""
        api_cls = noisescope.Api
        saved = {n: f for n, f in vars(api_cls).items() if not n.startswith("_") and callable(f)}
        depth = [0]
        for name, fn in saved.items():

            def wrapped(*args: Any, _fn: Any = fn, _name: str = name, **kwargs: Any) -> Any:
                if depth[0]:
                    return _fn(*args, **kwargs)
                depth[0] = 1
                s0, t0, c0 = server_cpu(), time.perf_counter(), time.thread_time()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    calls.append(
                        {
                            "call": _name,
                            "wall": time.perf_counter() - t0,
                            "cpu": time.thread_time() - c0,
                            "server": server_cpu() - s0,
                        }
                    )
                    depth[0] = 0

            setattr(api_cls, name, wrapped)
        try:
            yield
        finally:
            for name, fn in saved.items():
                setattr(api_cls, name, fn)

    @contextlib.contextmanager
    def profiled(profile: cProfile.Profile) -> Iterator[None]:
        """Profile AppTest's script thread (started inside ``at.run()``), wall clock."""

        def start(*_: Any) -> None:
            sys.setprofile(None)
            if threading.current_thread().name == "ScriptRunner.scriptThread":
                profile.enable()

        threading.setprofile(start)
        try:
            yield
        finally:
            threading.setprofile(None)

    reply(
        {
            "modules": [
                str(m.__file__) for m in (noisescope, noisescope_server, noisescope_dashboard)
            ]
        }
    )
    tests: dict[str, AppTest] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        page, mode = cmd["page"], cmd.get("mode", "time")
        at = tests.get(page)
        if at is None:
            at = AppTest.from_file(str(views / f"{page}.py"), default_timeout=600)
            for key, value in cmd["query"].items():
                at.query_params[key] = value
            at.run()  # warm-up: imports, AppTest start-up
            check(at, page)
            tests[page] = at
        profile = cProfile.Profile()
        calls.clear()
        with contextlib.ExitStack() as stack:
            if mode == "calls":
                stack.enter_context(api_calls())
            elif mode == "profile":
                stack.enter_context(profiled(profile))
            st.cache_data.clear()
            s0, t0, c0, h0 = (
                server_cpu(),
                time.perf_counter(),
                time.process_time(),
                time.thread_time(),
            )
            at.run()
            harness = time.thread_time() - h0
            wall, cpu, srv = time.perf_counter() - t0, time.process_time() - c0, server_cpu() - s0
        answer: dict[str, Any] = {
            "wall": wall,
            "cpu": cpu,
            "server": srv,
            "harness": harness,  # AppTest's main thread, polling for the script's end
            "calls": list(calls),
            **check(at, page),
        }
        if mode == "profile":
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            stats.sort_stats("tottime").print_stats(cmd.get("top", 25))
            stats.sort_stats("cumulative").print_stats(cmd.get("top", 25))
            answer["profile"] = out.getvalue()
        reply(answer)
    return 0


def _render(worker: Worker, page: str, query: dict[str, Any], mode: str = "time") -> dict[str, Any]:
    """One cold render; ``mode`` "calls" also times each API call, "profile" runs cProfile."""
    return worker.ask({"page": page, "query": query, "mode": mode})


def _dashboard(
    label: str, root: Path, env: dict[str, str], log: Path, pid: int | None = None
) -> contextlib.AbstractContextManager[Worker]:
    """The dashboard of the checkout at ``root`` in a worker, running that checkout's code."""
    args = [str(root / "dashboard" / VIEWS)] + ([] if pid is None else ["--server-pid", str(pid)])
    env = code_env(root, ("client", "server", "dashboard"), **env)
    return worker_process(label, "benchmarks.dashboard", args, env, log)


# --- the comparison -----------------------------------------------------------------------


@dataclass
class _Page:
    name: str
    title: str
    new_query: dict[str, Any]
    old_query: dict[str, Any]
    old: list[dict[str, Any]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)


def _pages(big_n: int, n_runs: int, per_run: int) -> list[_Page]:
    tasks = [f"bench/task{i}" for i in range(5)]
    return [
        _Page("run", f"Run page, one run of {big_n:,} samples", {"run": BIG_UID}, {"run": BIG_UID}),
        _Page(
            "compare_tasks",
            f"Compare tasks page, {n_runs} runs x {per_run:,} samples in 5 tasks",
            {"tasks": tasks},
            {"tasks": tasks},
        ),
        _Page("runs", f"Runs page, {n_runs + 1} runs", {}, {}),
    ]


def _fmt_range(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def _payload(shown: dict[str, Any]) -> str:
    if shown["charts"]:
        return f"{shown['chart_rows']:,}"
    return f"table {shown['table_rows']:,}"


def _table(pages: list[_Page]) -> tuple[list[str], list[float]]:
    lines = [
        "| page | old, direct database: wall / CPU (s) | old CPU min–max "
        "| new, API: wall (s) | new CPU: dashboard + server = total (s) | new CPU min–max "
        "| new / old (CPU) | per-repeat ratios | target ≤ 1.5x "
        "| largest chart payload (rows): old | new |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    ratios = []
    for p in pages:
        old_cpu = [r["cpu"] for r in p.old]
        new_dash = [r["cpu"] for r in p.new]
        new_srv = [r["server"] for r in p.new]
        new_tot = [r["cpu"] + r["server"] for r in p.new]
        ratio = statistics.median(new_tot) / statistics.median(old_cpu)
        ratios.append(ratio)
        per_repeat = [n / o for n, o in zip(new_tot, old_cpu, strict=True)]
        lines.append(
            f"| {p.title} "
            f"| {statistics.median(r['wall'] for r in p.old):.2f} / "
            f"{statistics.median(old_cpu):.2f} | {_fmt_range(old_cpu)} "
            f"| {statistics.median(r['wall'] for r in p.new):.2f} "
            f"| {statistics.median(new_dash):.2f} + {statistics.median(new_srv):.2f} = "
            f"{statistics.median(new_tot):.2f} | {_fmt_range(new_tot)} "
            f"| {ratio:.2f}x | {min(per_repeat):.2f}–{max(per_repeat):.2f} "
            f"| {'met' if ratio <= TARGET else 'missed'} "
            f"| {_payload(p.old[-1])} | {_payload(p.new[-1])} |"
        )
    return lines, ratios


def _where(page: _Page, timed: dict[str, Any]) -> str:
    """One line: a render's CPU per API call (server + dashboard) and the page's own share."""
    per_call: dict[str, list[float]] = {}
    for call in timed["calls"]:
        server, dash = per_call.setdefault(call["call"], [0.0, 0.0])
        per_call[call["call"]] = [server + call["server"], dash + call["cpu"]]
    in_calls = sum(dash for _, dash in per_call.values())
    ranked = sorted(per_call.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    parts = [
        f"`{name}` {server:.2f} + {dash:.2f}"
        for name, (server, dash) in ranked
        if server + dash >= 0.01
    ]
    small = [server + dash for _, (server, dash) in ranked if server + dash < 0.01]
    if small:
        parts.append(f"{len(small)} other call{'s' if len(small) > 1 else ''} {sum(small):.2f}")
    return (
        f"- {page.title}: {timed['server'] + timed['cpu']:.2f} s in all; "
        + ", ".join(parts)
        + f"; the page's own work (frames, charts, Streamlit) {timed['cpu'] - in_calls:.2f} s."
    )


def _print_profile(page: _Page, new: Worker, old: Worker) -> None:
    """Where a cold render's time goes: the new page's API calls (timed, not profiled), then
    cProfile of the new and the old page's script thread (wall clock, so waiting for the server
    shows as socket reads; cProfile slows the code it profiles)."""
    err = sys.stderr
    timed = _render(new, page.name, page.new_query, mode="calls")
    print(f"\n=== {page.name} page, new: one cold render, API calls timed ===", file=err)
    print(
        f"dashboard CPU {timed['cpu']:.3f} s (of which AppTest's main thread, waiting: "
        f"{timed['harness']:.3f} s), server CPU {timed['server']:.3f} s, "
        f"wall {timed['wall']:.3f} s",
        file=err,
    )
    print(f"{'API call':<24}{'wall s':>9}{'dash CPU s':>12}{'server CPU s':>14}", file=err)
    for call in timed["calls"]:
        print(
            f"{call['call']:<24}{call['wall']:>9.3f}{call['cpu']:>12.3f}{call['server']:>14.3f}",
            file=err,
        )
    for label, worker, query in (("new", new, page.new_query), ("old", old, page.old_query)):
        answer = _render(worker, page.name, query, mode="profile")
        print(f"\n=== {page.name} page, {label}: cProfile of the script thread ===", file=err)
        print(answer["profile"], file=err)


def run(quick: bool = False, baseline: str = BASELINE, profile: bool = False) -> str:
    from harness import ServerProcess

    big_n = 100_000 if quick else 1_000_000
    n_runs, per_run = (20, 5_000) if quick else (100, 10_000)
    repeats = 2 if quick else 3
    pages = _pages(big_n, n_runs, per_run)
    with tempfile.TemporaryDirectory(prefix="noisescope-bench-dashboard-") as tmp_name:
        tmp = Path(tmp_name)
        url = f"sqlite:///{tmp / 'bench.db'}"
        build_s = _build(url, big_n, n_runs, per_run)
        old_root = tmp / "baseline"
        commit = export(baseline, old_root, ("client", "server", "dashboard", "migrations"))
        with ServerProcess(database_url=url) as server:
            assert server.proc is not None
            with (
                _dashboard(
                    "old", old_root, {"NOISESCOPE_DATABASE_URL": url}, tmp / "old.log"
                ) as old,
                _dashboard(
                    "new", ROOT, {"NOISESCOPE_URL": server.url}, tmp / "new.log", server.proc.pid
                ) as new,
            ):
                old.check_modules(old_root)
                new.check_modules(ROOT)
                for i in range(repeats):
                    for page in pages:
                        sides = [(old, page.old_query, page.old), (new, page.new_query, page.new)]
                        for worker, query, results in sides[:: 1 if i % 2 == 0 else -1]:
                            results.append(_render(worker, page.name, query))
                table, ratios = _table(pages)
                # where each page over the target spends its CPU: one more cold render of the
                # new page with every API call timed (not profiled, so not slowed)
                where = [
                    _where(page, _render(new, page.name, page.new_query, mode="calls"))
                    for page, ratio in zip(pages, ratios, strict=True)
                    if ratio > TARGET
                ]
                if profile:
                    for page in pages:
                        _print_profile(page, new, old)
    renders = [r for p in pages for r in p.old + p.new]
    harness_s = max(r["harness"] for r in renders)
    harness_share = max(r["harness"] / (r["cpu"] + r["server"]) for r in renders)
    lines = [
        "## Dashboard: page render time",
        "",
        "`python -m benchmarks.dashboard" + (" --quick" if quick else "") + "`: "
        "each page rendered cold (the page script in Streamlit's AppTest, after one warm-up "
        "run, with empty data caches) by the dashboard as it is now, which reads every number "
        "from a real server (`python -m noisescope_server`, one worker) through `noisescope.Api`, "
        f"beside the dashboard of revision {commit} (before the rewrite), which read the "
        "database directly; same SQLite file, built through `crud` in "
        f"{build_s:.0f} s, old and new renders alternating. Median of {repeats}, with the "
        "min–max of the CPU figures; *per-repeat ratios* pair each new render with the old one "
        "next to it. CPU time is the judge: the dashboard process's (all threads, AppTest's "
        "main thread too, which polls until the script ends: at most "
        f"{harness_s:.2f} s, {100 * harness_share:.0f}% of a render's CPU), plus, for the new "
        "path, the server process's over the same render (psutil, 10 ms ticks); wall time includes "
        f"waiting for a core on a shared {os.cpu_count()}-core machine and, for the new path, "
        f"for the server's answers. Target: new / old total CPU ≤ {TARGET}x. The largest chart "
        "payload is the most rows one chart ships to the browser (the Runs page has no chart: "
        "its table's rows).",
        "",
        *table,
    ]
    if where:
        lines += [
            "",
            "Where the CPU goes on the pages over the target (one more cold render of the new "
            "page, each `noisescope.Api` call timed; server CPU + dashboard CPU per call):",
            "",
            *where,
        ]
    return "\n".join(lines) + "\n"


__all__: list[Any] = ["run"]


def main(argv: list[str] | None = None) -> int:
    parser = _cli.parser("benchmarks.dashboard", __doc__)
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="REV",
        help="the revision whose dashboard read the database (default %(default)s)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile each new page after the table (stderr)"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(args.worker, args.server_pid)
    print(run(args.quick, args.baseline, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
