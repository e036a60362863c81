"""A full disk under the client's spool: what ``status()`` says the spool kept is what
``noisescope sync`` delivers, ``sent + spooled + dropped`` is what was logged, ``last_error``
and the line at finish give the ``dropped`` count, and a run whose ``finish()`` ran reads
finished on the server after the sync (or ``finish()`` said its end could not be recorded, and
``sync --end`` sends it).

On a real 512 KiB tmpfs (a client process, offline, and online with the server down; only
where this process may mount one), and in-process with ENOSPC injected at the spool's one write
(``noisescope._spool_io._write_some``) at each point: the first segment, mid-segment, run.json,
the end, and the sync itself. All runs go to one SQLite server; sync is the real one.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from harness.small_disk import (
    FullDisk,
    end_file,
    metadata_file,
    segment_file,
    small_filesystem,
)
from reliability._client import B_BIG, B_SMALL, ClientSpec, sample_values
from reliability._faults import FaultResult
from reliability._infra import Server, Workdir, database, engine_for, start_worker, sync_spool
from reliability._reconcile import check_run

SIZE = "512k"
#: ``SIZE`` as the report writes it.
SIZE_TEXT = "512 KiB"
#: The issue's run: as many samples as a training loop logs in a burst.
BURST = 200_000
#: Each injected point's run (in this process).
INJECTED = 20_000


@dataclass
class Told:
    """What the client said at finish: its ``status()`` as a dict, the line it printed, and
    the files left in its spool folder (``spool``)."""

    status: dict[str, Any]
    line: str
    spool: Path
    left: list[str]

    @classmethod
    def at_finish(cls, status: dict[str, Any], line: str, spool: Path) -> Told:
        """Taken before the sync, which deletes what it delivered."""
        left = sorted(p.name for p in spool.iterdir()) if spool.is_dir() else []
        return cls(status, line, spool, left)

    def end(self) -> str:
        if "Nothing of it is in the spool" in self.line:
            return "no: finish said nothing of the run is in the spool"
        if "could not be recorded" in self.line:
            return "no: finish said so"
        return "yes"


def _verdict(
    name: str, server: Server, rid: str, seed: int, told: Told, sync_ok: bool, **facts: Any
) -> FaultResult:
    """The checks every scenario shares, against the rows and run the server holds."""
    engine = engine_for(server.database_url)
    try:
        check = check_run(engine, rid, seed, told.status["logged"])
        with engine.connect() as conn:
            stored_status = conn.execute(
                text("SELECT status FROM run WHERE uid = :uid"), {"uid": rid}
            ).scalar()
    finally:
        engine.dispose()
    s = told.status
    dropped = s["dropped"]
    said = s.get("last_error") or ""
    problems: list[str] = []
    if s["queued"] or s["sent"] + s["spooled"] + dropped != s["logged"]:
        problems.append("sent + spooled + dropped != logged")
    if check.stored != s["spooled"] + s["sent"]:
        problems.append(f"the client counted {s['spooled']} spooled; sync delivered "
                        f"{check.stored - s['sent']}")  # fmt: skip
    if dropped and not said.startswith(f"{dropped} samples dropped"):
        problems.append(f"last_error does not give the dropped count: {said[:80]}")
    if dropped and f"dropped {dropped}; last error: {dropped} samples dropped" not in told.line:
        problems.append("the line at finish gives another count")
    if "Nothing of it is in the spool" in told.line:  # run.json never written: said so
        if s["spooled"] or stored_status is not None:
            problems.append("finish said nothing was spooled, yet the server has the run")
    elif stored_status != "finished":
        problems.append(f"the run reads {stored_status} on the server after sync")
    left = [file for file in told.left if file.endswith(".tmp")]
    if left:
        problems.append(f"temporary files left: {left}")
    if check.duplicates or not check.values_ok:
        problems.append("stored rows differ from what was logged")
    if not sync_ok:
        problems.append("sync failed")
    result = {
        "logged": s["logged"], "sent": s["sent"], "spooled (client)": s["spooled"],
        "dropped (client)": dropped, "stored after sync": check.stored,
        "run on the server": stored_status or "absent", **facts,
        "end recorded": told.end(), "last_error": said.replace(str(told.spool), "<spool>"),
    }  # fmt: skip
    return FaultResult(name, not problems, result, problems)


def _worker_run(
    server: Server, workdir: Path, root: Path, rid: str, seed: int, burst: int, **extra: Any
) -> tuple[Told, float]:
    """A client process logging ``burst`` samples as fast as it can into ``root``: what it
    said, and its longest ``log_sample`` call in ms."""
    spec = ClientSpec(
        url=server.url, run_id=rid, project="disk", task="full", samples=burst,
        spool_dir=str(root), out=str(workdir / f"disk-{rid}.json"), seed=seed,
        flush_timeout=2.0, extra={"backoff_base": 0.05, "backoff_max": 0.5, **extra},
    )  # fmt: skip
    worker = start_worker(spec, workdir)
    code = worker.wait(300)
    result = worker.result()
    if result is None:
        raise RuntimeError(f"client exited {code}: {worker.log()[-500:]}")
    line = next((ln for ln in worker.log().splitlines() if f"run {rid}" in ln), "")
    return Told.at_finish(result, line, root / rid), 1e3 * float(result["max_log_call_s"])


def tmpfs_offline(server: Server, workdir: Path, root: Path, burst: int) -> FaultResult:
    rid = uuid.uuid4().hex
    told, worst = _worker_run(server, workdir, root, rid, 31, burst, mode="offline")
    code, _ = sync_spool(root, server.url)
    name = f"offline run, {burst:,} samples into a {SIZE_TEXT} tmpfs"
    return _verdict(name, server, rid, 31, told, code == 0,
                    **{"longest log_sample call ms": round(worst, 1)})  # fmt: skip


def tmpfs_outage(server: Server, workdir: Path, root: Path, burst: int) -> FaultResult:
    rid = uuid.uuid4().hex
    server.kill()
    try:
        told, worst = _worker_run(server, workdir, root, rid, 32, burst)
    finally:
        server.restart()
    code, _ = sync_spool(root, server.url)
    name = f"online run, server down, {burst:,} samples into a {SIZE_TEXT} tmpfs"
    return _verdict(name, server, rid, 32, told, code == 0,
                    **{"longest log_sample call ms": round(worst, 1)})  # fmt: skip


@contextlib.contextmanager
def _injected(disk: FullDisk) -> Iterator[FullDisk]:
    from noisescope import _spool_io

    saved = _spool_io._write_some
    _spool_io._write_some = disk
    try:
        yield disk
    finally:
        _spool_io._write_some = saved


def _in_process(
    server: Server,
    root: Path,
    name: str,
    disk: FullDisk,
    seed: int,
    *,
    after_init: Callable[[FullDisk], None] = lambda disk: None,
    full_sync: bool = False,
) -> FaultResult:
    """An offline run of ``INJECTED`` samples with ``disk`` at the spool's write seam, then
    ``noisescope sync`` (also with every write refused if ``full_sync``; with ``--end
    finished`` if finish said the end could not be recorded)."""
    import noisescope
    from noisescope._sync import sync

    rid = uuid.uuid4().hex
    err = io.StringIO()
    with _injected(disk), contextlib.redirect_stderr(err):
        run = noisescope.init(
            project="disk", task="injected", mode="offline", dir=root, run_id=rid, quiet=False,
            memory_max=5000, batch_max=1000,
        )  # fmt: skip
        after_init(disk)
        for i in range(INJECTED):
            g_small_sq, g_big_sq, loss = sample_values(seed, i)
            run.log_sample(i, B_SMALL, B_BIG, g_small_sq, g_big_sq, loss=loss)
        status = run.finish()
    line = next((ln for ln in err.getvalue().splitlines() if f"run {rid}" in ln), "")
    told = Told.at_finish({"logged": INJECTED, **vars(status)}, line, root / rid)
    end = "finished" if "could not be recorded" in line else None
    with _injected(FullDisk() if full_sync else FullDisk(lambda path: False)) as during:
        result = sync(root, url=server.url, run_ids=[rid] if end else None, end=end)
    ok = not result.failed
    facts = {"ENOSPC refused / short writes": f"{disk.refused} / {disk.short}"}
    if full_sync:
        facts["writes the sync tried"] = str(during.refused)
    return _verdict(f"ENOSPC at {name}", server, rid, seed, told, ok, **facts)


def injected_points(server: Server, workdir: Path) -> list[FaultResult]:
    def space_back(disk: FullDisk) -> None:
        disk.room = 1 << 30

    points: list[tuple[str, FullDisk, dict[str, Any]]] = [
        ("the first segment", FullDisk(segment_file), {}),
        ("mid-segment (100,000 bytes fit)", FullDisk(segment_file, 100_000), {}),
        ("run.json at init (space back before the first batch)", FullDisk(metadata_file),
         {"after_init": space_back}),
        ("run.json, for the whole run", FullDisk(metadata_file), {}),
        ("the end (finish marker)", FullDisk(end_file), {}),
        ("every write of the sync", FullDisk(lambda path: False), {"full_sync": True}),
    ]  # fmt: skip
    results = []
    for i, (name, disk, options) in enumerate(points):
        root = workdir / f"inject-{i}"
        root.mkdir()
        results.append(_in_process(server, root, name, disk, 40 + i, **options))
    return results


def run_disk_full(burst: int = BURST) -> tuple[bool, list[dict[str, str]], str | None]:
    """Every scenario (``burst``: the tmpfs runs' samples): whether all held, their rows, and
    why the tmpfs ones did not run."""
    wd = Workdir.make("disk")
    skipped = None
    try:
        with database("sqlite", wd.path) as url, Server(url) as server:
            results: list[FaultResult] = []
            for name, scenario in (("offline", tmpfs_offline), ("outage", tmpfs_outage)):
                with small_filesystem(wd.path / f"tmpfs-{name}", SIZE) as root:
                    if root is None:
                        skipped = "mounting a tmpfs is not permitted here"
                        break
                    results.append(scenario(server, wd.path, root, burst))
            results += injected_points(server, wd.path)
    finally:
        wd.close()
    return all(r.ok for r in results), [r.row() for r in results], skipped


def describe(skipped: str | None) -> str:
    """The section's text above its table (``skipped``: why the tmpfs scenarios did not run)."""
    text = (
        f"The client's spool on a full disk: a real {SIZE_TEXT} tmpfs (`mount -t tmpfs`; a client "
        f"process logging {BURST:,} samples as fast as it can, offline, and online with the "
        "server SIGKILLed before it starts, `flush_timeout=2`), and ENOSPC injected at the "
        f"spool's one write (`_spool_io._write_some`) at each point, for an offline run of "
        f"{INJECTED:,} samples (`memory_max=5000`) in this process. Then `noisescope sync` "
        "to a SQLite server (with `--run ID --end finished` where finish said the end could "
        "not be recorded). Held: `queued` 0 and `sent + spooled + dropped` = logged, the rows "
        "stored after sync = `sent + spooled` with the values logged, `last_error` and the "
        "line at finish give the `dropped` count, the run reads `finished` on the server "
        "(unless finish said nothing of it reached the spool), no temporary file left."
    )
    return text + (f" The tmpfs scenarios did not run: {skipped}." if skipped else "")
