"""Hostile run ids and the spool layout they must not escape: shared by the client tests and
the reliability suite's fault check, so both try the same ids against the same neighbours."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["HOSTILE_RUN_IDS", "plant_layout", "tree"]

#: Run ids that name no folder of their own: the current and parent folders, paths, empty,
#: hidden, too long, control characters, encoded dots.
HOSTILE_RUN_IDS = [
    ".", "..", "../x", "../../x", "/abs", "a/b", "a\\b", "..\\x", "", " ", ".hidden", "~",
    "x" * 65, "a\x00b", "run\n", "%2e%2e", "a/../..",
]  # fmt: skip


def tree(base: Path) -> dict[str, bytes | str]:
    """Every path under ``base`` with its content (files), target (links) or "dir"."""
    snapshot: dict[str, bytes | str] = {}
    for top, dirs, files in os.walk(base):
        for name in dirs + files:
            path = Path(top) / name
            key = str(path.relative_to(base))
            if path.is_symlink():
                snapshot[key] = "link:" + os.readlink(path)
            elif path.is_dir():
                snapshot[key] = "dir"
            else:
                snapshot[key] = path.read_bytes()
    return snapshot


def plant_layout(base: Path) -> Path:
    """The spool root ``base/home/spool``, returned, holding another run's unsent spool; beside
    it a database and a sibling folder ``x`` (where "../x" would land), and a folder outside
    everything holding a file."""
    root = base / "home" / "spool"
    other = root / "other-run"
    other.mkdir(parents=True)
    (other / "run.json").write_text(json.dumps({"run_id": "other-run", "run": {}}))
    (other / "seg-000001.jsonl").write_bytes(b"unsent\n")
    (base / "home" / "noisescope.db").write_bytes(b"the local database")
    (base / "home" / "x").mkdir()
    (base / "home" / "x" / "keep").write_bytes(b"a sibling")
    (base / "outside").mkdir()
    (base / "outside" / "precious").write_bytes(b"outside the spool")
    return root
