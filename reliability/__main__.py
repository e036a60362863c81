"""``python -m reliability [--quick]``: load, faults, bad input, isolation and browser safety,
measured against real server processes on SQLite and PostgreSQL; writes docs/reliability.md.

Full size (the default): 32 runs x 100 000 samples per backend, PostgreSQL restarted during a
load (the cluster is always restarted/started again in a ``finally``). ``--quick`` runs small
sizes in a few minutes and never restarts PostgreSQL. Sections are written to the report as
they finish, so an interrupted run still leaves what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from noisescope._progress import Progress
from reliability._infra import (
    REPO,
    Server,
    Workdir,
    database,
    engine_for,
    ensure_postgres_running,
    postgres_available,
)

OUT = REPO / "docs" / "reliability.md"
#: The bad-input server's read timeout (s): short, so the slow-body cases take seconds.
READ_TIMEOUT = 3.0
APPENDIX = "Found by this harness and fixed in the product"
#: Each with its regression test in tests/reliability/ (see `git log -- tests/reliability`).
FIXES = [
    "Client: `status().sent` counted samples twice when a spool replay was interrupted "
    "mid-segment (87 200 sent for 80 000 logged with the server SIGKILLed); replays now "
    "resume after the last acknowledged batch (`test_client_accounting.py`).",
    "Client: the backoff computed `2.0**failures`, which overflows after ~1000 failed "
    "retries (hours of outage at the 30 s cap); the sender then failed on every tick "
    "instead of backing off (`test_client_accounting.py`).",
    "Server: a NUL character in a run/project/task name, tag, event kind or series was a 500 "
    "on PostgreSQL; now a 422 naming the field (`test_bad_input.py`).",
    "Server: run search treated `%`, `_` and (on PostgreSQL) `\\` as LIKE syntax, and on "
    "SQLite never matched names with non-ASCII capitals; it is now a literal substring "
    "search on both backends (`test_bad_input.py`).",
    "Server: errors raised by the database driver inside the bulk insert (which uses the "
    "driver's cursor) bypassed the 503 handler; a driver OperationalError is now a 503.",
    "Server: `DELETE /api/v1/tokens/{id}` with an id beyond int64 was a 500 on SQLite "
    "(found by schemathesis); the id is now validated (`test_bad_input.py`).",
    "Server: a NUL character in a query parameter (e.g. `?series=`) was a 500 on PostgreSQL, "
    "and in the CSV export dropped the connection mid-answer (found by schemathesis); a NUL "
    "anywhere in the URL is now a 422, and values the database cannot use are a 422 saying "
    "why (`test_bad_input.py`).",
    "Client: with the spool directory unwritable, every batch of an outage was dropped at "
    "once although the in-memory bound had room; they now stay in memory (bounded by "
    "`memory_max`) until the server is back, and what is left at exit is counted dropped "
    "(`test_client_accounting.py`).",
    "CLI: `noisescope token create --project P --database-url URL` was rejected (the option "
    "was accepted only before the action); both orders work now (`test_cli_options.py`).",
    "Server: on PostgreSQL, `GET /series` of runs with steps near 2^63 (valid steps) was a 422 "
    "blaming the database ('bigint out of range': the bucket multiplied the step span by "
    "max_points); the bucket is computed in NUMERIC there (`test_write_then_read.py`).",
    "Server: samples with `time` (or `examples`) at ±1.7e308 were accepted, and on PostgreSQL "
    "every series on that axis, the compared series and the task's critical batch then "
    "answered 422 ('value out of range: overflow'); `time` is now a Unix time within years "
    "1-9999 and `examples` within [0, 2^960] (`_wire.SAMPLE_RANGES`, `test_bad_input.py`).",
]


@dataclass
class Sizes:
    runs: int
    samples: int
    rate: float
    fault_runs: int
    fault_samples: int
    fault_rate: float
    kills: int
    kill_every: float
    pg_restarts: int
    hostile_bomb: int
    schemathesis: list[str]
    properties: int
    browser_runs: int
    time_limit: float
    #: The paced load: the same number of runs at a rate the server keeps up with.
    paced_samples: int = 20_000
    paced_rate: float = 250.0
    #: Stored, then read: hypothesis examples (random stories written, then read back).
    write_read: int = 200
    #: The read client's decompression bomb: what it unpacks to (bytes).
    client_bomb: int = 256 << 20
    #: Nothing lost without a count (issue 46): samples per run, evaluations per run.
    round3_samples: int = 20_000
    round3_events: int = 50_000

    @classmethod
    def full(cls) -> Sizes:
        return cls(32, 100_000, 1000.0, 8, 20_000, 1000.0, 3, 5.0, 2, 1 << 30,
                   ["-n", "20"], 300, 5, 5400.0)  # fmt: skip

    @classmethod
    def quick(cls) -> Sizes:
        return cls(4, 3000, 1000.0, 3, 3000, 500.0, 2, 2.0, 0, 64 << 20,
                   ["--phases", "fuzzing", "-n", "5"], 60, 1, 600.0, 1000, 200.0,
                   30, 64 << 20, 5000, 12_000)  # fmt: skip


@dataclass
class Report:
    command: str
    sizes: Sizes
    out: Path
    sections: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, bool]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    #: With ``--update``: the earlier report's preamble, kept; re-runs are listed below it.
    preamble: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def load(self) -> None:
        """Take over an existing report, so ``--update`` re-runs replace only their sections."""
        text = self.out.read_text()
        head, *chunks = text.split("\n## ")
        lines = head.splitlines()
        table = lines.index("| check | held |")
        self.preamble = lines[:table]
        marks = [i for i, ln in enumerate(self.preamble) if ln.startswith("Sections re-run")]
        if marks:  # earlier --update notes: keep them as notes, under one heading
            self.notes = [ln for ln in self.preamble[marks[0] :] if ln.startswith("- ")]
            self.preamble = self.preamble[: marks[0]]
        for line in lines[table + 2 :]:
            if line.startswith("| "):
                title, held = (c.strip() for c in line.strip("|").rsplit("|", 1))
                self.verdicts.append((title, held == "yes"))
        for chunk in chunks:
            if not chunk.startswith(APPENDIX):
                self.sections.append("## " + chunk.rstrip("\n") + "\n")

    def add(self, title: str, ok: bool, body: str) -> None:
        section = f"## {title}\n\n{body.strip()}\n"
        titles = [t for t, _ in self.verdicts]
        if title in titles:  # --update: replace the earlier result, and say so
            i = titles.index(title)
            before = "held" if self.verdicts[i][1] else "did NOT hold"
            self.notes.append(
                f"- {title}: re-run by `{self.command}` on "
                f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (in the run above it {before})"
            )
            self.verdicts[i] = (title, ok)
            self.sections[i] = section
        else:
            if self.preamble:  # --update adding a section the earlier run did not have
                self.notes.append(
                    f"- {title}: added by `{self.command}` on "
                    f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
                )
            self.verdicts.append((title, ok))
            self.sections.append(section)
        self.write()
        print(f"[reliability] {title}: {'ok' if ok else 'FAILED'}", file=sys.stderr, flush=True)

    def write(self) -> None:
        s = self.sizes
        took = time.monotonic() - self.started
        head = self.preamble or [
            "# Reliability and security, measured",
            "",
            f"Written by `{self.command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
            f"({platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
            f"{platform.python_version()}; {took / 60:.0f} min). Every figure below comes from "
            "that run; rerun it to reproduce. Client processes, servers and databases are all "
            "on 127.0.0.1. `python -m reliability --quick` runs the same checks at small sizes; "
            "the CI-sized tests are in `tests/reliability/`.",
            "",
            f"Sizes of this run: load {s.runs} runs x {s.samples:,} samples per backend at "
            f"{s.rate:,.0f} samples/s per run; faults {s.fault_runs} runs x "
            f"{s.fault_samples:,} samples at {s.fault_rate:,.0f}/s.",
            "",
        ]
        if self.notes:
            head = [*head, "Sections re-run or added later (`--update`):", "", *self.notes, ""]
        table = [
            "| check | held |",
            "|---|---|",
            *[f"| {t} | {'yes' if ok else '**NO**'} |" for t, ok in self.verdicts],
            "",
        ]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        appendix = f"## {APPENDIX}\n\n" + "\n".join(f"- {fix}" for fix in FIXES) + "\n"
        self.out.write_text(
            "\n".join([*head, *table]) + "\n" + "\n".join([*self.sections, appendix])
        )


def _table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]).replace("|", "\\|") for k in keys) + " |" for r in rows]
    return "\n".join(lines)


Section = Callable[[], tuple[bool, str]]


def _guard(report: Report, title: str, fn: Section, progress: Progress) -> None:
    """Run one section under the progress line, and record its verdict even if it raised."""
    progress.show(title, force=True)
    try:
        ok, body = fn()
    except Exception:
        ok, body = False, f"The scenario itself failed:\n\n```\n{traceback.format_exc()}```"
    progress.clear()  # the verdict's line replaces it
    report.add(title, ok, body)
    progress.advance()


def _workers(backend: str) -> int:
    return 2 if backend == "postgresql" else 1


def paced_section(backend: str, s: Sizes) -> tuple[bool, str]:
    """The same number of runs at a rate below the server's capacity: latency without queueing."""
    return load_section(backend, replace(s, samples=s.paced_samples, rate=s.paced_rate))


def load_section(backend: str, s: Sizes) -> tuple[bool, str]:
    from reliability._load import run_load, summary_row

    wd = Workdir.make(f"load-{backend}")
    try:
        with database(backend, wd.path) as url, Server(url, workers=_workers(backend)) as srv:
            r = run_load(srv, backend=backend, workdir=wd.path, runs=s.runs, samples=s.samples,
                         rate=s.rate, time_limit=s.time_limit)  # fmt: skip
    finally:
        wd.close()
    body = _table([summary_row(r, "load")]) + (
        f"\n\n{r.runs} client processes (the real client: `noisescope.init`, `log_sample`, "
        f"`finish`) against `noisescope server --workers {r.workers}`. stored/s = rows in the "
        "database / wall time from the first client start to the last client exit. Latency: "
        f"every acknowledged samples POST ({len(r.latencies):,} requests: fresh batches of up to "
        "1000 samples, spool replays merged into larger ones; not gzipped, as the server is on "
        "loopback), timed in the client's transport, so it includes queueing in the server "
        "when the offered load exceeds what it takes. Client status at finish: acknowledged "
        f"{r.acknowledged:,}, in spools {r.spooled_at_finish:,} (delivered afterwards by "
        "`noisescope sync`; a spool segment is deleted only once all of it is acknowledged, "
        "and the rows re-sent from a partly replayed one are ignored by the "
        f"server), dropped {r.dropped}. Longest `log_sample` call on a "
        f"training thread: {r.max_log_call_s * 1e3:.1f} ms (the machine was shared; see "
        "docs/benchmarks.md for the hot-path figures)."
    )
    if r.problems:
        body += "\n\nProblems: " + "; ".join(r.problems)
    return r.ok, body


def fault_section(backend: str, s: Sizes, pg_restart: bool) -> tuple[bool, str]:
    from reliability._faults import client_killed, readonly_spool, run_faults
    from reliability._load import postgres_restarts, run_load, server_kills, summary_row

    rows: list[dict[str, str]] = []
    notes: list[str] = []
    ok = True
    wd = Workdir.make(f"faults-{backend}")
    try:
        with database(backend, wd.path) as url, Server(url, workers=_workers(backend)) as srv:
            scenarios = [("server SIGKILLed", server_kills(s.kills, s.kill_every, 1.0))]
            if pg_restart:
                scenarios.append(("PostgreSQL restarted",
                                  postgres_restarts(s.pg_restarts, s.kill_every)))  # fmt: skip
            for i, (label, injector) in enumerate(scenarios):
                sub = wd.path / f"s{i}"
                sub.mkdir()
                try:
                    r = run_load(srv, backend=backend, workdir=sub, runs=s.fault_runs,
                                 samples=s.fault_samples, rate=s.fault_rate, injector=injector,
                                 project=f"faults{i}", time_limit=s.time_limit)  # fmt: skip
                finally:
                    if pg_restart:
                        ensure_postgres_running()
                label = f"{label} x{len(r.faults)}"
                rows.append(summary_row(r, label))
                ok &= r.ok
                notes.append(f"- {label}: " + "; ".join(r.faults + r.problems) + (
                    f"; left in spools at finish {r.spooled_at_finish:,}, delivered by "
                    f"`noisescope sync`" if r.spooled_at_finish else "")
                )  # fmt: skip
            n, rate = s.fault_samples, s.fault_rate * 4
            held, client_rows = run_faults(
                [
                    partial(client_killed, srv, wd.path, samples=n, rate=rate, during_outage=False),
                    partial(client_killed, srv, wd.path, samples=n, rate=rate, during_outage=True),
                    partial(readonly_spool, srv, wd.path, samples=n // 2, rate=rate),
                ]
            )
            ok &= held
    finally:
        wd.close()
    body = (
        _table(rows)
        + "\n\n"
        + "\n".join(notes)
        + "\n\nClient faults (a separate client process; acknowledgements are logged by its "
        "transport as they arrive, so the record survives the SIGKILL):\n\n" + _table(client_rows)
    )
    return ok, body


def client_section(backend: str, s: Sizes) -> tuple[bool, str]:
    """The client's own classes of defect against a real server: hostile run ids (no file
    outside the spool root touched), a hung server and a SIGKILLed client (loss within the
    documented bound), a burst past memory_max (none dropped)."""
    from reliability._faults import burst_overflow, hostile_run_ids, hung_server_kill, run_faults

    wd = Workdir.make(f"client-{backend}")
    try:
        with database(backend, wd.path) as url, Server(url, workers=_workers(backend)) as srv:
            ok, rows = run_faults(
                [
                    partial(hostile_run_ids, srv, wd.path),
                    partial(hung_server_kill, srv, wd.path, rate=s.fault_rate),
                    partial(burst_overflow, srv, wd.path),
                ]
            )
    finally:
        wd.close()
    return ok, _table(rows)


def bad_input_section(backend: str, s: Sizes) -> tuple[bool, str]:
    import json
    import subprocess

    from reliability._hostile import build_corpus, run_corpus, run_roundtrips
    from reliability._raw import run_raw
    from reliability._stored import run_crashed, run_stored

    wd = Workdir.make(f"bad-{backend}")
    env = {"NOISESCOPE_READ_TIMEOUT": str(READ_TIMEOUT)}
    try:
        with database(backend, wd.path) as url, Server(url, log_level="info", env=env) as srv:
            engine = engine_for(url)
            try:
                results, unchanged = run_corpus(srv.url, engine, build_corpus(s.hostile_bomb))
                raw = run_raw(srv.url, READ_TIMEOUT)
                stored = run_stored(srv.url, engine) + run_crashed(srv.url, engine)
            finally:
                engine.dispose()
            trips = run_roundtrips(srv.url)
            report = wd.path / "schemathesis.json"
            cmd = [sys.executable, "-m", "schemathesis.cli", "run",
                   f"{srv.url}/api/v1/openapi.json", "--checks", "not_a_server_error",
                   *s.schemathesis, "--seed", "1", "--workers", "1", "--no-color",
                   "--generation-database", "none", "--report", "json",
                   "--report-json-path", str(report)]  # fmt: skip
            st_run = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
            st = json.loads(report.read_text()) if report.exists() else {}
            log = srv.log()
            five_xx = len(re.findall(r'" 5\d\d\b', log))  # access-log lines of 5xx answers
            tracebacks = log.count("Traceback") + log.count("Exception in ASGI application")
            disconnects = log.count("disconnected before sending its whole")
    finally:
        wd.close()
    rows = [{"input": r.case.name, "request": _short(f"{r.case.method} {r.case.path}"),
             "expected": str(r.case.status), "got": str(r.status),
             "detail": r.detail[:110], "ok": "yes" if r.ok else "NO"} for r in results]  # fmt: skip
    corpus_ok = all(r.ok for r in results) and unchanged
    corpus_ok &= all(r.ok for r in raw) and all(c.ok for c in stored)
    trips_ok = all(t.ok for t in trips)
    raw_rows = [{"raw request": r.name, "expected": f"{r.expected} {r.needle}".strip()[:60],
                 "got": r.got.replace("\r\n", " ")[:110], "ok": "yes" if r.ok else "NO"}
                for r in raw]  # fmt: skip
    stored_rows = [{"check": c.what, "expected": c.expected, "got": c.got,
                    "ok": "yes" if c.ok else "NO"} for c in stored]  # fmt: skip
    cases = st.get("test_cases", {})
    st_ok = st_run.returncode == 0 and not st.get("failures") and cases.get("generated", 0) > 0
    body = (
        f"{len(results)} hostile requests; stored tables (checksum over every sample, block, "
        f"run (with its config and tags), event, project and token row) "
        f"{'unchanged' if unchanged else '**CHANGED**'}.\n\n"
        + _table(rows)
        + f"\n\nOver raw sockets (what an HTTP library will not send; server read timeout "
        f"{READ_TIMEOUT:g} s): {disconnects} clients that vanished were logged as an info line "
        f"each.\n\n"
        + _table(raw_rows)
        + "\n\nRows written around the API (SQLAlchemy) and runs that go silent:\n\n"
        + _table(stored_rows)
        + "\n\nValid but nasty names stored and returned verbatim (project, task, name, series; "
        "search finds exactly that run): "
        + ", ".join(f"{t.what} {'ok' if t.ok else 'NO: ' + t.got[:60]}" for t in trips)
        + f"\n\nschemathesis {st.get('schemathesis_version', '?')} against "
        f"`/api/v1/openapi.json` (`{' '.join(s.schemathesis)}`, check `not_a_server_error`): "
        f"{cases.get('generated', 0)} generated requests over "
        f"{st.get('operations', {}).get('tested', 0)} operations, "
        f"{len(st.get('failures', []))} failures. Server log (info level, access log): "
        f"{five_xx} 5xx answers, {tracebacks} tracebacks."
    )
    if not st_ok:
        body += f"\n\n```\n{st_run.stdout[-3000:]}\n```"
    return corpus_ok and trips_ok and st_ok and five_xx == 0 and tracebacks == 0, body


def outage_section() -> tuple[bool, str]:
    """PostgreSQL stopped and started under load, on a private cluster (nobody else's)."""
    from noisescope_server.db import CONNECT_WAIT
    from reliability._pg_outage import run_outages

    downs = [0.0, 3.0, 2 * CONNECT_WAIT]
    outages = run_outages(downs)
    rows = [{"down (s)": f"{o.down_s:g}", "unavailable (s)": f"{o.window_s:.1f}",
             "answers": o.line(), "slowest request (s)": f"{o.slowest_s:.2f}",
             "slowest failed (s)": f"{o.slowest_failed_s:.2f}"} for o in outages]  # fmt: skip
    short = [o for o in outages if o.window_s < CONNECT_WAIT]
    lost = sum(n for o in outages for k, n in o.answers.items() if not k.isdigit())
    # a short outage may fail only the queries running at the moment of shutdown
    ok = lost == 0 and all(o.answers.get("503", 0) <= 4 for o in short)
    return ok, (
        f"A private PostgreSQL cluster (`initdb` in a temporary directory, its own port) behind "
        f"`noisescope server --workers 2`; 4 senders post 50-sample batches; the cluster is "
        f"stopped (`pg_ctl stop -m fast`), left down, and started. The server retries a refused "
        f"connection for {CONNECT_WAIT:g} s (`db.CONNECT_WAIT`): a shorter outage makes "
        f"requests wait; a query running at the moment of shutdown, and every request of a "
        f"longer outage after its {CONNECT_WAIT:g} s, gets 503 (the client retries it). Answers "
        "counted from the stop to 2 s after the start.\n\n" + _table(rows)
    )


def properties_section(s: Sizes) -> tuple[bool, str]:
    from reliability._properties import run_properties

    results = run_properties(s.properties)
    rows = [{"property (hypothesis)": r.name, "examples": str(r.examples),
             "held": "yes" if r.ok else "NO: " + r.error} for r in results]  # fmt: skip
    return all(r.ok for r in results), _table(rows)


def auth_section(backend: str) -> tuple[bool, str]:
    from reliability._auth import run_auth

    wd = Workdir.make(f"auth-{backend}")
    try:
        with (
            database(backend, wd.path) as url,
            Server(url, auth="all", workers=2, log_level="debug") as srv,
        ):
            result = run_auth(srv, wd.path)
    finally:
        wd.close()
    rows = [{"check": c.what, "expected": c.expected[:60], "got": c.got[:60],
             "held": "yes" if c.ok else "NO"} for c in result.checks]  # fmt: skip
    return result.ok, (
        "Server with `--auth all --workers 2`, debug log level and access log; tokens made "
        "with `noisescope token create`, revoked with `noisescope token revoke`.\n\n" + _table(rows)
    )


def _short(text: str, limit: int = 100) -> str:
    """A long request (201 run ids) as its start and its length, so the table stays readable."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def browser_section(s: Sizes) -> tuple[bool, str]:
    from reliability._browser import PAYLOADS, check_dashboard, seed_runs

    wd = Workdir.make("browser")
    try:
        with database("sqlite", wd.path) as url, Server(url) as srv:
            uids = seed_runs(srv)
            result = check_dashboard(srv.url, uids[: s.browser_runs], wd.path)
    finally:
        wd.close()
    rows = [{"page": k, "result": v} for k, v in result.pages.items()]
    return result.ok, (
        "Runs whose project, task, name, tags, config and layer names are "
        + ", ".join(f"`{p}`" for p in PAYLOADS)
        + ", opened in headless Chromium (Playwright, system chromium). A payload that ran "
        "would set `window.__ns_xss` or open a dialog.\n\n"
        + _table(rows)
        + ("\n\nProblems: " + "; ".join(result.problems) if result.problems else "")
    )


def _log_faults(log: str) -> tuple[int, int]:
    """5xx answers (access-log lines) and tracebacks in a server log."""
    five_xx = len(re.findall(r'" 5\d\d\b', log))
    return five_xx, log.count("Traceback") + log.count("Exception in ASGI application")


def stored_section(backend: str, s: Sizes) -> tuple[bool, str]:
    """Whatever the write path accepts (and rows stored before a rule), every read answers."""
    from reliability._write_read import run_write_read

    wd = Workdir.make(f"stored-{backend}")
    try:
        with database(backend, wd.path) as url, Server(url, log_level="info") as srv:
            engine = engine_for(url)
            try:
                r = run_write_read(srv.url, engine, s.write_read)
            finally:
                engine.dispose()
            five_xx, tracebacks = _log_faults(srv.log())
    finally:
        wd.close()

    def counts(c: Any) -> str:
        return ", ".join(f"{k}: {n:,}" for k, n in sorted(c.items()))

    rows = [{"stored around the API": what, "reads": str(n), "failed": str(bad)}
            for what, n, bad in r.stored]  # fmt: skip
    failures = [{"request": _short(f.request), "got": str(f.status), "detail": f.detail[:110]}
                for f in r.failures[:20]]  # fmt: skip
    body = (
        f"{r.examples} random stories (hypothesis; `harness/write_then_read.py`): each "
        "writes 1 to 4 runs of one project with bodies at the edges of every field (the float "
        "range's ends, int64's, the UTC calendar's, branch plans, parent links, steps up to "
        "2^63 − 1), through PUT, samples, events, PATCH and heartbeat, then asks every read "
        "route about them (the run, its series on each x axis and smoothed, series names, "
        "events, samples.csv, branches, recommendation, the run and task lists, the compared "
        "series, each task's critical batch on each loss source and its forecast). Writes "
        f"answered {counts(r.writes)}; reads {counts(r.reads)} (404s are reads of runs whose "
        "PUT was refused). A read may not be a 5xx, nor a 422 blaming the database for what "
        f"is stored: {len(r.failures)} were. Server log (info level, access log): {five_xx} "
        f"5xx answers, {tracebacks} tracebacks.\n\nRows the write path refuses now, written "
        "around the API as an older server would have stored them, then read by every route:"
        "\n\n" + _table(rows)
    )
    if failures:
        body += "\n\nFailures:\n\n" + _table(failures)
    return r.ok and five_xx == 0 and tracebacks == 0, body


def edges_section(backend: str) -> tuple[bool, str]:
    """Every numeric query parameter at the edges of its type."""
    from reliability._edges import EDGE_VALUES, run_edges

    wd = Workdir.make(f"edges-{backend}")
    try:
        with database(backend, wd.path) as url, Server(url, log_level="info") as srv:
            r = run_edges(srv.url)
            five_xx, tracebacks = _log_faults(srv.log())
    finally:
        wd.close()
    failures = [{"request": _short(q), "got": str(code), "detail": d[:110]}
                for q, code, d in r.failures[:30]]  # fmt: skip
    body = (
        f"Each numeric query parameter of every GET route, found in the server's OpenAPI "
        f"schema ({len(r.parameters)}: " + ", ".join(f"`{p}`" for p in r.parameters) + "), "
        f"one at a time, at each of {len(EDGE_VALUES)} values ("
        + ", ".join(f"`{v}`" for v in EDGE_VALUES)
        + "), against a run with samples and a 3-size sweep: "
        f"{r.requests:,} requests, answered "
        + ", ".join(f"{k}: {n:,}" for k, n in sorted(r.answers.items()))
        + ". The rule: a 2xx, or a 4xx that names the parameter; never a 5xx, nor a 422 that "
        f"blames the database for arithmetic. Broken: {len(r.failures)}. Server log: "
        f"{five_xx} 5xx answers, {tracebacks} tracebacks."
    )
    if failures:
        body += "\n\n" + _table(failures)
    return r.ok and five_xx == 0 and tracebacks == 0, body


def disconnects_section(backend: str) -> tuple[bool, str]:
    """Broken and vanishing bodies against servers with auth on (write, then all)."""
    import httpx

    from reliability._disconnects import run_auth_disconnects

    rows: list[dict[str, str]] = []
    ok = True
    logs = []
    admin = "reliability-admin-token"
    for auth in ("write", "all"):
        wd = Workdir.make(f"disconnects-{backend}")
        env = {"NOISESCOPE_ADMIN_TOKEN": admin, "NOISESCOPE_READ_TIMEOUT": str(READ_TIMEOUT)}
        try:
            with (
                database(backend, wd.path) as url,
                Server(url, auth=auth, log_level="info", env=env) as srv,
            ):
                made = httpx.post(f"{srv.url}/api/v1/projects/proj/tokens",
                                  headers={"Authorization": f"Bearer {admin}"})  # fmt: skip
                results = run_auth_disconnects(srv.url, made.raise_for_status().json()["token"])
                time.sleep(1.0)  # the last answers' log lines
                five_xx, tracebacks = _log_faults(srv.log())
        finally:
            wd.close()
        ok &= all(r.ok for r in results) and five_xx == 0 and tracebacks == 0
        logs.append(f"`--auth {auth}`: {five_xx} 5xx answers, {tracebacks} tracebacks")
        rows += [{"auth": auth, "request": r.name, "expected": " or ".join(r.expected),
                  "got": r.got.replace("\r\n", " ").replace("\n", " ")[:70],
                  "ok": "yes" if r.ok else "NO"} for r in results]  # fmt: skip
    return ok, (
        "Raw requests to `POST /runs/{id}/samples` (and `/events`) whose body breaks its "
        "framing or stops, each 3 times, without a token (refused with 401 before the body is "
        "read, which raced uvicorn's own 400 for a broken chunk and logged `Exception in ASGI "
        "application` every time) and with one (the body is read). Server logs (info level, "
        "access log): " + "; ".join(logs) + ".\n\n" + _table(rows)
    )


def read_client_section(s: Sizes) -> tuple[bool, str]:
    """``noisescope.Api`` against a deliberately broken server."""
    from reliability._read_client import run_read_client

    cases = run_read_client(s.client_bomb)
    rows = [{"kind": c.kind, "server sends": c.name, "raised": c.raised,
             "names the URL": "yes" if c.names_url else "NO", "s": f"{c.seconds:.2f}",
             "peak MiB": f"{c.peak_mib:.1f}", "message": c.message.split(": ", 1)[-1][:80],
             "held": "yes" if c.ok else "NO"} for c in cases]  # fmt: skip
    return all(c.ok for c in cases), (
        "`noisescope.Api` (the dashboard's only reader) against a loopback server that answers "
        "what each case scripts (`harness/broken_http.py`). Held: the call raised an "
        "`ApiError` (or its subclass `AnswerError`, `NotFoundError`), which the dashboard "
        "catches, naming the URL; a trickle ended within the call's timeout + 3 s (it would "
        "take over a minute); the client's Python objects (tracemalloc peak) stayed within "
        "1.25 × `max_answer_bytes` + 16 MiB.\n\n" + _table(rows)
    )


def disk_section() -> tuple[bool, str]:
    from reliability._disk_full import describe, run_disk_full

    ok, rows, skipped = run_disk_full()
    return ok, describe(skipped) + "\n\n" + _table(rows)


def round3_section(backend: str, s: Sizes) -> tuple[bool, str]:
    """Issue 46: whatever goes wrong, what the client accepted is stored, spooled, or dropped
    and counted; the client process's own classes once, with the SQLite section."""
    from reliability._round3 import Round3Sizes, data_classes, process_classes

    sizes = Round3Sizes(s.round3_samples, s.round3_events)
    wd = Workdir.make(f"round3-{backend}")
    try:
        rows = data_classes(backend, wd.path, sizes)
        if backend == "sqlite":
            rows += process_classes(wd.path, sizes)
    finally:
        wd.close()
    body = (
        "Issue 46: every sample or event the client accepted is stored, spooled (delivered by "
        "`noisescope sync`), or dropped and counted (`status().dropped`, "
        "`status().dropped_events`) and said once. Items 1 to 3 against `noisescope server "
        f"--auth write` on {backend} (a project token made with the admin token), the real "
        f"client in the harness's process: item 1 logs {sizes.samples:,} samples per run with "
        "the middle one bad, one run per kind; item 2 logs "
        f"{sizes.events:,} evaluations (`run.log(step=s, eval_loss=...)`) as fast as the client "
        "takes them, with the server up, during an outage only the events requests see (the "
        "transport fails them until the loop is over), and the same with no usable spool (its "
        "root under a file); item 3 revokes the run's token after "
        f"{sizes.samples:,} of {sizes.revoke_samples:,} samples were acknowledged, then "
        "delivers the spool with `noisescope sync --token NEW`. stored: rows in the database, "
        "compared with what was logged seq by seq and by the sums of the values; spooled: in "
        "the run's spool when the client was done (item 2: events in the spool when the outage "
        "ended); status: as the server reads the run."
    )
    if backend == "sqlite":
        body += (
            "\n\nItems 4, 5, 8 and 10 are the client process's own behaviour, the same on "
            "either database: run once, here, against `noisescope server` on SQLite (auth "
            "off), each training process in its own OS process (`python -m "
            "reliability._ending`). For items 4 and 5, spooled is what the ended process left "
            "in its spool and stored is counted after `noisescope sync` of it; logged, for a "
            "signal, is what the loop's progress file said when the process ended (it may "
            "have logged one more). Item 8 counts the runs the server gained (stored) and the "
            "files in the spool folder (spooled). Item 10 looks for the password in "
            "everything the process and `noisescope sync` printed and in every spool file."
        )
    else:
        body += (
            "\n\nItems 4, 5, 8 and 10 (the client process's own behaviour, the same on "
            "either database) run once, on SQLite: see that backend's section."
        )
    return all(r.held for r in rows), body + "\n\n" + _table([r.cells() for r in rows])


def spool_damage_section() -> tuple[bool, str]:
    """Issue 46, item 6: a damaged spool, then ``noisescope sync`` (reliability._spool_damage)."""
    from reliability._spool_damage import run_spool_damage

    wd = Workdir.make("spool-damage")
    try:
        with database("sqlite", wd.path) as url, Server(url) as srv:
            results = run_spool_damage(srv.url, wd.path)
    finally:
        wd.close()
    rows = [{"damage": r.name, "logged": f"{r.logged:,}", "stored": f"{r.stored:,}",
             "set aside": f"{r.set_aside:,}", "dropped (counted)": f"{r.dropped_counted:,}",
             "held": "yes" if r.ok else "**NO**", "note": r.note} for r in results]  # fmt: skip
    return all(r.ok for r in results), (
        "Spools written by the real client (offline), one of each pair of runs damaged one "
        "way, then `noisescope sync` of the spool root to `noisescope server` on SQLite "
        "(`reliability._spool_damage`). Held: every sample but the damaged records' stored, "
        "each damaged record or file named by sync, the other run delivered whole.\n\n"
        + _table(rows)
    )


def round4_server_section(backend: str) -> tuple[bool, str]:
    """Issue 55, the server's items 1 to 4 (reliability._round4_server)."""
    from reliability._round4_server import round4_server, section_body

    ok, rows = round4_server(backend)
    return ok, section_body(backend, rows, _table([r.cells() for r in rows]))


def reads_section() -> tuple[bool, str]:
    """Issue 46, items 9 to 11 on the read side (reliability._round3_reads)."""
    from reliability._round3_reads import run_round3_reads

    wd = Workdir.make("round3-reads")
    try:
        with database("sqlite", wd.path) as url, Server(url, log_level="info") as srv:
            cases = run_round3_reads(srv.url, log=srv.log)
    finally:
        wd.close()
    rows = [{"item": c.item, "case": c.name, "tried": c.tried, "outcome": c.outcome,
             "held": "yes" if c.ok else "**NO**"} for c in cases]  # fmt: skip
    return all(c.ok for c in cases), (
        "Names, sizes, secrets and clocks on the read side, against `noisescope server` on "
        "SQLite (auth off, info log level and access log): each case writes over HTTP what it "
        "needs and reads it back through `noisescope.Api` (and the dashboard's task keys); "
        "`reliability._round3_reads`.\n\n" + _table(rows)
    )


def round4_section() -> tuple[bool, str]:
    """Issue 55, the client's part (reliability._round4)."""
    from reliability._round4 import client_cases, describe

    wd = Workdir.make("round4")
    try:
        with database("sqlite", wd.path) as url, Server(url) as srv:
            rows = client_cases(srv, wd.path)
    finally:
        wd.close()
    return all(r.held for r in rows), describe() + "\n\n" + _table([r.cells() for r in rows])


def _present(module: str) -> bool:
    """Whether an optional section's module is there (being written by someone else); if not,
    its section is left out, and said."""
    if importlib.util.find_spec(module) is not None:
        return True
    print(f"[reliability] {module} is not there: its section is left out", file=sys.stderr)
    return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (minutes)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="%(default)s")
    parser.add_argument(
        "--only",
        default="load,paced,faults,client,bad,stored,edges,disconnects,properties,auth,outage,"
        "browser,readclient,disk,round3,round4server,round4",
        help="comma-separated sections to run (%(default)s); 'bad' is the hostile corpus, raw "
        "sockets, rows stored around the API and crashed runs; 'client' the client's faults "
        "(hostile run ids, a hung server and a killed client, a burst); 'stored' random "
        "accepted writes, then every read; 'edges' numeric edge values on every numeric query "
        "parameter; 'disconnects' broken and vanishing bodies with auth on; 'readclient' "
        "noisescope.Api against a broken server; 'outage' stops a private PostgreSQL cluster "
        "under load; 'disk' the client's spool on a full disk; 'round3' nothing lost without a "
        "count (issue 46), a damaged spool, names, secrets and clocks; 'round4server' token "
        "scopes, deleted runs, changes made on the server and a database newer than the code "
        "(issue 55, the server's items); 'round4' deleted runs, endings during finish(), "
        "refusals and resumed runs (issue 55, the client)",
    )
    parser.add_argument("--runs", type=int, help="load: simulated runs")
    parser.add_argument("--samples", type=int, help="load: samples per run")
    parser.add_argument("--rate", type=float, help="load: samples/s per run (0: unpaced)")
    parser.add_argument("--out", type=Path, default=OUT, help="docs/reliability.md")
    parser.add_argument(
        "--update", action="store_true", help="re-run sections into an existing report"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.runs:
        sizes.runs = args.runs
    if args.samples:
        sizes.samples = args.samples
    if args.rate is not None:
        sizes.rate = args.rate
    only = set(args.only.split(","))
    backends = [b for b in args.backends.split(",") if b]
    if "postgresql" in backends and not postgres_available():
        print("[reliability] PostgreSQL unreachable: running SQLite only", file=sys.stderr)
        backends.remove("postgresql")
    command = "python -m reliability " + " ".join(argv if argv is not None else sys.argv[1:])
    report = Report(command.strip(), sizes, args.out)
    if args.update and args.out.exists():
        report.load()
    todo: list[tuple[str, Section]] = []
    for backend in backends:
        pg = backend == "postgresql" and not args.quick and sizes.pg_restarts > 0
        steps: list[tuple[str, str, Section]] = [
            ("load", "Load", partial(load_section, backend, sizes)),
            ("paced", "Load below saturation", partial(paced_section, backend, sizes)),
            ("faults", "Faults", partial(fault_section, backend, sizes, pg)),
            ("client", "Client faults", partial(client_section, backend, sizes)),
            ("bad", "Bad input", partial(bad_input_section, backend, sizes)),
            ("stored", "Stored, then read", partial(stored_section, backend, sizes)),
            ("edges", "Numeric edge values", partial(edges_section, backend)),
            ("disconnects", "Disconnects with auth on", partial(disconnects_section, backend)),
            ("auth", "Isolation and auth", partial(auth_section, backend)),
            ("round3", "Nothing lost without a count", partial(round3_section, backend, sizes)),
            ("round4server", "Scopes, deleted runs, server-side changes, a newer database",
             partial(round4_server_section, backend)),
        ]  # fmt: skip
        if backend == "postgresql":
            steps.append(("outage", "PostgreSQL outages", outage_section))
        todo += [(f"{title}, {backend}", step) for key, title, step in steps if key in only]
    if "properties" in only:
        todo.append(("Payload validation properties", lambda: properties_section(sizes)))
    if "browser" in only:
        todo.append(("Browser safety (dashboard)", lambda: browser_section(sizes)))
    if "readclient" in only:
        todo.append(("Read client against a broken server", lambda: read_client_section(sizes)))
    if "disk" in only:
        todo.append(("Disk full (the client's spool)", disk_section))
    round3 = "round3" in only and "sqlite" in backends
    if round3 and _present("reliability._spool_damage"):
        todo.append(("A damaged spool, sqlite", spool_damage_section))
    if round3 and _present("reliability._round3_reads"):
        todo.append(("Names, secrets and clocks, sqlite", reads_section))
    if "round4" in only and "sqlite" in backends and _present("reliability._round4"):
        todo.append(("Deleted runs, endings in finish, refusals, resumes, sqlite", round4_section))
    try:
        with Progress(len(todo), "[reliability]") as progress:
            for title, step in todo:
                _guard(report, title, step, progress)
    finally:
        if "postgresql" in backends:
            ensure_postgres_running()
    report.write()
    print(f"[reliability] wrote {args.out}", file=sys.stderr)
    return 0 if all(ok for _, ok in report.verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
