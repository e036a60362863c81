"""Crash-safe, append-only on-disk spool: where samples wait while the server is unreachable.

Layout under the spool root (``NOISESCOPE_DIR``)::

    <root>/<run_id>/run.json          the run's PUT body and server URL (atomic replace)
    <root>/<run_id>/end               the run's final status, written in place (see below)
    <root>/<run_id>/seg-000001.jsonl  batches, one per line: <json>\\t<crc32 hex>\\n
    <root>/<run_id>/lock              flock held by the live process that owns the run
    <root>/<run_id>/.noisescope-spool marker: this folder was created by a spool

Run folders are direct children of the root, named by a valid run id (``_wire.run_id_problem``);
every path is resolved and refused if it leads outside the root (a symlinked run folder). The
spool removes only a folder it created (the marker), and only the files it writes there.

Each batch is written with ``write`` on an ``O_APPEND`` descriptor and ``fsync``-ed, so a
crash can only leave a torn *last* line, which the CRC check skips on replay. Segments are
deleted only after the server acknowledged every batch in them; the server inserts-or-ignores on
(run, seq), so replaying a segment twice never duplicates a sample.

A full disk: every byte the spool writes goes through ``_write_some``, the one seam where tests
inject ENOSPC. A batch is counted spooled only once all of it is on disk; a write that fails
part-way is cut back to the last whole record. No batch is appended before run.json is on
disk (sync finds a run by it), so nothing is counted spooled that sync cannot deliver. The
``end`` file is filled with spaces when the run begins and overwritten in place at finish,
which needs no new space on filesystems that overwrite in place (ext4, XFS, tmpfs); where even
that fails, ``finish()`` says so and ``noisescope sync --run ID --end STATUS`` sends the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from noisescope import _json, _wire

try:  # POSIX only; on other systems concurrent sync of a live run is not guarded.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

SEGMENT_MAX_BYTES = 8 * 1024 * 1024
META_NAME = "run.json"
END_NAME = "end"
#: The end file's size when the run begins: room for ``{"status": ..., "ended_at": ...}``.
END_BYTES = 512
LOCK_NAME = "lock"
MARKER_NAME = ".noisescope-spool"
#: A run folder: the run id, or ``<run id>.rank<r>`` when several ranks spool on one host.
_RANK_SUFFIX = re.compile(r"\.rank[0-9]{1,6}")


class SpoolPathError(OSError):
    """A run folder that resolves outside the spool root (refused; nothing is written)."""


Columns = dict[str, list[Any]]


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


def encode_record(payload: dict[str, Any]) -> bytes:
    text = _json.dumps(payload)
    return text + b"\t" + format(zlib.crc32(text), "08x").encode() + b"\n"


def decode_records(data: bytes) -> Iterator[dict[str, Any]]:
    """Valid records in ``data``; torn or corrupt lines (a crash mid-write) are skipped."""
    for line in data.split(b"\n"):
        text, sep, crc = line.rpartition(b"\t")
        if not sep or len(crc) != 8:
            continue
        try:
            if int(crc, 16) != zlib.crc32(text):
                continue
            record = _json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def batch_size(record: dict[str, Any]) -> int:
    columns = record.get("columns") or {}
    seq = columns.get("seq") or []
    return len(seq)


class RunSpool:
    """One run's spool directory. Thread-safe; all methods may be called from any thread."""

    def __init__(
        self, root: Path, run_id: str, max_bytes: int = 1 << 30, name: str | None = None
    ) -> None:
        problem = _wire.run_id_problem(run_id)
        if problem is not None:
            raise ValueError(problem)
        folder = name or run_id
        if folder != run_id and not (
            folder.startswith(run_id) and _RANK_SUFFIX.fullmatch(folder[len(run_id) :])
        ):
            raise ValueError(f"spool folder {folder!r} is not {run_id!r} or {run_id!r}.rank<r>")
        self.root = Path(root)
        self.run_id = run_id
        #: Directory name: the run id, or e.g. ``<run id>.rank3`` when several ranks of one run
        #: spool on the same host (run.json then holds the real run id).
        self.dir = self.root / folder
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._segment: Path | None = None
        self._segment_index = 0
        self._segment_bytes = 0
        self._lock_fd: int | None = None
        self.bytes_used = 0
        self.pending_samples = 0
        # a segment being replayed: (records the server took, samples among them)
        self._replayed: dict[Path, tuple[int, int]] = {}
        #: run.json's content while it is not on disk yet (a full disk when the run began).
        self._meta_unwritten: bytes | None = None
        #: Why run.json is not on disk yet (then nothing of the run is in the spool), if it is not.
        self.meta_problem: str | None = None

    @classmethod
    def at(cls, root: Path, folder: str, max_bytes: int = 1 << 30) -> RunSpool:
        """The spool of an existing run folder (``<id>`` or ``<id>.rank<r>``); ValueError if
        the name is not one a spool creates."""
        match = re.fullmatch(r"(.+?)(\.rank[0-9]{1,6})?", folder)
        run_id = match.group(1) if match is not None and match.group(2) else folder
        return cls(root, run_id, max_bytes, name=folder)

    # -- paths ---------------------------------------------------------------------------------
    def _contained(self) -> Path:
        """The run folder, after checking that it resolves to a direct child of the root (a
        symlink out of the root, or a root that moved under us, is refused)."""
        root = self.root.resolve()
        target = self.dir.resolve()
        if target.parent != root or target.name != self.dir.name:
            raise SpoolPathError(f"spool folder {self.dir} resolves to {target}, outside {root}")
        return target

    def _make_dir(self) -> None:
        """Create the run folder (and mark it as the spool's) unless it exists."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._contained()
        try:
            self.dir.mkdir()
        except FileExistsError:
            self._contained()  # a symlink created meanwhile: check again
            return
        try:
            _overwrite_file(self.dir / MARKER_NAME, self.run_id.encode())
        except OSError:
            with contextlib.suppress(OSError):  # an unmarked folder would never be removed
                (self.dir / MARKER_NAME).unlink()
                self.dir.rmdir()
            raise

    def owned(self) -> bool:
        """Whether the run folder is one a spool created, inside the root."""
        try:
            self._contained()
        except OSError:
            return False
        return (self.dir / MARKER_NAME).is_file() and not (self.dir / MARKER_NAME).is_symlink()

    # -- ownership -------------------------------------------------------------------------
    def acquire(self, blocking: bool = False) -> bool:
        """Create the directory and take its lock; False if another live process holds it."""
        self._make_dir()
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError:
                os.close(fd)
                return False
        self._lock_fd = fd
        self._scan()
        return True

    def release(self) -> None:
        with self._lock:
            self._close_segment()
            if self._lock_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._lock_fd)
                self._lock_fd = None

    def _scan(self) -> None:
        """Account for segments left by an earlier process (used by sync and re-opened runs)."""
        with self._lock:
            self.bytes_used = 0
            self.pending_samples = 0
            self._replayed.clear()
            for path in self._segment_paths():
                data = path.read_bytes()
                self.bytes_used += len(data)
                self.pending_samples += sum(batch_size(r) for r in decode_records(data))
                index = int(path.stem.split("-")[1])
                self._segment_index = max(self._segment_index, index)

    # -- metadata ----------------------------------------------------------------------------
    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write run.json (atomically) and, blank, the end's space: the run is running. If
        run.json cannot be written (OSError), every append tries it again first."""
        data = json.dumps(meta, indent=1, default=str).encode()
        with self._lock:
            self._make_dir()
            self._meta_unwritten = data
            self._write_pending_meta()

    def _write_pending_meta(self) -> None:
        """run.json and the blank end, if run.json is not on disk yet (caller holds the lock);
        OSError if run.json cannot be written. Without the end's space, finish writes it anew."""
        if self._meta_unwritten is None:
            return
        try:
            _replace_file(self.dir / META_NAME, self._meta_unwritten)
        except OSError as exc:
            self.meta_problem = str(exc)
            raise
        self._meta_unwritten = self.meta_problem = None
        with contextlib.suppress(OSError):
            _overwrite_file(self.dir / END_NAME, b" " * END_BYTES)

    def read_meta(self) -> dict[str, Any] | None:
        return self._read_object(META_NAME)

    def write_end(self, final: dict[str, Any]) -> None:
        """Record the run's final status (``{"status", "ended_at"}``) for sync, over the space
        kept for it; OSError if it (or run.json, without which sync finds nothing) cannot be."""
        data = json.dumps(final).encode()
        with self._lock:
            self._write_pending_meta()
            _overwrite_file(self.dir / END_NAME, data.ljust(END_BYTES))

    def read_end(self) -> dict[str, Any] | None:
        """The final status ``write_end`` recorded; None for a running run (or a torn end)."""
        return self._read_object(END_NAME)

    def _read_object(self, name: str) -> dict[str, Any] | None:
        """The JSON object in this spool's file ``name``; None when the spool folder is not
        where it should be, or the file is missing, unreadable, torn or not an object."""
        if not self._is_inside():
            return None
        try:
            value = json.loads((self.dir / name).read_bytes())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def last_written(self) -> str:
        """When the run last wrote to its spool (UTC, ISO 8601): its end, as near as the spool
        can tell when the end itself was not recorded."""
        times = [p.stat().st_mtime for p in [*self._segment_paths(), self.dir / META_NAME]]
        when = max(times, default=time.time())
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(when))

    # -- data ---------------------------------------------------------------------------------
    def append(self, columns: Columns) -> bool:
        """Durably append one batch. False (nothing written) if the disk limit would be passed."""
        return self.append_record({"columns": columns})

    def append_record(self, record: dict[str, Any]) -> bool:
        """Durably append one record (``{"columns": ...}`` or ``{"events": [...]}``); OSError
        (nothing counted, nothing left in the segment) if the disk cannot take all of it."""
        line = encode_record(record)
        count = batch_size(record)
        with self._lock:
            if self.bytes_used + len(line) > self.max_bytes:
                return False
            self._write_pending_meta()
            if self._fd is None or self._segment_bytes >= SEGMENT_MAX_BYTES:
                self._open_segment()
            assert self._fd is not None and self._segment is not None
            try:
                _write_all(self._fd, line, self._segment)
            except OSError:
                self._cut_back()
                raise
            self._segment_bytes += len(line)
            self.bytes_used += len(line)
            self.pending_samples += count
        return True

    def seal(self) -> list[Path]:
        """Close the segment being written and return every segment, oldest first."""
        with self._lock:
            self._close_segment()
            return self._segment_paths()

    def read(self, path: Path) -> list[dict[str, Any]]:
        try:
            return list(decode_records(path.read_bytes()))
        except FileNotFoundError:
            return []

    def replay_start(self, path: Path) -> int:
        """Index of the first record of a segment the server has not taken yet."""
        with self._lock:
            return self._replayed.get(path, (0, 0))[0]

    def acknowledge(self, path: Path, records: int, samples: int) -> None:
        """The server took a segment's records up to ``records`` (exclusive), ``samples`` more
        samples: they are sent, no longer pending, though the segment stays on disk until all
        of it is taken (a replay interrupted part-way resumes after them)."""
        with self._lock:
            acked = self._replayed.get(path, (0, 0))[1]
            self._replayed[path] = (records, acked + samples)
            self.pending_samples -= samples

    def discard(self, path: Path) -> None:
        """Delete a segment whose batches the server acknowledged."""
        with self._lock:
            acked = self._replayed.pop(path, (0, 0))[1]
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return
            path.unlink()
            self.bytes_used -= len(data)
            self.pending_samples -= sum(batch_size(r) for r in decode_records(data)) - acked

    def remove_if_empty(self) -> bool:
        """Delete the run directory if nothing is left to send; always release the lock."""
        segments = self.seal()
        if not segments and self.owned():
            # only the files a spool writes, then the folder if that left it empty: a
            # folder holding anything else is kept
            for path in self.dir.iterdir():
                ours = path.name in (META_NAME, END_NAME, LOCK_NAME) or (
                    path.name.startswith(f".{META_NAME}.") and path.name.endswith(".tmp")
                )
                if ours and not path.is_dir():
                    with contextlib.suppress(OSError):
                        path.unlink()
            with contextlib.suppress(OSError):
                (self.dir / MARKER_NAME).unlink()
                self.dir.rmdir()
        self.release()
        return not segments

    def _segment_paths(self) -> list[Path]:
        if not self.dir.is_dir() or not self._is_inside():
            return []
        return sorted(self.dir.glob("seg-*.jsonl"))

    def _open_segment(self) -> None:
        self._close_segment()
        self._make_dir()
        self._segment_index += 1
        path = self.dir / f"seg-{self._segment_index:06d}.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        self._fd = os.open(path, flags, 0o644)
        self._segment = path
        self._segment_bytes = 0

    def _cut_back(self) -> None:
        """After a failed append: the segment back to its last whole record (a torn line in
        the middle would also hide the record appended after it); a segment left empty, or one
        that cannot be cut, is closed (the next append starts a new one)."""
        assert self._fd is not None and self._segment is not None
        try:
            os.ftruncate(self._fd, self._segment_bytes)
        except OSError:
            self._close_segment()
            return
        if self._segment_bytes == 0:
            segment = self._segment
            self._close_segment()
            with contextlib.suppress(OSError):
                segment.unlink()

    def _close_segment(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self._segment = None
            self._segment_bytes = 0

    def _is_inside(self) -> bool:
        try:
            self._contained()
        except OSError:
            return False
        return True


def spooled_run_ids(root: Path) -> list[str]:
    """Run folders under a spool root that hold a run.json (symlinks and names that are not
    run folders are left alone)."""
    if not Path(root).is_dir():
        return []
    found = []
    for path in Path(root).iterdir():
        if path.is_symlink() or not (path / META_NAME).is_file():
            continue
        try:
            RunSpool.at(Path(root), path.name)
        except ValueError:
            continue
        found.append(path.name)
    return sorted(found)


# -- replay: spooled records back into requests ---------------------------------------------


def replay_requests(
    records: list[dict[str, Any]], start: int, limit: int
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(index of the last record used, "samples" | "events", request payload) for
    records[start:], in order; consecutive sample batches are merged (``merge_records``)."""
    index = start
    while index < len(records):
        events = records[index].get("events")
        if isinstance(events, list):
            if events:
                yield index, "events", {"events": events}
            index += 1
            continue
        end = index
        while end < len(records) and not isinstance(records[end].get("events"), list):
            end += 1
        for last, columns in merge_records(records[:end], index, limit):
            yield last, "samples", {"columns": columns}
        index = end


def merge_records(
    records: list[dict[str, Any]], start: int, limit: int
) -> Iterator[tuple[int, Columns]]:
    """(index of the last record used, merged columns) for records[start:], <= limit samples
    per merge (a single larger record is passed through whole)."""
    merged: Columns | None = None
    count = 0
    last = start - 1
    for index in range(start, len(records)):
        columns = records[index].get("columns")
        size = batch_size(records[index])
        if not isinstance(columns, dict) or size == 0:
            last = index
            continue
        if merged is not None and count + size > limit:
            yield last, merged
            merged, count = None, 0
        if merged is None:
            merged = {name: list(values) for name, values in columns.items()}
        else:
            for name in merged:
                merged[name].extend(columns.get(name) or [None] * size)
        count += size
        last = index
    if merged is not None:
        yield last, merged
