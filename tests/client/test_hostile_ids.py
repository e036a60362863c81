"""Hostile run ids and spool folders: nothing outside the spool root's own run folder changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import noisescope
from harness.spool_layout import HOSTILE_RUN_IDS, plant_layout, tree
from noisescope._spool import RunSpool
from noisescope._sync import sync
from noisescope.testing import MemoryTransport as FakeServer


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(spool root, base): see ``plant_layout``."""
    base = tmp_path / "base"
    return plant_layout(base), base


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS)
def test_a_hostile_run_id_is_refused_at_init_and_touches_nothing(
    layout: tuple[Path, Path], run_id: str
) -> None:
    root, base = layout
    before = tree(base)
    with pytest.raises(ValueError, match=r"run id .* is not valid: use 1-64 characters"):
        noisescope.init(mode="offline", dir=root, run_id=run_id)
    assert tree(base) == before


def test_a_hostile_run_id_from_the_environment_is_refused(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, base = layout
    before = tree(base)
    monkeypatch.setenv("NOISESCOPE_RUN_ID", "..")
    with pytest.raises(ValueError, match="is not valid"):
        noisescope.init(mode="offline", dir=root)
    assert tree(base) == before


def test_a_symlinked_run_folder_pointing_outside_is_not_used(layout: tuple[Path, Path]) -> None:
    root, base = layout
    (root / "linked").symlink_to(base / "outside", target_is_directory=True)
    before = tree(base)
    run = noisescope.init(mode="offline", dir=root, run_id="linked")
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log_sample(1, 8, 64, 2.0, 1.0)
    status = run.finish()
    assert tree(base) == before
    assert status.spool_dir is None
    assert status.dropped == 2  # no spool: counted, not written anywhere


def test_a_valid_run_changes_only_its_own_folder(layout: tuple[Path, Path]) -> None:
    root, base = layout
    before = tree(base)
    run = noisescope.init(mode="offline", dir=root, run_id="good-run.1")
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    after = tree(base)
    assert {k: v for k, v in after.items() if not k.startswith("home/spool/good-run.1")} == before
    assert sync(root, transport=(fake := FakeServer()), run_ids=["good-run.1"]).synced
    assert len(fake.rows("good-run.1")) == 1
    assert tree(base) == before  # the folder the spool created is gone, nothing else


def test_finish_never_removes_a_folder_the_spool_did_not_create(tmp_path: Path) -> None:
    """A run folder that existed before the run (no spool marker), or that holds a file the
    spool did not write, survives the run's clean removal."""
    root = tmp_path / "spool"
    (root / "theirs").mkdir(parents=True)
    (root / "theirs" / "notes.txt").write_text("mine")
    run = noisescope.init(transport=FakeServer(), dir=root, run_id="theirs")
    run.log_sample(0, 8, 64, 2.0, 1.0)
    assert run.finish().sent == 1
    assert (root / "theirs" / "notes.txt").read_text() == "mine"

    mine = noisescope.init(transport=FakeServer(), dir=root, run_id="mine")
    (root / "mine" / "notes.txt").write_text("added during the run")
    mine.log_sample(0, 8, 64, 2.0, 1.0)
    assert mine.finish().sent == 1
    assert (root / "mine" / "notes.txt").read_text() == "added during the run"


@pytest.mark.parametrize("meta_id", ["..", ".", "../x", "/abs", 7])
def test_sync_refuses_a_hostile_run_id_in_spool_metadata(
    layout: tuple[Path, Path], meta_id: object
) -> None:
    root, base = layout
    folder = root / "planted"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": meta_id, "run": {}, "final": None}))
    before = tree(base)
    fake = FakeServer()
    result = sync(root, transport=fake, run_ids=["planted"])
    assert "is not valid" in result.failed["planted"]
    assert fake.requests == []
    assert tree(base) == before


@pytest.mark.parametrize("folder", ["..", ".", "../home", "a/b", "/abs"])
def test_sync_of_a_hostile_folder_name_touches_nothing(
    layout: tuple[Path, Path], folder: str
) -> None:
    root, base = layout
    before = tree(base)
    result = sync(root, transport=FakeServer(), run_ids=[folder])
    assert folder in result.failed
    assert tree(base) == before


def test_spool_refuses_paths_outside_its_root(tmp_path: Path) -> None:
    for bad in ("..", "../x", "a/b"):
        with pytest.raises(ValueError, match="is not valid"):
            RunSpool(tmp_path, bad)
    with pytest.raises(ValueError, match="spool folder"):
        RunSpool(tmp_path, "ok", name="../ok")
    (tmp_path / "out").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "ok").symlink_to(tmp_path / "out")
    with pytest.raises(OSError, match="outside"):
        RunSpool(tmp_path / "root", "ok").acquire()
    assert list((tmp_path / "out").iterdir()) == []
