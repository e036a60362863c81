"""A full disk under the spool: what ``status()`` counts as spooled is what ``noisescope sync``
delivers, every logged sample is sent, spooled or counted dropped (one count, in ``dropped``,
``last_error`` and the line at finish), and a run whose ``finish()`` ran reads finished after
the sync, or ``finish()`` says that its end could not be recorded.

On a real 512 KiB tmpfs where this process may mount one (skipped otherwise), and with ENOSPC
injected at the spool's one write (``_spool_io._write_some``) at each point: the first segment,
mid-segment, run.json, the end, and the sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import noisescope
from harness.small_disk import (
    FullDisk,
    end_file,
    metadata_file,
    segment_file,
    small_filesystem,
)
from noisescope import _spool_io
from noisescope._spool import RunSpool, encode_record
from noisescope._status import Status
from noisescope._sync import SyncResult, sync
from noisescope.cli import main as cli_main
from noisescope.testing import MemoryTransport as FakeServer

LOGGED = 6000


def columns(seqs: list[int]) -> dict[str, list[Any]]:
    n = len(seqs)
    return {"seq": seqs, "step": seqs, "b_small": [8.0] * n, "b_big": [64.0] * n,
            "g_small_sq": [2.0] * n, "g_big_sq": [1.0] * n}  # fmt: skip


def log(run: noisescope.Run, n: int) -> Status:
    for step in range(n):
        run.log_sample(step, 8, 64, 2.0 + step, 1.0)
    return run.finish()


def offline(root: Path, n: int = LOGGED, **options: Any) -> tuple[noisescope.Run, Status]:
    settings: dict[str, Any] = {"memory_max": 2000, "batch_max": 500, **options}
    run = noisescope.init(project="p", mode="offline", dir=root, **settings)
    return run, log(run, n)


def check_delivery(
    run: noisescope.Run, status: Status, fake: FakeServer, result: SyncResult, logged: int
) -> None:
    """Every logged sample sent, spooled or dropped; the spooled ones are what sync delivered;
    the dropped count is the one ``last_error`` gives."""
    assert status.queued == 0
    assert status.sent + status.spooled + status.dropped == logged, status
    assert result.samples == status.spooled == len(fake.rows(run.id)), (result, status)
    if status.dropped:
        assert (status.last_error or "").startswith(f"{status.dropped} samples dropped"), status


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    disk = FullDisk(lambda path: False)
    monkeypatch.setattr(_spool_io, "_write_some", disk)
    return disk


def test_a_write_that_fails_part_way_is_cut_back_to_the_last_whole_record(
    tmp_path: Path, full_disk: FullDisk
) -> None:
    full_disk.hit = segment_file
    first = encode_record({"columns": columns([0, 1])})
    full_disk.room = len(first) + 20  # the next record fits only in part
    spool = RunSpool(tmp_path, "r1")
    assert spool.acquire()
    assert spool.append(columns([0, 1]))
    with pytest.raises(OSError, match="No space left"):
        spool.append(columns([2, 3]))
    assert spool.pending_samples == 2
    [segment] = spool.seal()
    assert segment.read_bytes() == first
    full_disk.room = 1 << 20  # space is back: the next record is whole and readable
    assert spool.append(columns([4]))
    assert [s for p in spool.seal() for r in spool.read(p) for s in r["columns"]["seq"]] == [
        0,
        1,
        4,
    ]
    assert spool.pending_samples == 3


def test_an_offline_run_into_a_full_small_filesystem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's run, smaller: a 512 KiB tmpfs takes a few thousand of 40,000 samples."""
    with small_filesystem(tmp_path / "disk") as root:
        if root is None:
            pytest.skip("mounting a tmpfs is not permitted here")
        run, status = offline(root, 40_000, memory_max=4000, batch_max=1000, quiet=False)
        left = sorted(p.name for p in (root / run.id).iterdir())
        fake = FakeServer()
        result = sync(root, transport=fake)
    assert status.spooled > 0 and status.dropped > 0
    check_delivery(run, status, fake, result, 40_000)
    assert fake.runs[run.id]["status"] == "finished"
    assert not [name for name in left if name.endswith(".tmp")], left
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if f"run {run.id}" in ln]
    assert f"dropped {status.dropped}; last error: {status.dropped} samples dropped" in line


@pytest.mark.parametrize("room", [0, 40_000], ids=["first segment", "mid-segment"])
def test_enospc_in_a_segment(tmp_path: Path, full_disk: FullDisk, room: int) -> None:
    full_disk.hit, full_disk.room = segment_file, room
    run, status = offline(tmp_path)
    assert full_disk.short == (room > 0)
    fake = FakeServer()
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, LOGGED)
    assert (status.spooled > 0) == (room > 0)
    assert fake.runs[run.id]["status"] == "finished"


def test_run_json_refused_at_init_is_written_once_there_is_space(
    tmp_path: Path, full_disk: FullDisk
) -> None:
    full_disk.hit = metadata_file
    run = noisescope.init(project="p", mode="offline", dir=tmp_path, batch_max=500)
    assert not (tmp_path / run.id / "run.json").exists()
    assert not [p for p in (tmp_path / run.id).iterdir() if p.name.endswith(".tmp")]
    full_disk.room = 1 << 20
    status = log(run, LOGGED)
    fake = FakeServer()
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, LOGGED)
    assert status.spooled == LOGGED
    assert fake.runs[run.id]["status"] == "finished"


def test_without_run_json_nothing_counts_as_spooled(
    tmp_path: Path, full_disk: FullDisk, capsys: pytest.CaptureFixture[str]
) -> None:
    """A segment sync cannot find (no run.json beside it) would be samples counted kept and
    never delivered: none is written, they are counted dropped, and finish says so."""
    full_disk.hit = metadata_file
    run, status = offline(tmp_path, quiet=False)
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if f"run {run.id}" in ln]
    assert "Nothing of it is in the spool: its run.json could not be written" in line, line
    assert "noisescope sync" not in line
    fake = FakeServer()
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, LOGGED)
    assert status.dropped == LOGGED
    assert not list((tmp_path / run.id).glob("seg-*"))


def test_an_end_that_cannot_be_recorded_is_said_at_finish_and_sync_sends_it(
    tmp_path: Path, full_disk: FullDisk, capsys: pytest.CaptureFixture[str]
) -> None:
    full_disk.hit = end_file
    run, status = offline(tmp_path, quiet=False)
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if f"run {run.id}" in ln]
    command = f"noisescope sync {tmp_path} --url {run.settings.url} --run {run.id} --end finished"
    assert "its end (finished) could not be recorded" in line and command in line, line
    fake = FakeServer()
    result = sync(tmp_path, transport=fake, run_ids=[run.id], end="finished")
    check_delivery(run, status, fake, result, LOGGED)
    assert status.spooled == LOGGED
    assert fake.runs[run.id]["status"] == "finished"
    assert fake.runs[run.id]["ended_at"]


def test_the_end_is_written_into_space_kept_for_it(tmp_path: Path, full_disk: FullDisk) -> None:
    """Everything full once the run began: the end still overwrites its own slot in place
    (no new space on a real filesystem; see the tmpfs test) and sync marks the run."""
    run = noisescope.init(project="p", mode="offline", dir=tmp_path, batch_max=500)
    slot = tmp_path / run.id / "end"
    assert slot.is_file() and slot.stat().st_size > 0
    full_disk.hit = segment_file
    status = log(run, 100)
    fake = FakeServer()
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, 100)
    assert fake.runs[run.id]["status"] == "finished"


def test_sync_needs_no_space(tmp_path: Path, full_disk: FullDisk) -> None:
    run, status = offline(tmp_path, memory_max=LOGGED)
    full_disk.hit = lambda path: True  # every write during the sync fails
    fake = FakeServer()
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, LOGGED)
    assert status.spooled == LOGGED
    assert fake.runs[run.id]["status"] == "finished"
    assert not (tmp_path / run.id).exists()
    assert full_disk.refused == 0


def test_an_outage_onto_a_full_disk(tmp_path: Path, full_disk: FullDisk) -> None:
    """Online, the server down: what the disk took is delivered by sync, the rest counted."""
    full_disk.hit, full_disk.room = segment_file, 40_000
    fake = FakeServer(down=True)
    run = noisescope.init(
        project="p", transport=fake, dir=tmp_path, flush_timeout=0.2, memory_max=2000,
        batch_max=500, backoff_base=0.01, backoff_max=0.05,
    )  # fmt: skip
    status = log(run, LOGGED)
    fake.down = False
    result = sync(tmp_path, transport=fake)
    check_delivery(run, status, fake, result, LOGGED)
    assert status.spooled > 0 and status.dropped > 0
    assert fake.runs[run.id]["status"] == "finished"


def test_sync_end_is_only_for_named_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crashed run recorded no end either: --end applies only to the runs --run names."""
    assert cli_main(["sync", str(tmp_path), "--end", "finished"]) == 2
    assert "--end needs --run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs run_ids"):
        sync(tmp_path, transport=FakeServer(), end="finished")
