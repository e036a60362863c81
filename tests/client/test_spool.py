"""The on-disk spool: crash-safe records, locking, accounting; and `noisescope sync`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import noisescope
from noisescope import Request
from noisescope._spool import (
    RunSpool,
    decode_records,
    encode_record,
    merge_records,
    record_problem,
)
from noisescope._sync import report, sync
from noisescope.cli import main as cli_main
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.waiting import wait_for


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
    spool.append({{"seq": seqs, "step": seqs, "b_small": [8.0] * 10, "b_big": [64.0] * 10,
                  "g_small_sq": [2.0] * 10, "g_big_sq": [1.0] * 10}})
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


@pytest.mark.parametrize("made", [False, True], ids=["missing", "a file"])
def test_sync_of_a_folder_that_is_not_there_says_so_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], made: bool
) -> None:
    """Issue 47 item 6: a typo in the folder read "nothing to sync" and exited 0."""
    where = tmp_path / "nonexistent"
    if made:
        where.write_text("")
    assert cli_main(["sync", str(where), "--url", "http://127.0.0.1:9"]) == 2
    out, err = capsys.readouterr()
    assert "nothing to sync" not in out + err
    assert f"{where} {'is not a folder' if made else 'does not exist'}" in err, err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_sync_says_one_run_and_shows_progress_on_a_terminal_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47 items 6 and 8: "1 runs, 1 samples stored"; a count and the time left on a
    terminal, nothing in a log."""
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = sync(tmp_path, transport=FakeServer())
    monkeypatch.undo()
    assert "\rnoisescope sync [1/1 · 100%] 1 sample stored" in terminal.getvalue()
    assert report(result, tmp_path) == 0
    out, err = capsys.readouterr()
    assert f"synced {run.id}: 1 sample stored\n1 run, 1 sample stored\n" in out
    assert err == ""  # not a terminal: no progress line


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
    spool.write_meta({"run_id": "old-run", "run": {"project": "p", "task": "t"}, "final": final})
    (tmp_path / "old-run" / "end").unlink()
    spool.append(columns([0, 1]))
    spool.release()
    fake = FakeServer()
    assert sync(tmp_path, transport=fake).samples == 2
    assert fake.runs["old-run"]["status"] == "failed"


# -- a damaged spool (issue 46, item 6; tests/client/test_spool_damage.py fuzzes sync) ----------


def offline_spool(root: Path, records: int = 4, per_record: int = 50) -> str:
    """An offline run's spool (its run.json and end written by the client) holding ``records``
    records of ``per_record`` samples in one segment; its id."""
    run = noisescope.init(project="p", mode="offline", dir=root)
    run.finish()
    spool = RunSpool(root, run.id)
    assert spool.acquire()
    for r in range(records):
        assert spool.append(columns(list(range(r * per_record, (r + 1) * per_record))))
    spool.release()
    return run.id


def flip_a_byte(segment: Path, record: int) -> None:
    """A digit changed inside record ``record`` (from 0): its CRC no longer matches."""
    lines = segment.read_bytes().split(b"\n")
    line = bytearray(lines[record])
    at = line.index(b'"step":[') + len(b'"step":[')
    line[at] = ord("7") if line[at] != ord("7") else ord("3")
    lines[record] = bytes(line)
    segment.write_bytes(b"\n".join(lines))


def test_a_file_that_is_not_a_segment_is_neither_ordered_nor_sent(tmp_path: Path) -> None:
    """A file manager's copy once made ``init(run_id=...)`` on the folder raise ValueError."""
    run_id = offline_spool(tmp_path)
    folder = tmp_path / run_id
    (folder / "seg-000001 (copy).jsonl").write_bytes((folder / "seg-000001.jsonl").read_bytes())
    (folder / "seg-9.jsonl").write_bytes(b"not ours")
    spool = RunSpool(tmp_path, run_id)
    assert spool.acquire()
    assert [p.name for p in spool.seal()] == ["seg-000001.jsonl"]
    assert spool.pending_samples == 200
    assert spool.next_segment_name() == "seg-000002.jsonl"
    spool.release()
    again = noisescope.init(project="p", mode="offline", dir=tmp_path, run_id=run_id)
    again.log_sample(1000, 8, 64, 2.0, 1.0)
    assert again.finish().spooled == 201
    assert sorted(p.name for p in folder.glob("seg-*")) == [
        "seg-000001 (copy).jsonl",
        "seg-000001.jsonl",
        "seg-000002.jsonl",
        "seg-9.jsonl",
    ]


def test_a_live_run_adopting_a_damaged_leftover_delivers_the_rest_and_lets_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The orphan delivery once stopped at the copy with "internal error: ValueError" and kept
    the folder's lock; a flipped byte was deleted with its segment, unsaid."""
    url = "http://orphan.test:1"
    dead_id = offline_spool(tmp_path)
    folder = tmp_path / dead_id
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, "mode": "online", "url": url}))
    flip_a_byte(folder / "seg-000001.jsonl", 1)
    (folder / "seg-000001 (copy).jsonl").write_bytes((folder / "seg-000001.jsonl").read_bytes())
    fake = FakeServer()
    later = noisescope.init(project="p", url=url, transport=fake, dir=tmp_path)
    later.log_sample(0, 8, 64, 2.0, 1.0)
    assert wait_for(lambda: not (folder / "run.json").exists())
    status = later.finish()
    assert len(fake.rows(dead_id)) == 150  # every record but the damaged one
    assert fake.runs[dead_id]["status"] == "finished"
    said = f"spooled run {dead_id}: 1 record of seg-000001.jsonl (line 2; 50 samples), set aside"
    assert said in (status.last_error or "")
    assert said.replace(":", ": not sent:", 1) in caplog.text
    damaged = folder / "damaged" / "seg-000001.jsonl"
    assert damaged.read_bytes().count(b"\n") == 1  # the damaged line, kept
    assert (folder / "seg-000001 (copy).jsonl").is_file()  # not the spool's: left in place
    assert RunSpool(tmp_path, dead_id).acquire()  # the lock was given back


def test_a_reopened_run_replays_its_spool_without_the_damaged_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The live sender's replay (``RunSpool.read``) sets aside what the sync would."""
    run_id = offline_spool(tmp_path)
    segment = tmp_path / run_id / "seg-000001.jsonl"
    lines = segment.read_bytes().split(b"\n")
    record = json.loads(lines[2].rpartition(b"\t")[0])
    record["columns"]["seq"] = 5  # a scalar where a list belongs, under a valid CRC
    lines[2] = encode_record(record).rstrip(b"\n")
    segment.write_bytes(b"\n".join(lines))
    fake = FakeServer()
    run = noisescope.init(project="p", transport=fake, dir=tmp_path, run_id=run_id)
    status = run.finish()
    assert len(fake.rows(run_id)) == 150
    assert status.spooled == 0 and "internal error" not in (status.last_error or "")
    # the set-aside record's samples are counted dropped, with why: the totals balance
    assert status.dropped == 50 and "spool records were damaged" in (status.last_error or "")
    assert "column 'seq' is a number, not a list" in caplog.text
    assert (tmp_path / run_id / "damaged" / "seg-000001.jsonl").is_file()
    assert not (tmp_path / run_id / "run.json").exists()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda c: c.update(seq=5), "column 'seq' is a number, not a list"),
        (lambda c: c["loss"].pop(), "column 'loss' has 1 values where 'seq' has 2"),
        (lambda c: c.pop("b_big"), "no 'b_big' column"),
        (lambda c: c.update(extra=[1, 2]), "unknown column 'extra'"),
        (lambda c: c["step"].__setitem__(0, 1.5), "column 'step' holds 1.5; it takes integers"),
        (
            lambda c: c["b_small"].__setitem__(1, True),
            "column 'b_small' holds true; it takes numbers",
        ),
        (
            lambda c: c["series"].__setitem__(0, None),
            "column 'series' holds null; it takes strings",
        ),
        (
            lambda c: c["loss"].__setitem__(0, "x"),
            "column 'loss' holds \"x\"; it takes numbers or null",
        ),
    ],
)
def test_a_record_the_wire_does_not_take_is_named(change: Any, problem: str) -> None:
    record: dict[str, Any] = {"columns": {k: list(v) for k, v in columns([0, 1]).items()}}
    assert record_problem(record) is None
    change(record["columns"])
    assert record_problem(record) == problem
    assert record_problem({"events": [{"step": 1}, 3]}) == "an event is not an object"


def test_a_merge_never_shifts_the_values_of_other_records() -> None:
    short = columns([2, 3])
    short["loss"] = [1.0]  # a value short: passed alone, never merged
    records = [{"columns": columns([0, 1])}, {"columns": short}, {"columns": columns([4])}]
    merged = list(merge_records(records, 0, 100))
    assert [(last, cols["seq"]) for last, cols in merged] == [(0, [0, 1]), (1, [2, 3]), (2, [4])]


def test_counts_are_what_the_server_stored_also_when_a_sync_stops_part_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = offline_spool(tmp_path)
    monkeypatch.setattr(noisescope._sync, "SYNC_BATCH", 50)  # a request per record
    fake = FakeServer()
    posts: list[object] = []

    def count(request: object) -> None:
        posts.append(request)
        fake.down = len(posts) >= 3  # (read before this hook) the PUT and two records pass

    fake.on_request = count
    first = sync(tmp_path, transport=fake)
    assert first.samples == 100 and first.sent == 100
    assert "(100 samples stored before that; the rest stays in the spool)" in first.failed[run_id]
    fake.on_request, fake.down = None, False
    second = sync(tmp_path, transport=fake)
    assert (second.samples, second.sent, second.synced) == (100, 200, [run_id])
    assert len(fake.rows(run_id)) == 200


def test_a_refusal_that_names_no_sample_fails_the_run_and_keeps_its_spool(tmp_path: Path) -> None:
    """A 422 naming no sample for records that passed the client's checks is not about their
    values (a server that does not know a column): nothing is set aside, the spool stays."""
    run_id = offline_spool(tmp_path)
    fake = FakeServer()

    def refuse_samples(request: Request) -> None:
        fake.faults = [422]  # the next request, every one after the run's PUT

    fake.on_request = refuse_samples
    result = sync(tmp_path, transport=fake)
    assert "posting samples: HTTP 422" in result.failed[run_id], result
    assert not result.delivered and result.samples == 0
    assert not (tmp_path / run_id / "damaged").exists()
    assert len(RunSpool(tmp_path, run_id).read(tmp_path / run_id / "seg-000001.jsonl")) == 4
