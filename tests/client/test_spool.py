"""The on-disk spool: crash-safe records, locking, accounting; and `noisescope sync`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import noisescope
from noisescope._spool import RunSpool, decode_records, encode_record
from noisescope._sync import sync
from noisescope.cli import main as cli_main
from tests.client._fakes import FakeServer, wait_for


def columns(seqs: list[int]) -> dict[str, list[Any]]:
    n = len(seqs)
    return {
        "seq": seqs,
        "step": seqs,
        "examples": [None] * n,
        "b_small": [8.0] * n,
        "b_big": [64.0] * n,
        "g_small_sq": [2.0] * n,
        "g_big_sq": [1.0] * n,
        "loss": [None] * n,
        "lr": [None] * n,
        "time": [0.0] * n,
        "series": [""] * n,
    }


def test_torn_and_corrupt_records_are_skipped() -> None:
    good1 = encode_record({"columns": columns([0, 1])})
    good2 = encode_record({"columns": columns([2])})
    corrupt = bytearray(encode_record({"columns": columns([3])}))
    corrupt[5] ^= 0xFF  # a flipped byte: CRC mismatch
    torn = encode_record({"columns": columns([4])})[:-7]  # crash mid-write
    records = list(decode_records(good1 + bytes(corrupt) + good2 + torn))
    assert [r["columns"]["seq"] for r in records] == [[0, 1], [2]]


def test_spool_survives_a_killed_writer(tmp_path: Path) -> None:
    """A process SIGKILLed while spooling leaves every acknowledged append readable."""
    script = f"""
import os, signal
from noisescope._spool import RunSpool
spool = RunSpool({str(tmp_path)!r}, "r1")
assert spool.acquire()
for i in range(50):
    seqs = list(range(i * 10, i * 10 + 10))
    spool.append({{"seq": seqs, "step": seqs}})
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    spool = RunSpool(tmp_path, "r1")
    assert spool.acquire()  # the dead owner's lock is gone
    assert spool.pending_samples == 500
    seqs = [s for p in spool.seal() for r in spool.read(p) for s in r["columns"]["seq"]]
    assert seqs == list(range(500))


def test_a_live_runs_spool_is_locked(tmp_path: Path) -> None:
    first = RunSpool(tmp_path, "r2")
    assert first.acquire()
    assert not RunSpool(tmp_path, "r2").acquire()
    first.release()
    assert RunSpool(tmp_path, "r2").acquire()


def test_offline_run_then_sync_delivers_everything_once(tmp_path: Path) -> None:
    run = noisescope.init(
        project="p", task="t", name="offline", mode="offline", dir=tmp_path, batch_max=30
    )
    for step in range(100):
        run.log_sample(step, 8, 64, 2.0 + step, 1.0)
        run.log(loss=1.0 / (step + 1))
    status = run.finish()
    assert (status.spooled, status.sent) == (100, 0)

    fake = FakeServer()
    fake.faults = [503]  # the first sync attempt fails: nothing is deleted
    first = sync(tmp_path, transport=fake)
    assert run.id in first.failed
    assert (tmp_path / run.id).is_dir()
    second = sync(tmp_path, transport=fake)
    assert second.synced == [run.id]
    assert second.samples == 100
    rows = fake.rows(run.id)
    assert [r["seq"] for r in rows] == list(range(100))
    assert rows[-1]["loss"] == 1.0 / 100
    assert fake.runs[run.id]["status"] == "finished"
    assert fake.runs[run.id]["name"] == "offline"
    assert not (tmp_path / run.id).exists()
    assert sync(tmp_path, transport=fake).synced == []  # nothing left; repeat is harmless


def test_sync_skips_a_run_that_is_still_live(tmp_path: Path) -> None:
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.flush(0.5)
    result = sync(tmp_path, transport=FakeServer())
    assert result.skipped == {run.id: "in use by a live process"}
    run.finish()


def test_sync_cli_reports_and_fails_on_unreachable_server(tmp_path: Path, capsys: object) -> None:
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    code = cli_main(["sync", str(tmp_path), "--url", "http://127.0.0.1:9"])
    assert code == 1
    assert (tmp_path / run.id).is_dir()  # still there for the next try
    assert os.listdir(tmp_path) == [run.id]


def test_events_of_an_offline_run_are_spooled_and_synced(tmp_path: Path) -> None:
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log_event(0, "batch_size", {"from": 64, "to": 128})
    run.log_sample(1, 8, 64, 2.0, 1.0)
    run.finish()
    fake = FakeServer()
    assert sync(tmp_path, transport=fake).synced == [run.id]
    assert len(fake.rows(run.id)) == 2
    [event] = fake.events[run.id].values()
    assert (event["step"], event["kind"], event["payload"]) == (
        0,
        "batch_size",
        {"from": 64, "to": 128},
    )


def test_events_left_at_finish_during_an_outage_are_spooled(tmp_path: Path) -> None:
    fake = FakeServer(down=True)
    run = noisescope.init(project="p", transport=fake, dir=tmp_path, flush_timeout=0.2)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log_event(0, "batch_size", {"to": 128})
    run.finish()
    fake.down = False
    assert sync(tmp_path, transport=fake).synced == [run.id]
    assert [e["kind"] for e in fake.events[run.id].values()] == ["batch_size"]
    assert len(fake.rows(run.id)) == 1


def test_a_later_online_run_delivers_what_a_dead_run_left_in_the_spool(tmp_path: Path) -> None:
    fake = FakeServer(down=True)
    url = "http://orphan.test:1"
    dead = noisescope.init(project="p", url=url, transport=fake, dir=tmp_path, flush_timeout=0.1)
    for step in range(50):
        dead.log_sample(step, 8, 64, 2.0, 1.0)
    assert dead.finish().spooled == 50  # as if the job had been killed during the outage
    offline = noisescope.init(project="p", mode="offline", dir=tmp_path)
    offline.log_sample(0, 8, 64, 2.0, 1.0)
    offline.finish()
    other_server = noisescope.init(
        project="p",
        url="http://elsewhere:1",
        transport=FakeServer(),
        dir=tmp_path,
        flush_timeout=0.1,
        mode="offline",
    )
    other_server.finish()

    fake.down = False
    later = noisescope.init(project="p", url=url, transport=fake, dir=tmp_path)
    later.log_sample(0, 8, 64, 2.0, 1.0)
    later.flush()
    assert wait_for(lambda: len(fake.rows(dead.id)) == 50)
    assert wait_for(lambda: not (tmp_path / dead.id).exists())
    later.finish()
    assert fake.runs[dead.id]["status"] == "finished"
    assert (tmp_path / offline.id).is_dir()  # offline runs wait for an explicit sync
    assert offline.id not in fake.runs


def test_a_spool_with_its_end_in_run_json_is_still_finished_by_sync(tmp_path: Path) -> None:
    """Spools written by earlier clients keep the final status in run.json (no end file)."""
    spool = RunSpool(tmp_path, "old-run")
    assert spool.acquire()
    final = {"status": "failed", "ended_at": "2024-01-01T00:00:00+00:00"}
    spool.write_meta({"run_id": "old-run", "run": {"project": "p"}, "final": final})
    (tmp_path / "old-run" / "end").unlink()
    spool.append(columns([0, 1]))
    spool.release()
    fake = FakeServer()
    assert sync(tmp_path, transport=fake).samples == 2
    assert fake.runs["old-run"]["status"] == "failed"
