"""The Run API: merging per (step, series), seq numbering, modes, ranks, fork, no exceptions."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import noisescope
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.waiting import wait_for


def make_run(fake: FakeServer, **kwargs: object) -> noisescope.Run:
    options: dict[str, object] = {"project": "p", "task": "t", "transport": fake}
    options.update(kwargs)
    return noisescope.init(**options)  # type: ignore[arg-type]


def test_scalars_logged_after_the_sample_land_on_it(fake: FakeServer) -> None:
    run = make_run(fake)
    run.log_sample(1, 8, 64, 2.0, 1.0)
    run.log(step=1, loss=0.7, lr=0.1, examples=64)
    run.log(loss=0.6, step=2)  # step 2 has no sample: not stored, but commits step 1
    run.log_sample(3, 8, 64, 3.0, 1.5, loss=0.5)
    run.finish()
    rows = fake.rows(run.id)
    assert [(r["seq"], r["step"], r["loss"], r["lr"], r["examples"]) for r in rows] == [
        (0, 1, 0.7, 0.1, 64.0),
        (1, 3, 0.5, None, None),
    ]


def test_scalars_logged_before_the_sample_and_several_series(fake: FakeServer) -> None:
    run = make_run(fake)
    for step in range(5):
        run.log(step=step, loss=1.0 / (step + 1))
        run.log_sample(step, 8, 64, 2.0, 1.0, series="")
        run.log_sample(step, 8, 64, 4.0, 2.0, series="layer1", examples=64 * (step + 1))
    run.finish()
    rows = fake.rows(run.id)
    assert [r["seq"] for r in rows] == list(range(10))
    assert all(r["loss"] == pytest.approx(1.0 / (r["step"] + 1)) for r in rows)
    assert {(r["step"], r["series"]) for r in rows} == {
        (s, name) for s in range(5) for name in ("", "layer1")
    }
    layer = [r for r in rows if r["series"] == "layer1"]
    assert [r["examples"] for r in layer] == [64.0 * (s + 1) for s in range(5)]


def test_repeated_sample_for_same_step_and_series_is_merged(fake: FakeServer) -> None:
    run = make_run(fake)
    run.log_sample(7, 8, 64, 2.0, 1.0)
    run.log_sample(7, 16, 64, 5.0, 4.0, lr=0.3)
    run.finish()
    [row] = fake.rows(run.id)
    assert (row["b_small"], row["g_small_sq"], row["g_big_sq"], row["lr"]) == (16, 5.0, 4.0, 0.3)


def test_run_is_created_with_its_metadata_and_finished(fake: FakeServer) -> None:
    with make_run(
        fake, name="bs64", config={"lr": 0.1, "obj": object()}, tags=["a"], batch_size=64,
        units="tokens",
    ) as run:  # fmt: skip
        run.log_sample(0, 8, 64, 2.0, 1.0)
    meta = fake.runs[run.id]
    assert meta["name"] == "bs64"
    assert meta["units"] == "tokens"
    assert meta["batch_size"] == 64
    assert meta["tags"] == ["a"]
    assert meta["config"]["lr"] == 0.1
    assert isinstance(meta["config"]["obj"], str)  # unknown objects are stringified
    assert meta["status"] == "finished"
    assert meta["ended_at"]
    assert len(run.id) == 32
    int(run.id, 16)


def test_context_manager_marks_failure_and_reraises(fake: FakeServer) -> None:
    run = make_run(fake)

    def train() -> None:
        with run:
            run.log_sample(0, 8, 64, 2.0, 1.0)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        train()
    assert fake.runs[run.id]["status"] == "failed"
    assert len(fake.rows(run.id)) == 1


def test_status_counts_every_sample(fake: FakeServer) -> None:
    run = make_run(fake)
    for step in range(100):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    status = run.finish()
    assert (status.sent, status.spooled, status.dropped, status.queued) == (100, 0, 0, 0)
    assert status.last_error is None


def test_bad_input_never_raises_and_is_counted(fake: FakeServer) -> None:
    run = make_run(fake)
    run.log_sample(0, 8, 64, float("nan"), 1.0)  # non-finite norm: unusable, counted
    run.log_sample(1, 8, 64, "x", 1.0)  # type: ignore[arg-type]
    run.log_sample(2, 8, 64, 2.0, 1.0, series=["unhashable"])  # type: ignore[arg-type]
    run.log_sample(3, 8, 64, 2.0, 1.0, loss=float("inf"))  # bad loss: stored as null
    status = run.finish()
    rows = fake.rows(run.id)
    assert [(r["step"], r["loss"]) for r in rows] == [(3, None)]
    assert status.dropped == 2


def test_explicit_arguments_override_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NOISESCOPE_URL", "http://env.invalid:1")
    monkeypatch.setenv("NOISESCOPE_MODE", "offline")
    monkeypatch.setenv("NOISESCOPE_TOKEN", "env-token")
    run = noisescope.init(project="p", mode="disabled")
    assert run.settings.url == "http://env.invalid:1"
    assert run.settings.token == "env-token"
    assert run.mode == "disabled"
    run2 = noisescope.init(project="p", url="http://arg:2", token="t", dir=tmp_path / "d")
    try:
        assert (run2.settings.url, run2.settings.token, run2.mode) == (
            "http://arg:2",
            "t",
            "offline",
        )
        assert run2.settings.dir == tmp_path / "d"
    finally:
        run2.finish()
    with pytest.raises(ValueError, match="NOISESCOPE_MODE"):
        noisescope.init(project="p", mode="sometimes")


def test_disabled_mode_does_nothing(fake: FakeServer, tmp_path: Path) -> None:
    run = make_run(fake, mode="disabled", dir=tmp_path / "nothing")
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log(loss=1.0)
    status = run.finish()
    assert fake.requests == []
    assert not (tmp_path / "nothing").exists()
    assert (status.mode, status.sent, status.queued) == ("disabled", 0, 0)


def test_only_rank_zero_sends_by_default(fake: FakeServer) -> None:
    rank1 = make_run(fake, rank=1, world_size=2)
    rank1.log_sample(0, 8, 64, 2.0, 1.0)
    rank1.finish()
    assert fake.requests == []
    assert not rank1.active


def test_all_ranks_tag_series_and_interleave_seq(fake: FakeServer, tmp_path: Path) -> None:
    runs = [
        make_run(fake, rank=r, world_size=2, all_ranks=True, run_id="ab" * 16, dir=tmp_path)
        for r in (0, 1)
    ]
    assert all(run._spool is not None for run in runs)  # one spool per rank on one host
    for step in range(3):
        for run in runs:
            run.log_sample(step, 8, 16, 2.0, 1.0)
    for run in runs:
        run.finish()
    rows = fake.rows("ab" * 16)
    assert [r["seq"] for r in rows] == list(range(6))
    assert {r["series"] for r in rows} == {"rank0", "rank1"}
    assert all(r["series"] == f"rank{r['seq'] % 2}" for r in rows)


def test_concurrent_threads_lose_nothing(fake: FakeServer) -> None:
    run = make_run(fake, batch_max=50)

    def worker(series: str) -> None:
        for step in range(500):
            run.log_sample(step, 8, 64, 2.0, 1.0, series=series)

    threads = [threading.Thread(target=worker, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    status = run.finish()
    rows = fake.rows(run.id)
    # Interleaved steps commit early, so a (step, series) may appear more than once, but no
    # logged value is lost and seq is dense.
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert {(r["step"], r["series"]) for r in rows} == {
        (s, f"s{i}") for s in range(500) for i in range(4)
    }
    assert status.dropped == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_inherit_a_live_sender(fake: FakeServer) -> None:
    run = make_run(fake)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a DataLoader worker, say
        code = 0
        try:
            run.log_sample(1, 8, 64, 2.0, 1.0)
            run.finish()
            if run.active or run._sender is not None:
                code = 3
            if any(t.name == "noisescope-sender" for t in threading.enumerate()):
                code = 4
        except BaseException:
            code = 5
        os.write(write_fd, bytes([code]))
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    assert os.read(read_fd, 1) == bytes([0])
    run.log_sample(2, 8, 64, 2.0, 1.0)
    run.finish()
    assert [r["step"] for r in fake.rows(run.id)] == [0, 2]  # parent unaffected, child silent


def test_samples_are_sent_in_the_background_without_finish(fake: FakeServer) -> None:
    run = make_run(fake, batch_interval=0.05)
    for step in range(10):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    run.log(step=10)  # commits step 9
    assert wait_for(lambda: len(fake.rows(run.id)) == 10)
    run.finish()


def test_all_ranks_offline_spools_sync_into_one_run(tmp_path: Path) -> None:
    runs = [
        noisescope.init(project="p", mode="offline", rank=r, world_size=2, all_ranks=True,
                        run_id="cd" * 16, dir=tmp_path)
        for r in (0, 1)
    ]  # fmt: skip
    for step in range(5):
        for run in runs:
            run.log_sample(step, 8, 16, 2.0, 1.0)
    for run in runs:
        run.finish()
    fake = FakeServer()
    result = noisescope.sync(tmp_path, transport=fake)
    assert sorted(result.synced) == ["cd" * 16 + ".rank0", "cd" * 16 + ".rank1"]
    assert [r["seq"] for r in fake.rows("cd" * 16)] == list(range(10))
