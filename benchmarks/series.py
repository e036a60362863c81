"""The read path beside an earlier commit: series, the run list and one run, same data, in turn.

One SQLite file holds runs of 10k, 100k and 1M samples and 98 more of 10k (101 runs in all),
ingested through the real write path (``crud.ingest_samples``, so ``sample_block`` is
maintained as in production). Two versions of the code read it, side by side in one
invocation:

* current: this checkout's ``client/`` and ``server/``;
* baseline: the ``--baseline`` revision's (default ``BASELINE``, the commit before the series
  read was rewritten a column at a time), exported with ``git archive``.

Each version answers in two ways, in turn with the other (the order flips every round):

* in-process: a worker subprocess per version (``--worker``, the version's code first on
  ``PYTHONPATH``) calls the query the route calls and encodes its answer as the route does
  (``orjson.dumps(queries.run_series(...))``), timed with ``time.process_time``: the CPU a
  request costs, which the other load on this shared machine does not blur;
* HTTP: a real server per version (``python -m noisescope_server``, one worker), timed from a
  client (wall, the latency a user sees) and by the server process's CPU (psutil) over a
  batch of requests.

Every answer's bytes are compared between the versions, and so are the answers on a second
file of small varied runs (loss, lr and examples missing in parts, steps that repeat after a
resume, a stretch without signal, a second series, huge values, a branch run, events) over
a grid of axes, sizes, windows and intervals.

Run: ``python -m benchmarks.series [--quick] [--baseline REV]`` (quick: 100k samples at most,
20 runs, 2 rounds).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks._versions import (
    ROOT,
    Worker,
    code_env,
    export_code,
    reply,
    server_cpu,
    worker_process,
)

#: The commit before the series read was rewritten (issue 32).
BASELINE = "af93a16"
#: An earlier commit whose docs/benchmarks.md measured run_series at 42 ms (10k samples).
EARLIER = "88c53f5"
#: In-process calls per version, case and round.
CALLS = 5
BATCH = 20_000
#: The issue's targets for 2000 points over HTTP (median wall ms): 10k and 1M samples.
TARGETS = {10_000: 40.0, 1_000_000: 100.0}


def _uid(n: int, i: int = 0) -> str:
    return f"s{n}r{i}".ljust(32, "0")


# --- data -------------------------------------------------------------------------------------


def _build(url: str, sizes: list[int], n_small: int) -> float:
    """The series runs and ``n_small`` runs of 10k samples through ``crud``; seconds taken."""
    from benchmarks._ingest_driver import load_runs
    from noisescope_server.crud import RunIn

    run = RunIn(project="bench", task="series", batch_size=256, status="finished")
    runs = [(n, _uid(n)) for n in sizes] + [(10_000, _uid(10_000, i + 1)) for i in range(n_small)]
    return load_runs(url, [(uid, run, n, 1000 * k) for k, (n, uid) in enumerate(runs)], BATCH)


VARIED = ["plain", "noisy", "gaps", "resumed", "tiny", "empty", "huge", "blocks", "child"]


def _build_varied(url: str) -> None:
    """Small runs with every shape the series code branches on."""
    from noisescope_server import crud, db
    from noisescope_server.crud import EventIn

    engine = db.make_engine(url)
    db.upgrade(engine)
    rng = random.Random(7)

    def cols(
        steps: list[int],
        seq0: int = 0,
        g: float = 1.0,
        loss: float = 0.0,
        lr: float = 0.0,
        series: str = "",
        examples: bool = True,
    ) -> dict[str, Any]:
        """Samples at ``steps``; ``loss`` and ``lr``: the share of samples without one."""
        n = len(steps)
        out: dict[str, Any] = {
            "seq": list(range(seq0, seq0 + n)),
            "step": steps,
            "b_small": [64.0] * n,
            "b_big": [256.0] * n,
            "g_small_sq": [(g + 40 / 64) * (1 + 0.8 * rng.random()) for _ in steps],
            "g_big_sq": [(g + 40 / 256) * (1 + 0.8 * rng.random()) for _ in steps],
            "loss": [None if rng.random() < loss else 2 / (1 + 1e-3 * s) for s in steps],
            "lr": [None if rng.random() < lr else 0.1 for _ in steps],
            "time": [1.7e9 + 0.37 * (seq0 + i) for i in range(n)],
            "series": [series] * n,
        }
        if examples:
            out["examples"] = [s * 256.0 for s in steps]
        return out

    def run(uid: str, *parts: dict[str, Any], **extra: Any) -> None:
        spec = crud.RunIn(project="varied", task="t", batch_size=256, status="finished", **extra)
        crud.upsert_run(engine, uid, spec)
        for part in parts:
            batch = crud.validate_samples({"columns": part}, max_samples=BATCH)
            crud.ingest_samples(engine, uid, batch)

    run("plain", cols(list(range(12_000))))
    run("noisy", cols(list(range(9_000)), g=0.002))
    gaps = cols(list(range(8_000)), loss=0.3, lr=0.5)
    run("gaps", gaps, cols(list(range(8_000)), 8_000, g=2.0, loss=1.0, series="layer.0"))
    resumed = list(range(3_000)) + list(range(1_500, 6_000)) + [6_000] * 50
    run("resumed", cols(resumed[:7_000]), cols(resumed[7_000:], 7_000, examples=False))
    run("tiny", cols(list(range(5))))
    run("empty")
    run("huge", cols(list(range(3_000)), g=1e285))
    run("blocks", cols(list(range(20_000)), g=0.5), cols(list(range(20_000, 40_000)), 20_000))
    run("child", cols(list(range(100, 2_100))), parent_uid="plain", branch_step=100)
    evals = [EventIn(step=s, kind="eval", payload={"loss": 2 / (1 + s * 1e-3)}) for s in range(12)]
    crud.ingest_events(engine, "plain", evals)
    change = EventIn(step=30_000, kind="batch_size", payload={"batch_size": 512})
    crud.ingest_events(engine, "blocks", [change])
    engine.dispose()


def _varied_cases() -> list[dict[str, Any]]:
    grid = itertools.product(
        VARIED, ["step", "examples", "time"], [7, 200, 2000], [0.0, 300.0], [True, False]
    )
    cases: list[dict[str, Any]] = [
        {"call": "series", "uid": uid, "x": x, "max_points": mp, "window": w, "intervals": iv}
        for uid, x, mp, w, iv in grid
    ]
    cases += [{"call": "series", "uid": "gaps", "series": "layer.0", "max_points": 50}]
    cases += [{"call": "series", "uid": "plain", "window": 1e9, "max_points": 300}]
    cases += [{"call": "run", "uid": uid} for uid in VARIED] + [{"call": "runs"}]
    cases += [{"call": "compare", "uids": VARIED, "max_points": mp} for mp in (50, 400)]
    return cases


# --- the worker: one version's queries, in-process --------------------------------------------


def _answer(engine: Any, case: dict[str, Any]) -> bytes:
    """The bytes the route would send for ``case`` (the routes encode with orjson)."""
    import orjson

    from noisescope_server import queries

    call = case["call"]
    if call == "series":
        answer: object = queries.run_series(
            engine,
            case["uid"],
            x=case.get("x", "step"),
            max_points=case.get("max_points", 2000),
            series=case.get("series", ""),
            window=case.get("window", 0.0),
            intervals=case.get("intervals", True),
        )
    elif call == "run":
        answer = queries.get_run(engine, case["uid"])
    elif call == "runs":
        answer = queries.list_runs(engine)
    else:
        answer = queries.compare_series(engine, case["uids"], max_points=case["max_points"])
    return orjson.dumps(answer)


def _worker(urls: list[str]) -> int:
    """Answer JSON lines ``{"case", "db", "repeat"}`` with CPU and wall per call and the
    answer's sha256 (``repeat`` 0: the hash only; ``"body": true`` adds the answer itself).
    With ``build URL VARIED_URL SIZES N_SMALL``, write the two files with this version's code
    and end."""
    if urls[0] == "build":
        _build(urls[1], json.loads(urls[3]), int(urls[4]))
        _build_varied(urls[2])
        return 0
    import noisescope
    import noisescope_server
    from noisescope_server import db

    engines = [db.make_engine(url) for url in urls]

    reply({"modules": [noisescope.__file__, noisescope_server.__file__]})
    for line in sys.stdin:
        cmd = json.loads(line)
        engine, case = engines[cmd["db"]], cmd["case"]
        body = _answer(engine, case)  # also the warm-up
        cpu, wall = [], []
        for _ in range(cmd["repeat"]):
            t0, c0 = time.perf_counter(), time.process_time()
            _answer(engine, case)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
        out = {"cpu": cpu, "wall": wall, "sha": hashlib.sha256(body).hexdigest()}
        reply({**out, "body": json.loads(body)} if cmd.get("body") else out)
    return 0


def _ask(worker: Worker, case: dict[str, Any], repeat: int, db: int = 0) -> dict[str, Any]:
    return worker.ask({"case": case, "repeat": repeat, "db": db})


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two JSON answers first differ, as a path (``[3].b_simple_reason``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):  # then the lengths
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
        if len(a) != len(b):
            return f"{where or 'the answer'}: {len(a)} items against {len(b)}"
    return where or "the whole answer"


def _differences(workers: dict[str, Worker], case: dict[str, Any]) -> str | None:
    """Where the versions' answers to ``case`` (on the varied file) differ; None if nowhere."""
    if len({_ask(w, case, repeat=0, db=1)["sha"] for w in workers.values()}) == 1:
        return None
    old, new = (w.ask({"case": case, "repeat": 0, "db": 1, "body": True}) for w in workers.values())
    return f"`{json.dumps(case)}` at `{_first_difference(old['body'], new['body'])}`"


# --- the two versions -------------------------------------------------------------------------


@dataclass
class _Case:
    title: str
    case: dict[str, Any]
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    #: The issue's target for this request (HTTP wall median, ms), if it has one.
    target: float | None = None
    cpu: dict[str, list[float]] = field(default_factory=dict)
    wall: dict[str, list[float]] = field(default_factory=dict)
    http: dict[str, list[float]] = field(default_factory=dict)
    server: dict[str, list[float]] = field(default_factory=dict)
    sha: dict[str, set[str]] = field(default_factory=dict)


def _cases(sizes: list[int], n_runs: int) -> list[_Case]:
    big = sizes[-1]
    cases = []
    for n, mp in [(10_000, 200), *((n, 2000) for n in sizes)]:
        cases.append(
            _Case(
                f"series, {n:,} samples, {mp} points",
                {"call": "series", "uid": _uid(n), "max_points": mp},
                f"/api/v1/runs/{_uid(n)}/series",
                {"max_points": mp},
                TARGETS.get(n) if mp == 2000 else None,
            )
        )
    for n in (10_000, big):
        window = n // 20  # the Run page's default window: 5% of the run's steps
        cases.append(
            _Case(
                f"series, {n:,} samples, 2000 points, window {window:,} (the Run page's default)",
                {"call": "series", "uid": _uid(n), "max_points": 2000, "window": float(window)},
                f"/api/v1/runs/{_uid(n)}/series",
                {"max_points": 2000, "window": window},
            )
        )
    cases.append(_Case(f"GET /runs ({n_runs} runs)", {"call": "runs"}, "/api/v1/runs"))
    cases.append(
        _Case(
            f"GET /runs/{{id}} ({big:,} samples)",
            {"call": "run", "uid": _uid(big)},
            f"/api/v1/runs/{_uid(big)}",
        )
    )
    return cases


def _http(
    base: str, case: _Case, cpu: Callable[[], float], batch: int
) -> tuple[list[float], float, str]:
    """Wall seconds of ``batch`` requests, the server's CPU per request over them, the body's
    sha256 (psutil reads CPU in 10 ms ticks: a batch makes it finer)."""
    import requests

    with requests.Session() as session:
        url = base + case.path
        body = session.get(url, params=case.params).content  # warm: connection, caches
        walls = []
        c0 = cpu()
        for _ in range(batch):
            t0 = time.perf_counter()
            session.get(url, params=case.params).raise_for_status()
            walls.append(time.perf_counter() - t0)
        return walls, (cpu() - c0) / batch, hashlib.sha256(body).hexdigest()


def _measure(
    cases: list[_Case], workers: dict[str, Worker], servers: dict[str, Any], rounds: int
) -> None:
    labels = list(workers)
    for r in range(rounds):
        for c in cases:
            for label in labels if r % 2 == 0 else labels[::-1]:
                # the least of a round's calls: the one other load on the machine slowed least
                got = _ask(workers[label], c.case, repeat=CALLS)
                c.cpu.setdefault(label, []).append(min(got["cpu"]))
                c.wall.setdefault(label, []).append(min(got["wall"]))
                c.sha.setdefault(label, set()).add(got["sha"])
                server = servers[label]
                walls, per_request, sha = _http(server["url"], c, server["cpu"], batch=3)
                c.http.setdefault(label, []).extend(walls)
                c.server.setdefault(label, []).append(per_request)
                c.sha[label].add(sha)


# --- the tables -------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    """Median milliseconds with the q1-q3 range."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{1000 * q[1]:.1f} ({1000 * q[0]:.1f}-{1000 * q[2]:.1f})"


def _ratio(new: list[float], old: list[float]) -> str:
    """Median of the per-round ratios (each new round against the old one beside it), min-max."""
    per_round = [n / o for n, o in zip(new, old, strict=True) if o > 0]
    return f"{statistics.median(per_round):.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"


def _table(cases: list[_Case], base: str) -> list[str]:
    lines = [
        f"| request | in-process CPU ms: {base} | current | current / {base} (per round) "
        f"| HTTP wall ms: {base} | current | server CPU ms per request: {base} | current "
        "| same bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in cases:
        same = len(c.sha["baseline"] | c.sha["current"]) == 1
        lines.append(
            f"| {c.title} | {_ms(c.cpu['baseline'])} | {_ms(c.cpu['current'])} "
            f"| {_ratio(c.cpu['current'], c.cpu['baseline'])} "
            f"| {_ms(c.http['baseline'])} | {_ms(c.http['current'])} "
            f"| {1000 * statistics.median(c.server['baseline']):.1f} "
            f"| {1000 * statistics.median(c.server['current']):.1f} "
            f"| {'yes' if same else 'no'} |"
        )
    return lines


def _per_point(cases: list[_Case], label: str) -> tuple[float, float]:
    """Marginal µs per point (10k samples, 200 -> 2000 points): in-process CPU, HTTP wall."""
    few, many = cases[0], cases[1]
    cpu = statistics.median(many.cpu[label]) - statistics.median(few.cpu[label])
    wall = statistics.median(many.http[label]) - statistics.median(few.http[label])
    return 1e6 * cpu / 1800, 1e6 * wall / 1800


def run(quick: bool = False, baseline: str = BASELINE) -> str:
    from harness import ServerProcess

    sizes = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
    n_small = 17 if quick else 98
    rounds = 2 if quick else 5
    n_runs = len(sizes) + n_small
    with tempfile.TemporaryDirectory(prefix="noisescope-bench-series-") as tmp_name:
        tmp = Path(tmp_name)
        old_root = tmp / "baseline"
        commit = export_code(baseline, old_root)
        roots = {"baseline": old_root, "current": ROOT}
        # each version its own files of the same samples, written by its own write path: the
        # tables differ between revisions (0007 stores a series' name once per run)
        files = {
            label: [f"sqlite:///{tmp / f'{label}.db'}", f"sqlite:///{tmp / f'{label}-varied.db'}"]
            for label in roots
        }
        build_s = _build(files["current"][0], sizes, n_small)
        _build_varied(files["current"][1])
        subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.series", "--worker", "build"),
                *(*files["baseline"], json.dumps(sizes), str(n_small)),
            ],
            cwd=ROOT,
            env=code_env(old_root, ("client", "server")),
            check=True,
        )
        cases = _cases(sizes, n_runs)
        with contextlib.ExitStack() as stack:
            workers, servers = {}, {}
            for label, root in roots.items():
                env = code_env(root, ("client", "server"))
                workers[label] = stack.enter_context(
                    worker_process(
                        label, "benchmarks.series", files[label], env, tmp / f"{label}.log"
                    )
                )
                workers[label].check_modules(root)
                server = stack.enter_context(
                    ServerProcess(
                        database_url=files[label][0], env={"PYTHONPATH": env["PYTHONPATH"]}
                    )
                )
                assert server.proc is not None
                servers[label] = {"url": server.url, "cpu": server_cpu(server.proc.pid)}
            varied = _varied_cases()
            differ = [d for case in varied if (d := _differences(workers, case)) is not None]
            _measure(cases, workers, servers, rounds)
    per_point = {label: _per_point(cases, label) for label in roots}
    met = []
    for c in cases:
        if c.target is not None:
            wall = 1000 * statistics.median(c.http["current"])
            verdict = "met" if wall <= c.target else "missed"
            met.append(f"{c.title}: {wall:.0f} ms (target <= {c.target:.0f}: {verdict})")
    lines = [
        "## Server: series query latency",
        "",
        f"`python -m benchmarks.series{' --quick' if quick else ''}`: this checkout (current) "
        f"beside revision {commit} (the commit before the series read was rewritten a column "
        "at a time), each reading its own SQLite file of the same samples written by its own "
        "write path (the tables differ from migration 0007 on): runs of "
        f"{', '.join(f'{n:,}' for n in sizes)} "
        f"samples and {n_small} more of 10,000 ({n_runs} runs), built through `crud` in "
        f"{build_s:.0f} s. Each version answers in-process (a worker subprocess with its code "
        "first on `PYTHONPATH` calls the query the route calls and encodes the answer with "
        f"orjson, as the route does; `time.process_time`, the least of {CALLS} calls per round) "
        "and over "
        "HTTP (its own `python -m noisescope_server`, one worker: wall from the client, 3 "
        "requests per round; the server process's CPU per request from psutil over the 3). "
        f"{rounds} rounds, the versions alternating (the order flips every round). Medians with "
        "q1-q3; the ratio is the median of the per-round ratios, min-max in brackets. CPU is "
        f"the judge: this {os.cpu_count()}-core machine is shared, so wall times include "
        "waiting for a core. *Same bytes*: every answer of both versions identical.",
        "",
        *_table(cases, commit),
        "",
        "Per point (10,000 samples, 200 -> 2000 points, marginal): "
        + "; ".join(
            f"{commit if label == 'baseline' else label} {cpu:.1f} µs CPU in-process, "
            f"{wall:.1f} µs HTTP wall"
            for label, (cpu, wall) in per_point.items()
        )
        + ". Targets (current, HTTP wall median, 2000 points): "
        + ("; ".join(met) if met else "not measured with --quick")
        + ".",
        "",
        f"What changed since {commit}: each bucket of an answer was built by calls of its own "
        "(a transposition of its rows, conversions, a `NoiseScale`, an `interval_from_blocks` "
        "with its objects); now each column is converted and summed once and every point is "
        "built from the columns, a bucket's interval is `estimators.b_simple_interval` (the "
        "same numbers without the objects), SQLite sorts the buckets once (it sorted again for "
        "the ORDER BY), and a smoothed series no longer computes its buckets' own intervals, "
        "which smoothing never read. What is left: SQLite's sort of the GROUP BY (most of a "
        "1M-sample read), building the frozen `SeriesPoint`s, and for a smoothed read one "
        "`reblock` of its window per point. GET /runs and GET /runs/{id} share only "
        "`block_moments` with this code; their time is the current B_simple and the "
        "divergence check.",
        "",
        f"Answers on a second file of varied runs ({', '.join(VARIED)}: loss, lr and examples "
        "missing in parts, steps repeated after a resume, no signal, a second series, huge "
        "values, a branch run, events), along step, examples and time, 7/200/2000 points, "
        "windows 0 and 300, with and without intervals, and the run list, each run and the "
        f"comparison: {len(varied) - len(differ)} of {len(varied)} byte-identical between the "
        "versions"
        + (": " + ", ".join(differ[:5]) + " differ" if differ else "")
        + f". For an earlier reference: at revision {EARLIER} this section read `run_series` "
        "(in-process, 2000 points) at 42 ms for 10,000 samples and 107 ms for 1M, and HTTP at "
        "48 and 109 ms; its server predates migration 0003, so it cannot serve this file.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return _cli.main_beside("benchmarks.series", __doc__, BASELINE, run, _worker, argv)


if __name__ == "__main__":
    sys.exit(main())
