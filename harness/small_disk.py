"""A full disk under the spool, two ways: a real small filesystem (a tmpfs, where this process
may mount one) and ENOSPC injected at the spool's one write (``noisescope._spool_io._write_some``).
Shared by tests/client/test_disk_full.py and the reliability suite's disk-full section."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["FullDisk", "end_file", "metadata_file", "segment_file", "small_filesystem"]


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "512k") -> Iterator[Path | None]:
    """A tmpfs of ``size`` mounted at ``path`` (made here) and unmounted afterwards; None where
    mounting is not permitted (not root, no CAP_SYS_ADMIN, no ``mount``)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except OSError:
        mounted = None
    if mounted is None or mounted.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        # lazily, should a descriptor on it still be open: the mount never outlives the test
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def segment_file(path: Path) -> bool:
    return path.name.startswith("seg-")


def metadata_file(path: Path) -> bool:
    """run.json, written as a temporary file first."""
    return path.name.startswith(".run.json.")


def end_file(path: Path) -> bool:
    return path.name == "end"


class FullDisk:
    """Stands in for ``noisescope._spool_io._write_some``: the files ``hit`` picks share ``room``
    bytes of free space; a write larger than what is left is short (as on a real filesystem)
    and the next one raises ENOSPC. Other files are written normally. Set ``room`` to give
    space back."""

    def __init__(self, hit: Callable[[Path], bool] = lambda path: True, room: int = 0) -> None:
        self.hit = hit
        self.room = room
        #: Writes refused with ENOSPC, and short writes.
        self.refused = 0
        self.short = 0

    def __call__(self, fd: int, data: memoryview, path: Path) -> int:
        if not self.hit(path):
            return os.write(fd, data)
        if self.room <= 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        written = os.write(fd, data[: self.room])
        self.room -= written
        self.short += written < len(data)
        return written
