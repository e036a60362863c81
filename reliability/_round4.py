"""Deleted runs, endings during ``finish()``, refusals and resumed runs: the client's part of
issue 55 (items 2, 5, 6 and 7), against a real ``noisescope server`` process.

Each case is a ``Row`` of ``reliability._round3`` (logged, stored, spooled, dropped, status,
held) whose note says what the client said. Item 2 runs the client in this process (the run
deleted through ``noisescope.Api`` while it logs; a spool of a deleted run synced); items 5
and 7 run each training process as its own OS process (``reliability._round4_job``); item 6
puts ``harness.fault_proxy`` in front of the server.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import noisescope
from harness.fault_proxy import FaultProxy, RefuseFirstBatch
from harness.hung import HungServer
from noisescope._sync import report
from reliability._infra import REPO, Server, engine_for, spooled_seqs, sync_spool
from reliability._reconcile import stored_count, stored_seqs
from reliability._round3 import Row, Said, run_status
from reliability._round3_process import _client_env

#: Item 2: the job logs this many samples over ``JOB_S``; the run is deleted ``DELETE_AT_S`` in.
JOB_SAMPLES = 3_455
JOB_S = 4.0
DELETE_AT_S = 1.5
#: Item 5: samples logged before ``finish()``, and when the signal comes in its wait.
FINISHING_SAMPLES = 3_200
SIGNAL_AFTER_S = 0.2
#: Item 6: samples logged (the proxy refuses the first batch after the run is under way).
REFUSED_SAMPLES = 1_000
#: Item 7: the first session is killed after step KILLED_AFTER - 1; the second resumes at
#: CHECKPOINT and logs until RESUMED_TO - 1.
KILLED_AFTER, CHECKPOINT, RESUMED_TO = 1_000, 900, 1_500


def _exists(server: Server, run_id: str) -> bool:
    try:
        server.api().run(run_id)
    except noisescope.NotFoundError:
        return False
    return True


def deleted_mid_job(server: Server, workdir: Path) -> Row:
    """Item 2: the run deleted DELETE_AT_S into a JOB_S job that logs JOB_SAMPLES."""
    spool = workdir / "deleted-job"
    with Said() as said:
        run = noisescope.init(url=server.url, dir=spool, batch_interval=0.05, quiet=True,
                              project="round4", task="deleted")  # fmt: skip
        timer = threading.Timer(DELETE_AT_S, lambda: server.api().delete_run(run.id))
        timer.start()
        pause = JOB_S / JOB_SAMPLES
        for step in range(JOB_SAMPLES):
            run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
            time.sleep(pause)
        timer.join()
        status = run.finish(timeout=30)
    warned = said.count(f"run {run.id} was deleted on the server")
    stored = stored_count(server.database_url, run.id)
    exists = _exists(server, run.id)
    held = (
        not exists and stored == 0 and warned == 1 and status.spooled == 0
        and status.sent + status.dropped == JOB_SAMPLES and not (spool / run.id).exists()
    )  # fmt: skip
    note = (
        f"sent {status.sent:,} before the delete (deleted with the run); said once: "
        f"{warned == 1}; the run {'came back' if exists else 'stays deleted'}; finish line: "
        f"{status.last_error}"
    )
    return Row(2, "deleted mid-job (live client)", f"{JOB_SAMPLES:,} samples", stored,
               status.spooled, status.dropped, "deleted" if not exists else "present",
               held, note)  # fmt: skip


def deleted_then_synced(server: Server, workdir: Path) -> Row:
    """Item 2: the spool of an offline session of a run deleted on the server, synced."""
    spool = workdir / "deleted-sync"
    first = noisescope.init(url=server.url, dir=spool, quiet=True, project="round4")
    first.log_sample(0, 8.0, 64.0, 2.0, 1.0)
    first.finish(timeout=30)
    server.api().delete_run(first.id)
    offline = noisescope.init(mode="offline", run_id=first.id, dir=spool, quiet=True)
    logged = 300
    for step in range(logged):
        offline.log_sample(step, 8.0, 64.0, 2.0, 1.0)
    spooled = offline.finish().spooled
    out, err = io.StringIO(), io.StringIO()
    result = noisescope.sync(spool, url=server.url)
    with redirect_stdout(out), redirect_stderr(err):
        code = report(result, spool)
    again = noisescope.sync(spool, url=server.url)
    said = err.getvalue().strip().splitlines()
    held = (
        code == 1 and first.id in result.deleted and not (spool / first.id).exists()
        and not _exists(server, first.id) and not again.deleted and not again.failed
    )  # fmt: skip
    return Row(2, "its spool synced (noisescope sync)", f"{logged:,} samples", 0, spooled,
               spooled if first.id in result.deleted else 0, "deleted", held,
               f"exit {code}; said: {said[0] if said else ''}; a second sync finds nothing "
               f"({len(again.deleted)} deleted, {len(again.failed)} failed)")  # fmt: skip


def _job(
    case: str, url: str, spool: Path, run_id: str, first: int, last: int
) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "reliability._round4_job", case, url, str(spool), run_id,
           str(first), str(last)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=_client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def _finish_line(err: str, run_id: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith(f"noisescope: run {run_id}")]
    return lines[-1] if lines else ""


def ended_while_finishing(server: Server, workdir: Path, signum: int) -> Row:
    """Item 5: ``signum`` SIGNAL_AFTER_S into ``finish()``'s wait for a hung server, then
    ``noisescope sync`` of the spool to the real server."""
    name = signal.Signals(signum).name
    spool = workdir / f"finishing-{name}"
    with HungServer() as hung:
        proc = _job("finishing", hung.url, spool, "", 0, FINISHING_SAMPLES)
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        time.sleep(SIGNAL_AFTER_S)
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=30)
    spooled = len(spooled_seqs(spool, run_id)) if run_id else 0
    line = _finish_line(err, run_id)
    code, _ = sync_spool(spool, server.url)
    stored = stored_count(server.database_url, run_id) if run_id else 0
    said = f"spooled {FINISHING_SAMPLES}" in line and "noisescope sync" in line
    held = proc.returncode == -signum and stored == FINISHING_SAMPLES and said and code == 0
    status = run_status(server, run_id) if run_id else "no run"
    return Row(5, f"{name} {SIGNAL_AFTER_S:g} s into finish(), server hung",
               f"{FINISHING_SAMPLES:,} samples", stored, spooled, 0, status, held,
               f"exit {proc.returncode}; finish line: {line[len('noisescope: '):]}"
               f"; sync: exit {code}")  # fmt: skip


def refused_after_copy(server: Server, workdir: Path) -> Row:
    """Item 6: a 422 for a request the guard had copied to the spool while it hung."""
    rule = RefuseFirstBatch()
    proxy = FaultProxy(server.url, answer=rule).start()
    try:
        with Said() as said:
            run = noisescope.init(url=proxy.url, dir=workdir / "refused", batch_interval=0.1,
                                  batch_max=100, quiet=True, resume_orphans=False,
                                  project="round4", task="refused")  # fmt: skip
            for step in range(REFUSED_SAMPLES):
                run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
                if step == 100:
                    run.flush(timeout=30)
                    rule.armed = True
                time.sleep(0.002)
            status = run.finish(timeout=60)
    finally:
        proxy.stop()
    stored = stored_count(server.database_url, run.id)
    refused = len(rule.poisoned)
    warned = said.count("HTTP 422")
    held = (
        stored == REFUSED_SAMPLES - refused and status.dropped == refused
        and status.sent + status.dropped == REFUSED_SAMPLES and rule.refusals >= 2
    )  # fmt: skip
    return Row(6, "422 after the guard spooled a copy", f"{REFUSED_SAMPLES:,} samples", stored,
               status.spooled, status.dropped, run_status(server, run.id), held,
               f"the first batch ({refused} samples) refused {rule.refusals} times (its copy "
               f"replayed, merged with later batches); warnings about it: {warned}")  # fmt: skip


def resumed(server: Server, workdir: Path) -> Row:
    """Item 7: killed after step KILLED_AFTER - 1, restarted from the checkpoint at CHECKPOINT."""
    spool, run_id = workdir / "resumed", "round4-resumed"
    first = _job("killed", server.url, spool, run_id, 0, KILLED_AFTER)
    assert first.stdout is not None
    first.stdout.readline()
    flushed = first.stdout.readline().strip() == "flushed"
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    second = _job("resumed", server.url, spool, run_id, CHECKPOINT, RESUMED_TO)
    _, err = second.communicate(timeout=300)
    line = _finish_line(err, run_id)
    engine = engine_for(server.database_url)
    try:
        seqs = stored_seqs(engine, run_id)
    finally:
        engine.dispose()
    rows = csv.DictReader(io.StringIO(server.api().samples_csv(run_id)))
    steps = sorted(int(row["step"]) for row in rows)
    summary = server.api().run(run_id)
    repeated = KILLED_AFTER - CHECKPOINT
    said = f"{repeated} samples and 1 event of steps up to {KILLED_AFTER - 1}" in line
    held = (
        flushed and second.returncode == 0 and steps == list(range(RESUMED_TO))
        and len(seqs) == RESUMED_TO and "dropped 0" in line and said
    )  # fmt: skip
    logged = KILLED_AFTER + RESUMED_TO - CHECKPOINT
    return Row(7, f"killed after step {KILLED_AFTER - 1}, resumed at {CHECKPOINT}",
               f"{logged:,} samples", len(seqs), 0, 0, summary.status, held,
               f"each step 0-{RESUMED_TO - 1} once: {steps == list(range(RESUMED_TO))}; "
               f"finish line: {line[len('noisescope: '):]}")  # fmt: skip


def client_cases(server: Server, workdir: Path) -> list[Row]:
    """Every case, in item order."""
    rows = [deleted_mid_job(server, workdir), deleted_then_synced(server, workdir)]
    rows += [ended_while_finishing(server, workdir, s)
             for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)]  # fmt: skip
    return [*rows, refused_after_copy(server, workdir), resumed(server, workdir)]


def describe() -> str:
    """The section's text before its table."""
    return (
        "Issue 55, the client's part: a run deleted on the server stays deleted (item 2), an "
        "ending during `finish()` (item 5), a refusal counted once (item 6), a job that "
        "resumes (item 7); `reliability._round4`, against `noisescope server` on SQLite (auth "
        "off). Item 2: the real client in this process logs "
        f"{JOB_SAMPLES:,} samples over {JOB_S:g} s and the run is deleted "
        f"(`Api.delete_run`) {DELETE_AT_S:g} s in; then an offline session of a deleted run "
        "id, synced. Item 5: a training process (`reliability._round4_job`) logs "
        f"{FINISHING_SAMPLES:,} samples against a server that accepts and never answers, "
        f"and gets the signal {SIGNAL_AFTER_S:g} s into `finish()`; its spool is then synced "
        "to the real server. Item 6: a proxy holds the first samples request after the run "
        "is under way for 1.5 s (the guard copies it to the spool) and refuses it, and every "
        "later request holding its samples, with a 422 that names no row. Item 7: a process "
        f"killed (SIGKILL) after logging steps 0-{KILLED_AFTER - 1}, then one that resumes "
        f"the run (`resume=True`) from a checkpoint at step {CHECKPOINT} and logs to step "
        f"{RESUMED_TO - 1}. stored: rows in the database (after sync where the case syncs); "
        "spooled: in the spool when the client was done; dropped: the client's count; the "
        "note gives what the client said."
    )
