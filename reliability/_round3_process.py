"""Nothing lost without a count (issue 46), the process classes: how a training process ends
and what it says, run once on SQLite with the client in its own process (``reliability._ending``)
where the process's end is the case: runs in multiprocessing children (item 4), a process ended
by a signal, an exception or Ctrl-C (item 5), run fields over the server's limits (item 8), a
password in the server URL (item 10, the client's part). Rows as in ``reliability._round3``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

import noisescope
from reliability._ending import SEED as ENDING_SEED
from reliability._infra import (
    REPO,
    Server,
    database,
    engine_for,
    port,
    spooled_seqs,
    sync_spool,
)
from reliability._reconcile import check_run, stored_seqs
from reliability._round3 import Round3Sizes, Row, run_status

#: Run fields the server would refuse (item 8): the field init must name, and the fields.
OVER_LIMITS: dict[str, tuple[str, dict[str, Any]]] = {
    "a 1 MiB config": ("config", {"config": {"weights": "x" * (1 << 20)}}),
    "10,000 tags": ("tags", {"tags": [str(i) for i in range(10_000)]}),
    "a 201-character name": ("name", {"name": "n" * 201}),
    "a 201-character project": ("project", {"project": "p" * 201}),
    "a blank project": ("project", {"project": "  "}),
    "a NUL in the task": ("task", {"task": "a\x00"}),
}
#: The password of item 10: it must appear nowhere the client writes or says.
PASSWORD = "hunter22-round3"


# -- items 4, 5 and 10: how a training process ends ------------------------------------------


@dataclass
class Ended:
    """A ``reliability._ending`` process after it ended."""

    run_id: str
    code: int
    logged: int
    output: str
    spool: Path

    def spooled(self) -> int:
        """Samples left in the run's spool when the process ended."""
        if not self.run_id or not (self.spool / self.run_id).is_dir():
            return 0
        return len(spooled_seqs(self.spool, self.run_id))


def _client_env() -> dict[str, str]:
    """This checkout's client and harness, and none of the caller's NOISESCOPE_* settings."""
    paths = [str(REPO / "client"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    return env | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_ending(
    url: str, workdir: Path, case: str, samples: int, *, stop: int = 0, after_s: float = 0.0
) -> Ended:
    """``python -m reliability._ending CASE`` against ``url``, in its own spool folder; with
    ``stop``, that signal is sent ``after_s`` seconds after the run started."""
    tag = f"{case}-{stop}" if stop else case
    spool, progress = workdir / f"spool-{tag}", workdir / f"progress-{tag}"
    cmd = [sys.executable, "-m", "reliability._ending", case, url, str(spool), str(samples),
           str(progress)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_client_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    if stop and run_id:
        time.sleep(after_s)
        proc.send_signal(stop)
    try:
        rest, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    try:
        logged = int(progress.read_bytes() or b"0")
    except (OSError, ValueError):
        logged = 0
    return Ended(run_id, proc.returncode, logged, run_id + "\n" + rest, spool)


def _delivered(server: Server, ended: Ended, item: int, case: str, want: str, exact: bool) -> Row:
    """Deliver what the process left in its spool (``noisescope sync``), then its row: every
    logged sample stored with its values, no gap in the steps (``exact``: exactly the
    ``SAMPLES`` it logged; else at least what its progress file says, as a signal may land
    between a log call and the progress write), and the run's status ``want``."""
    spooled = ended.spooled()
    sync = ""
    if ended.run_id and (ended.spool / ended.run_id).is_dir():
        code, output = sync_spool(ended.spool, server.url)
        sync = f"; sync: exit {code}, " + (output.splitlines()[-1] if output else "")
    engine = engine_for(server.database_url)
    try:
        seqs = stored_seqs(engine, ended.run_id) if ended.run_id else []
        check = check_run(engine, ended.run_id, ENDING_SEED, len(seqs)) if seqs else None
    finally:
        engine.dispose()
    stored = len(seqs)
    no_gap = seqs == list(range(stored))
    enough = stored == ended.logged if exact else ended.logged <= stored <= ended.logged + 1
    status = run_status(server, ended.run_id) if ended.run_id else "no run id"
    values = check is not None and check.values_ok
    held = no_gap and enough and values and status == want and stored > 0
    note = f"exit {ended.code}; steps without a gap: {'yes' if no_gap else 'NO'}; values "
    note += ("match" if values else "DIFFER") + sync
    if not ended.run_id or (ended.code not in (0, 1) and ended.code >= 0):
        note += f"; output: {ended.output[-300:]}"
    return Row(item, case, f"{ended.logged:,} samples", stored, spooled, 0, status, held, note)


def children(server: Server, workdir: Path, samples: int) -> list[Row]:
    """Item 4: a run started in a fork- or spawn-context child that returns without finish()
    is finished by the child's finalizers, with every sample stored."""
    rows = []
    for method in ("fork", "spawn"):
        ended = run_ending(server.url, workdir, method, samples)
        row = _delivered(server, ended, 4, f"run in a {method}-context child, no finish()",
                         "finished", exact=True)  # fmt: skip
        row.held &= ended.code == 0 and row.spooled == 0
        rows.append(row)
    return rows


def endings(server: Server, workdir: Path, samples: int, after_s: float) -> list[Row]:
    """Item 5: SIGTERM or SIGHUP ``after_s`` into a logging loop, or an uncaught exception or
    KeyboardInterrupt without ``with run:``: everything logged is stored or spooled (stored
    after ``noisescope sync``), the run is "failed", and a signal still ends the process."""
    rows = []
    for sig in (signal.SIGTERM, signal.SIGHUP):
        ended = run_ending(server.url, workdir, "signal", 0, stop=sig, after_s=after_s)
        row = _delivered(server, ended, 5, f"{sig.name} {after_s:g} s into the loop",
                         "failed", exact=False)  # fmt: skip
        row.held &= ended.code == -sig
        rows.append(row)
    for case, label in (("exception", "uncaught RuntimeError"), ("interrupt", "KeyboardInterrupt")):
        ended = run_ending(server.url, workdir, case, samples)
        row = _delivered(server, ended, 5, f"{label} after {samples:,}, no `with run:`",
                         "failed", exact=True)  # fmt: skip
        row.held &= ended.code != 0
        rows.append(row)
    return rows


def run_fields(server: Server, workdir: Path) -> list[Row]:
    """Item 8: init refuses run fields the server would refuse, naming the field, before
    anything is spooled or sent."""
    engine = engine_for(server.database_url)

    def runs() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM run")).scalar_one())

    rows = []
    try:
        for i, (label, (name, fields)) in enumerate(OVER_LIMITS.items()):
            spool = workdir / f"fields-{i}"
            before = runs()
            try:
                run = noisescope.init(url=server.url, dir=spool, quiet=True, **fields)
            except ValueError as exc:
                said = str(exc)
            else:
                run.finish(timeout=10)
                said = "accepted"
            files = sum(1 for p in spool.rglob("*") if p.is_file()) if spool.exists() else 0
            made = runs() - before
            held = said != "accepted" and name in said and files == 0 and made == 0
            rows.append(Row(8, f"init with {label}", "—", made, files, None,
                            "ValueError" if said != "accepted" else "accepted", held,
                            said[:140]))  # fmt: skip
    finally:
        engine.dispose()
    return rows


def password_in_url(server: Server, workdir: Path, samples: int) -> list[Row]:
    """Item 10 (the client's part): a password in the server URL appears in none of what the
    client says (warnings, the finish line, ``last_error``), writes (every spool file, run.json
    included) or ``noisescope sync`` prints; with the server up, and unreachable (spooled,
    then synced)."""
    live = server.url.replace("http://", f"http://ada:{PASSWORD}@")
    dead = f"http://ada:{PASSWORD}@127.0.0.1:{port()}"
    rows = []
    for label, url in (("server up", live), ("server unreachable, then sync", dead)):
        ended = run_ending(url, workdir, "password", samples)
        run_dir = ended.spool / ended.run_id
        files = [p for p in run_dir.rglob("*") if p.is_file()] if run_dir.is_dir() else []
        written = b"".join(p.read_bytes() for p in files).decode(errors="replace")
        spooled = ended.spooled()
        said = ended.output
        if run_dir.is_dir():
            code, output = sync_spool(ended.spool, live)
            said += output + f"\nsync exit {code}"
        engine = engine_for(server.database_url)
        try:
            stored = len(stored_seqs(engine, ended.run_id)) if ended.run_id else 0
        finally:
            engine.dispose()
        leaked = PASSWORD in said or PASSWORD in written
        masked = "ada:***@" in written if files else True
        # unreachable, the warnings name the server: the URL is there, with its password masked
        named = "127.0.0.1" in said or url == live
        held = not leaked and masked and named and stored == samples
        note = (
            f"looked in {len(said.splitlines())} lines of output (warnings, finish line, "
            f"last_error, sync) and {len(files)} spool files; password found: "
            + ("**YES**" if leaked else "no")
            + (f"; run.json names the URL masked: {'yes' if masked else 'NO'}" if files else "")
        )
        rows.append(Row(10, f"password in the URL, {label}", f"{ended.logged:,} samples",
                        stored, spooled, 0, run_status(server, ended.run_id), held,
                        note))  # fmt: skip
    return rows


def process_classes(workdir: Path, sizes: Round3Sizes) -> list[Row]:
    """Items 4, 5, 8 and 10 on one SQLite server (auth off)."""
    workdir = workdir / "process"
    workdir.mkdir()
    steps: list[Callable[[Server], list[Row]]] = [
        lambda srv: children(srv, workdir, sizes.samples),
        lambda srv: endings(srv, workdir, sizes.samples, sizes.signal_after_s),
        lambda srv: run_fields(srv, workdir),
        lambda srv: password_in_url(srv, workdir, sizes.samples),
    ]
    with database("sqlite", workdir) as url, Server(url) as srv:
        return [row for step in steps for row in step(srv)]
