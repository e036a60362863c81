"""Client-side faults: a client SIGKILLed mid-batch (while sending, and while spooling during a
server outage), and a spool directory made read-only mid-run."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from reliability._client import ClientSpec
from reliability._infra import (
    Server,
    engine_for,
    spooled_seqs,
    start_worker,
    sync_spool,
)
from reliability._reconcile import check_run, stored_seqs


@dataclass
class FaultResult:
    name: str
    ok: bool
    facts: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _acked(path: Path) -> set[int]:
    seqs: set[int] = set()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return seqs
    for line in lines:
        try:
            seqs.update(json.loads(line))
        except ValueError:
            continue  # a line torn by the kill: that batch's ack was never complete
    return seqs


def _wait(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def client_killed(
    server: Server, workdir: Path, *, samples: int, rate: float, during_outage: bool
) -> FaultResult:
    """SIGKILL a client mid-run; afterwards ``noisescope sync`` must leave every acknowledged
    and every spooled sample stored exactly once, with the values that were logged.

    ``during_outage``: the server is SIGKILLed first, so the client is spooling (fsync'ed
    appends) when it dies; the server is restarted before the sync.
    """
    name = "client SIGKILL while " + ("spooling (server down)" if during_outage else "sending")
    spool = workdir / f"spool-kill-{int(during_outage)}"
    spool.mkdir()
    rid = uuid.uuid4().hex
    ack_log = workdir / f"acks-{rid}.jsonl"
    spec = ClientSpec(
        url=server.url, run_id=rid, project="faults", task="kill", samples=samples,
        spool_dir=str(spool), out=str(workdir / f"kill-{rid}.json"), rate=rate, seed=99,
        ack_log=str(ack_log), batch_max=500, extra={"batch_interval": 0.2},
    )  # fmt: skip
    worker = start_worker(spec, workdir)
    problems: list[str] = []
    facts: dict[str, object] = {}
    if not _wait(lambda: len(_acked(ack_log)) >= min(samples // 4, 2000), 120):
        problems.append("client never got an acknowledgement")
    if during_outage:
        server.kill()
        run_dir = spool / rid
        _wait(lambda: any(run_dir.glob("seg-*.jsonl")) and run_dir.stat().st_size >= 0, 60)
        time.sleep(1.5)  # a few fsync'ed spool appends
    else:
        time.sleep(0.3)
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(10)
    acked = _acked(ack_log)
    spooled = spooled_seqs(spool, rid)
    if during_outage:
        server.restart()
    code, output = sync_spool(spool, server.url)
    if code != 0:
        problems.append(f"sync failed: {output[-300:]}")
    engine = engine_for(server.database_url)
    try:
        stored = set(stored_seqs(engine, rid))
        check = check_run(engine, rid, 99, samples)
    finally:
        engine.dispose()
    lost_acked = len(acked - stored)
    lost_spooled = len(spooled - stored)
    facts = {
        "acknowledged before the kill": len(acked),
        "in the spool after the kill": len(spooled),
        "stored after sync": check.stored,
        "acknowledged but not stored": lost_acked,
        "spooled but not stored": lost_spooled,
        "duplicates": check.duplicates,
        "stored values match what was logged": check.values_ok,
        "sync": output.splitlines()[-1] if output else "",
    }
    if during_outage and not spooled:
        problems.append("nothing reached the spool before the kill")
    ok = not problems and lost_acked == 0 and lost_spooled == 0 and check.duplicates == 0
    ok = ok and check.values_ok and check.stored == check.distinct
    return FaultResult(name, ok, facts, problems)


def readonly_spool(server: Server, workdir: Path, *, samples: int, rate: float) -> FaultResult:
    """Make the run's spool directory read-only mid-run, then crash the server so the client
    needs the spool: it must not crash or block, must report the unwritable spool, keep what
    fits in memory (``memory_max``) until the server is back, and count anything it could not
    keep as dropped; everything it reports as sent must be stored."""
    name = "spool directory made read-only, then server SIGKILLed"
    spool = workdir / "spool-ro"
    spool.mkdir()
    rid = uuid.uuid4().hex
    ack_log = workdir / f"acks-{rid}.jsonl"
    out = workdir / f"ro-{rid}.json"
    spec = ClientSpec(
        url=server.url, run_id=rid, project="faults", task="readonly", samples=samples,
        spool_dir=str(spool), out=str(out), rate=rate, seed=7, ack_log=str(ack_log),
        batch_max=500, flush_timeout=60.0, extra={"batch_interval": 0.2},
    )  # fmt: skip
    worker = start_worker(spec, workdir, respect_permissions=True)
    problems: list[str] = []
    run_dir = spool / rid
    if not _wait(lambda: run_dir.is_dir() and len(_acked(ack_log)) > 0, 120):
        problems.append("client never started sending")
    for d in (run_dir, spool):
        d.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        server.kill()
        time.sleep(2.0)
        server.restart()
        try:
            code = worker.proc.wait(600)
        except Exception:
            worker.proc.kill()
            code = -9
    finally:
        for d in (spool, run_dir):
            d.chmod(0o755)
    result = worker.result()
    log = worker.log()
    engine = engine_for(server.database_url)
    try:
        stored = set(stored_seqs(engine, rid))
    finally:
        engine.dispose()
    acked = _acked(ack_log)
    facts: dict[str, object] = {"client exit code": code}
    if result is None:
        problems.append(f"client crashed: {log[-500:]}")
    else:
        facts |= {
            "logged": result["logged"],
            "sent": result["sent"],
            "dropped (counted)": result["dropped"],
            "spooled": result["spooled"],
            "stored": len(stored),
            "acknowledged but not stored": len(acked - stored),
            "longest log_sample call ms": round(1e3 * float(result["max_log_call_s"]), 2),
            "reported": next((ln for ln in log.splitlines() if "cannot write spool" in ln), ""),
        }
        if result["sent"] + result["dropped"] + result["spooled"] != result["logged"]:
            problems.append("sent + dropped + spooled != logged: samples unaccounted for")
        if result["dropped"] and result["logged"] <= 50_000:
            problems.append("samples dropped although they fitted in memory (memory_max)")
        if len(stored) != result["logged"] - result["dropped"]:
            problems.append("stored != logged - dropped")
        if acked - stored:
            problems.append("acknowledged samples missing from the database")
        if "cannot write spool" not in log:
            problems.append("the client did not report the unwritable spool")
    return FaultResult(name, code == 0 and not problems, facts, problems)
