"""Client-side faults: a client SIGKILLed mid-batch (while sending, and while spooling during a
server outage), and a spool directory made read-only mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.spool_layout import HOSTILE_RUN_IDS, plant_layout, tree
from reliability._client import ClientSpec
from reliability._infra import (
    Server,
    engine_for,
    spooled_seqs,
    start_worker,
    sync_spool,
)
from reliability._reconcile import RunCheck, check_run, stored_seqs


@dataclass
class FaultResult:
    name: str
    ok: bool
    facts: dict[str, object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def row(self) -> dict[str, str]:
        """The fault's row in docs/reliability.md: held or not, its facts, then its problems."""
        facts = "; ".join(f"{k}: {v}" for k, v in self.facts.items())
        if self.problems:
            facts += "; problems: " + "; ".join(self.problems)
        return {"fault": self.name, "held": "yes" if self.ok else "NO", "facts": facts}


def run_faults(faults: Iterable[Callable[[], FaultResult]]) -> tuple[bool, list[dict[str, str]]]:
    """Each fault in turn: whether all held, and their report rows."""
    results = [fault() for fault in faults]
    return all(fr.ok for fr in results), [fr.row() for fr in results]


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


def _fault_client(
    server: Server, workdir: Path, rid: str, task: str, **options: Any
) -> tuple[ClientSpec, Path, Path]:
    """A fault's client run ``rid`` of ``task`` against ``server``: its spec, its own spool
    folder (made here) and the file its transport logs the acknowledged seqs to."""
    spool = workdir / f"spool-{task}-{rid}"
    spool.mkdir()
    ack_log = workdir / f"acks-{rid}.jsonl"
    spec = ClientSpec(
        url=server.url, run_id=rid, project="faults", task=task, spool_dir=str(spool),
        out=str(workdir / f"{task}-{rid}.json"), ack_log=str(ack_log), **options,
    )  # fmt: skip
    return spec, spool, ack_log


def _sync_and_check(
    server: Server, spool: Path, rid: str, seed: int, logged: int, problems: list[str]
) -> tuple[str, set[int], RunCheck]:
    """``noisescope sync`` of ``spool`` (a failure joins ``problems``), then the run's stored
    seqs and its check against the ``logged`` samples of ``seed``; the sync's output first."""
    code, output = sync_spool(spool, server.url)
    if code != 0:
        problems.append(f"sync failed: {output[-300:]}")
    engine = engine_for(server.database_url)
    try:
        return output, set(stored_seqs(engine, rid)), check_run(engine, rid, seed, logged)
    finally:
        engine.dispose()


def client_killed(
    server: Server, workdir: Path, *, samples: int, rate: float, during_outage: bool
) -> FaultResult:
    """SIGKILL a client mid-run; afterwards ``noisescope sync`` must leave every acknowledged
    and every spooled sample stored exactly once, with the values that were logged.

    ``during_outage``: the server is SIGKILLed first, so the client is spooling (fsync'ed
    appends) when it dies; the server is restarted before the sync.
    """
    name = "client SIGKILL while " + ("spooling (server down)" if during_outage else "sending")
    rid = uuid.uuid4().hex
    spec, spool, ack_log = _fault_client(
        server, workdir, rid, "kill", samples=samples, rate=rate, seed=99, batch_max=500,
        extra={"batch_interval": 0.2},
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
    output, stored, check = _sync_and_check(server, spool, rid, 99, samples, problems)
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
    rid = uuid.uuid4().hex
    spec, spool, ack_log = _fault_client(
        server, workdir, rid, "readonly", samples=samples, rate=rate, seed=7, batch_max=500,
        flush_timeout=60.0, extra={"batch_interval": 0.2},
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
        code = worker.wait(600)
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


# -- the client's own classes of defect --------------------------------------------------------


def hostile_run_ids(server: Server, workdir: Path) -> FaultResult:
    """Hostile run ids at every client entry (``init`` online and offline, a symlinked run
    folder, a planted run.json and ``noisescope sync --run``): each is refused, no request
    names it, and no file outside the spool root's own run folders changes."""
    import noisescope

    name = "hostile run ids in the client (init, spool, sync)"
    base = workdir / "hostile-ids"
    root = plant_layout(base)
    problems: list[str] = []
    before = tree(base)
    refused = 0
    for run_id in HOSTILE_RUN_IDS:
        for mode in ("offline", "online"):
            try:
                run = noisescope.init(url=server.url, mode=mode, dir=root, run_id=run_id)
            except ValueError:
                refused += 1
                continue
            run.log_sample(0, 8, 64, 2.0, 1.0)
            run.finish(timeout=5.0)
            problems.append(f"{run_id!r} ({mode}) was accepted")
    changed_by_init = sum(1 for k, v in tree(base).items() if before.get(k) != v)
    # a run folder that is a symlink out of the root: not used, nothing written through it
    (root / "linked").symlink_to(base / "outside", target_is_directory=True)
    before = tree(base)
    run = noisescope.init(mode="offline", dir=root, run_id="linked", quiet=True)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    # planted run.json files naming hostile ids, then sync of the whole root and of --run ids
    planted = 0
    for i, run_id in enumerate(HOSTILE_RUN_IDS[:8]):
        folder = root / f"planted{i}"
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"run_id": run_id, "run": {}}))
        planted += 1
    before_sync = tree(base)
    code, output = sync_spool(root, server.url)
    sync_ids = [f"--run={r}" for r in HOSTILE_RUN_IDS if r and "\x00" not in r]
    cmd = [sys.executable, "-m", "noisescope.cli", "sync", str(root), "--url", server.url]
    by_id = subprocess.run([*cmd, *sync_ids], capture_output=True, text=True, timeout=600)
    code_run = by_id.returncode
    after = tree(base)
    changed = [k for k in set(before_sync) | set(after) if before_sync.get(k) != after.get(k)]
    # sync takes the lock of each run folder it delivers (other-run: a valid one, refused by
    # the server): a lock file inside a run folder under the root is the spool's own
    changed = [k for k in changed if not re.fullmatch(r"home/spool/[^/]+/lock", k)]
    changed_link = [k for k in set(before) | set(before_sync) if k.startswith("outside")]
    changed_link = [k for k in changed_link if before.get(k) != before_sync.get(k)]
    planted_refused = output.count("is not valid")
    facts: dict[str, object] = {
        "ids tried": len(HOSTILE_RUN_IDS),
        "init calls refused (offline and online)": f"{refused} of {2 * len(HOSTILE_RUN_IDS)}",
        "paths changed by refused inits": changed_by_init,
        "files written through a symlinked run folder": len(changed_link),
        "planted run.json files refused by sync": f"{planted_refused} of {planted}",
        "paths changed by sync (root, then --run ids)": len(changed),
        "sync exit codes": f"{code}, {code_run}",
    }
    if changed_by_init or changed_link or changed:
        problems.append("files outside the spool's own run folders changed")
    if planted_refused != planted:
        problems.append(f"sync did not refuse every planted id: {output[-300:]}")
    if code == 0 or code_run == 0:
        problems.append("sync of hostile ids exited 0")
    return FaultResult(name, not problems, facts, problems)


def _stop_server(server: Server, sig: signal.Signals) -> None:
    assert server.proc is not None
    os.killpg(server.proc.pid, sig)  # the workers too


def hung_server_kill(
    server: Server, workdir: Path, *, rate: float, hang_s: float = 4.1
) -> FaultResult:
    """The server stops answering (SIGSTOP: connections are accepted by the kernel, nothing is
    read back), the client is SIGKILLed ``hang_s`` later (not a multiple of the guard's
    period, so the kill does not land just after a spill), the server resumes and
    ``noisescope sync`` delivers the spool. Lost: committed samples that are neither stored
    nor a hole-free prefix; the bound is docs/client.md's 1.75 x batch_interval."""
    name = f"server hung (SIGSTOP {hang_s:g} s), then client SIGKILLed"
    batch_interval = 1.0  # the default, whose bound docs/client.md states
    rid = uuid.uuid4().hex
    progress = workdir / f"progress-{rid}"
    spec, spool, ack_log = _fault_client(
        server, workdir, rid, "hung", samples=int(rate * 600), rate=rate, seed=5,
        progress=str(progress), extra={"batch_interval": batch_interval, "request_timeout": 60.0},
    )  # fmt: skip
    worker = start_worker(spec, workdir)
    problems: list[str] = []
    if not _wait(lambda: len(_acked(ack_log)) >= int(rate), 120):
        problems.append("client never got an acknowledgement")
    _stop_server(server, signal.SIGSTOP)
    try:
        time.sleep(hang_s)
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(10)
    finally:
        _stop_server(server, signal.SIGCONT)
    committed = int(progress.read_bytes() or b"0")  # samples 0..committed-1 were committed
    spooled = spooled_seqs(spool, rid)
    _, stored, check = _sync_and_check(server, spool, rid, 5, committed + 1, problems)
    missing = set(range(committed)) - stored
    holes = [s for s in missing if s < max(stored, default=-1)]
    lost_s = len(missing) / rate
    bound_s = 1.75 * batch_interval
    facts: dict[str, object] = {
        "committed before the kill": committed,
        "in the spool after the kill": len(spooled),
        "stored after sync": len(stored),
        "lost (the last committed, unstored)": len(missing),
        "lost, seconds of logging": round(lost_s, 2),
        "bound (1.75 x batch_interval), s": bound_s,
        "holes": len(holes),
        "duplicates": check.duplicates,
    }
    if holes:
        problems.append("samples missing before the last stored one")
    if lost_s > bound_s:
        problems.append(f"lost {lost_s:.2f} s of samples, over the {bound_s} s bound")
    ok = not problems and check.duplicates == 0
    return FaultResult(name, ok, facts, problems)


def burst_overflow(server: Server, workdir: Path, *, samples: int = 200_000) -> FaultResult:
    """``samples`` log_sample calls as fast as the client takes them, default ``memory_max``,
    against a hung server (SIGSTOP): none dropped; after the server resumes and ``noisescope
    sync`` runs, every one is stored exactly once with its values."""
    name = f"burst of {samples:,} samples into a hung server (default memory_max)"
    rid = uuid.uuid4().hex
    spec, spool, _ = _fault_client(
        server, workdir, rid, "burst", samples=samples, rate=0.0, seed=11, flush_timeout=2.0,
        extra={"request_timeout": 60.0},
    )  # fmt: skip
    problems: list[str] = []
    _stop_server(server, signal.SIGSTOP)
    try:
        worker = start_worker(spec, workdir)
        code = worker.wait(300)
    finally:
        _stop_server(server, signal.SIGCONT)
    result = worker.result()
    if result is None:
        return FaultResult(name, False, {"client exit code": code}, [worker.log()[-500:]])
    _, _, check = _sync_and_check(server, spool, rid, 11, samples, problems)
    facts: dict[str, object] = {
        "logged": result["logged"],
        "dropped (counted)": result["dropped"],
        "spooled at finish": result["spooled"],
        "longest log_sample call ms": round(1e3 * float(result["max_log_call_s"]), 1),
        "stored after sync": check.stored,
        "duplicates": check.duplicates,
        "stored values match what was logged": check.values_ok,
    }
    if result["dropped"]:
        problems.append(f"{result['dropped']} samples dropped")
    ok = not problems and check.stored == check.distinct == samples and check.values_ok
    return FaultResult(name, ok, facts, problems)
