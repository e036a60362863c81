"""The sections of ``python -m reliability``: each runs its scenario against real server
processes (or in this process) and returns its verdict and its Markdown body."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

from reliability._infra import (
    Server,
    Workdir,
    database,
    engine_for,
    ensure_postgres_running,
)
from reliability._report import Sizes, markdown_table

#: The bad-input server's read timeout (s): short, so the slow-body cases take seconds.
READ_TIMEOUT = 3.0


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
    body = markdown_table([summary_row(r, "load")]) + (
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
        markdown_table(rows)
        + "\n\n"
        + "\n".join(notes)
        + "\n\nClient faults (a separate client process; acknowledgements are logged by its "
        "transport as they arrive, so the record survives the SIGKILL):\n\n"
        + markdown_table(client_rows)
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
    return ok, markdown_table(rows)


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
        + markdown_table(rows)
        + f"\n\nOver raw sockets (what an HTTP library will not send; server read timeout "
        f"{READ_TIMEOUT:g} s): {disconnects} clients that vanished were logged as an info line "
        f"each.\n\n"
        + markdown_table(raw_rows)
        + "\n\nRows written around the API (SQLAlchemy) and runs that go silent:\n\n"
        + markdown_table(stored_rows)
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
        "counted from the stop to 2 s after the start.\n\n" + markdown_table(rows)
    )


def properties_section(s: Sizes) -> tuple[bool, str]:
    from reliability._properties import run_properties

    results = run_properties(s.properties)
    rows = [{"property (hypothesis)": r.name, "examples": str(r.examples),
             "held": "yes" if r.ok else "NO: " + r.error} for r in results]  # fmt: skip
    return all(r.ok for r in results), markdown_table(rows)


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
        "with `noisescope token create`, revoked with `noisescope token revoke`.\n\n"
        + markdown_table(rows)
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
        + markdown_table(rows)
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
        "\n\n" + markdown_table(rows)
    )
    if failures:
        body += "\n\nFailures:\n\n" + markdown_table(failures)
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
        body += "\n\n" + markdown_table(failures)
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
        "access log): " + "; ".join(logs) + ".\n\n" + markdown_table(rows)
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
        "1.25 × `max_answer_bytes` + 16 MiB.\n\n" + markdown_table(rows)
    )


def disk_section() -> tuple[bool, str]:
    from reliability._disk_full import describe, run_disk_full

    ok, rows, skipped = run_disk_full()
    return ok, describe(skipped) + "\n\n" + markdown_table(rows)


def round3_section(backend: str, s: Sizes) -> tuple[bool, str]:
    """Issue 46: whatever goes wrong, what the client accepted is stored, spooled, or dropped
    and counted; the client process's own classes once, with the SQLite section."""
    from reliability._round3 import Round3Sizes, data_classes
    from reliability._round3_process import process_classes

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
    return all(r.held for r in rows), body + "\n\n" + markdown_table([r.cells() for r in rows])


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
        + markdown_table(rows)
    )


def round4_server_section(backend: str) -> tuple[bool, str]:
    """Issue 55, the server's items 1 to 4 (reliability._round4_server)."""
    from reliability._round4_server import round4_server, section_body

    ok, rows = round4_server(backend)
    return ok, section_body(backend, rows, markdown_table([r.cells() for r in rows]))


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
        "`reliability._round3_reads`.\n\n" + markdown_table(rows)
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
    return all(r.held for r in rows), describe() + "\n\n" + markdown_table(
        [r.cells() for r in rows]
    )
