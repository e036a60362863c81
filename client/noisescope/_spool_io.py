"""The spool's file primitives: every byte the spool writes goes through ``_write_some``, the one
seam where tests inject a full disk (ENOSPC); whole writes are ``fsync``-ed, replacements atomic."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


def _write_some(fd: int, data: memoryview, path: Path) -> int:
    """The spool's one ``os.write`` (``path``: the file ``fd`` writes, for tests that inject a
    full disk here). May write less than ``data``, as ``os.write`` may."""
    return os.write(fd, data)


def _write_all(fd: int, data: bytes, path: Path) -> None:
    """All of ``data``, then ``fsync``; OSError if any of it could not be written."""
    view = memoryview(data)
    while view:
        written = _write_some(fd, view, path)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        view = view[written:]
    os.fsync(fd)


def _replace_file(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` (temp file, fsync, rename); on failure the
    temp file is removed and ``path`` is as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            _write_all(fd, data, tmp)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _overwrite_file(path: Path, data: bytes) -> None:
    """Write ``data`` over the start of ``path`` in place (created if missing) and cut what
    is left beyond it: an overwrite of space the file already holds needs no new space."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        _write_all(fd, data, path)
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        return False
