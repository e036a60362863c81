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

A damaged spool (issue 46): only ``seg-<number>.jsonl`` files are segments, ordered by their
number; any other file in a run folder (a file manager's ``seg-000001 (copy).jsonl``, a renamed
segment) is not the spool's: never read for delivery, never deleted, named by ``foreign`` with
what it holds. A line that fails its CRC, or a record whose shape or value types the wire does
not take (``record_problem``, from ``_wire.SAMPLE_FIELDS``), is never merged into a request: it
is copied to ``<run folder>/damaged/`` (``SetAside``) before its segment is deleted, and said.

The spool's modules, by job: ``_spool_folder`` (a run folder, its holder, run.json and the end),
``_spool_records`` (the record format, its checks, the replay into requests), ``_spool_io`` (the
file primitives, ``_write_some`` among them); this one keeps the segments.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
from pathlib import Path
from typing import Any

from noisescope._spool_folder import (
    DAMAGED_NAME,
    END_BYTES,
    END_NAME,
    LOCK_NAME,
    MARKER_NAME,
    META_NAME,
    SEGMENT_NAME,
    SpoolFolder,
    SpoolPathError,
    _own_name,
    _segment_index,
)
from noisescope._spool_io import _replace_file, _write_all
from noisescope._spool_records import (
    BadLine,
    Columns,
    Foreign,
    SetAside,
    _complete,
    _counts,
    _crc_records,
    _digest,
    batch_size,
    check_lines,
    decode_records,
    encode_record,
    held,
    merge_records,
    record_problem,
    replay_requests,
)

__all__ = [
    "DAMAGED_NAME",
    "END_BYTES",
    "END_NAME",
    "LOCK_NAME",
    "MARKER_NAME",
    "META_NAME",
    "SEGMENT_MAX_BYTES",
    "SEGMENT_NAME",
    "BadLine",
    "Columns",
    "Foreign",
    "RunSpool",
    "SetAside",
    "SpoolPathError",
    "batch_size",
    "check_lines",
    "decode_records",
    "encode_record",
    "held",
    "merge_records",
    "record_problem",
    "replay_requests",
    "spooled_run_ids",
]

SEGMENT_MAX_BYTES = 8 * 1024 * 1024
#: A file that is not the spool's is read, to say what it holds, up to this size.
FOREIGN_READ_MAX = 4 * SEGMENT_MAX_BYTES

logger = logging.getLogger("noisescope")


class RunSpool(SpoolFolder):
    """One run's spool directory: its folder (``SpoolFolder``) and segments. Thread-safe; all
    methods may be called from any thread."""

    def __init__(
        self, root: Path, run_id: str, max_bytes: int = 1 << 30, name: str | None = None
    ) -> None:
        super().__init__(root, run_id, name)
        self.max_bytes = max_bytes
        self._fd: int | None = None
        self._segment: Path | None = None
        self._segment_index = 0
        self._segment_bytes = 0
        self.bytes_used = 0
        self.pending_samples = 0
        # a segment being replayed: (records the server took, samples among them)
        self._replayed: dict[Path, tuple[int, int]] = {}
        self.waited = False
        #: Records ``read`` or a delivery set aside, and why each segment stays on disk (it
        #: could not be deleted, or its unsent records could not be copied out).
        self.set_aside: list[SetAside] = []
        self.kept: dict[str, str] = {}
        self._aside_read: set[Path] = set()
        #: Segments this spool opened and alone appended to (under its lock), from columns the
        #: sender built and checked: their records are read back on their checksums alone.
        self._own_segments: set[Path] = set()
        self._keep: set[Path] = set()
        self._kept: set[Path] = set()
        #: Digests of the lines of segments delivered and discarded (a copy of one is no news).
        self._delivered: set[bytes] = set()
        #: Log what is set aside (a delivery that says it itself turns this off).
        self.warn = True

    @classmethod
    def at(cls, root: Path, folder: str, max_bytes: int = 1 << 30) -> RunSpool:
        """The spool of an existing run folder (``<id>`` or ``<id>.rank<r>``); ValueError if
        the name is not one a spool creates."""
        match = re.fullmatch(r"(.+?)(\.rank[0-9]{1,6})?", folder)
        run_id = match.group(1) if match is not None and match.group(2) else folder
        return cls(root, run_id, max_bytes, name=folder)

    def release(self) -> None:
        with self._lock:
            self._close_segment()
        super().release()

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
                self._segment_index = max(self._segment_index, _segment_index(path))

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
        """Close the segment being written and return every segment still to send, oldest
        first (not one this process discarded but had to keep on disk)."""
        with self._lock:
            self._close_segment()
            return [path for path in self._segment_paths() if path not in self._kept]

    def read(self, path: Path) -> list[dict[str, Any]]:
        """The records of a segment that a request may take, in order, each checked
        (``record_problem``) and with every wire column. The others are copied to the run's
        ``damaged/`` folder (``set_aside``; logged unless ``warn`` is off), once per segment;
        where they cannot be, the segment is kept on disk when discarded."""
        return [record for _, record in self.read_numbered(path)]

    def read_numbered(self, path: Path) -> list[tuple[int, dict[str, Any]]]:
        """``read``, each record with its line number in the segment (from 1)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        good, bad = check_lines(data, checked=path in self._own_segments)
        if bad and path not in self._aside_read:
            self._aside_read.add(path)
            self._put_aside(path, [b.line for b in bad], [b.number for b in bad],
                            _counts(bad), "; ".join(dict.fromkeys(b.why for b in bad)))  # fmt: skip
        return [(number, _complete(record)) for number, _, record in good]

    def set_aside_refused(
        self, path: Path, lines: list[int], columns: Columns, why: str
    ) -> SetAside:
        """Put samples the server refused out of the way (``columns``, from the records at
        ``lines`` of ``path``) as one record in ``damaged/``; the segment is kept if that fails."""
        line = encode_record({"columns": columns}).rstrip(b"\n")
        return self._put_aside(path, [line], lines, (batch_size({"columns": columns}), 0, 0), why)

    def set_aside_events(
        self, path: Path, lines: list[int], events: list[Any], why: str
    ) -> SetAside:
        """Put an events record the server refused out of the way, as ``set_aside_refused``."""
        line = encode_record({"events": events}).rstrip(b"\n")
        return self._put_aside(path, [line], lines, (0, 0, len(events)), why)

    def _put_aside(
        self,
        path: Path,
        lines: list[bytes],
        numbers: list[int],
        counts: tuple[int, int, int],
        why: str,
    ) -> SetAside:
        """Copy ``lines`` of segment ``path`` to ``damaged/`` and say so (``set_aside``)."""
        content = b"".join(line + b"\n" for line in lines)
        copy: Path | None = None
        problem = None
        try:
            copy = self._aside_file(path, content)
        except OSError as exc:
            problem = exc.strerror or str(exc)
            with self._lock:
                self._keep.add(path)
        samples, unknown, events = counts
        aside = SetAside(path.name, tuple(numbers), samples, unknown, events, why, copy, problem)
        with self._lock:
            self.set_aside.append(aside)
        if self.warn:
            logger.warning(
                "noisescope: spooled run %s: not sent: %s", self.dir.name, aside.sentence()
            )
        return aside

    def _aside_file(self, path: Path, content: bytes) -> Path:
        """Where ``content`` from segment ``path`` is kept: ``damaged/<segment>.jsonl``, or the
        first ``damaged/<segment>.<k>.jsonl`` free or already holding it (a rerun writes no
        second copy, and never over a copy with other records)."""
        folder = self._contained() / DAMAGED_NAME
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        if folder.is_symlink() or not folder.is_dir():
            raise OSError(errno.ENOTDIR, f"{folder} is not a folder the spool made")
        for k in range(1000):
            target = folder / (f"{path.stem}.jsonl" if k == 0 else f"{path.stem}.{k}.jsonl")
            try:
                if target.read_bytes() == content:
                    return target
            except FileNotFoundError:
                _replace_file(target, content)
                return target
        raise OSError(errno.EEXIST, f"no free name for {path.name} in {folder}")

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
        """Delete a segment whose batches the server acknowledged (and whose other records
        were set aside). One whose unsent records could not be copied out, or that cannot be
        deleted (a read-only folder), stays on disk, said in ``kept``; this process does not
        send it again."""
        with self._lock:
            acked = self._replayed.pop(path, (0, 0))[1]
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return
            if path in self._keep:
                self.kept[path.name] = "records in it that were not sent could not be copied out"
            else:
                try:
                    path.unlink()
                except OSError as exc:
                    self.kept[path.name] = f"it could not be deleted ({exc.strerror or exc})"
            if path.name in self.kept:
                self._kept.add(path)
            self.bytes_used -= len(data)
            samples = 0
            for line, record in _crc_records(data):
                self._delivered.add(_digest(line))  # or set aside: a copy of it is no news
                samples += batch_size(record)
            self.pending_samples -= samples - acked

    def last_step(self) -> int | None:
        """The last step of the samples in the segments (an earlier session's, for a resumed
        run), or None."""
        last: int | None = None
        for path in self._segment_paths():
            with contextlib.suppress(OSError):
                for record in decode_records(path.read_bytes()):
                    columns = record.get("columns")
                    steps = columns.get("step") if isinstance(columns, dict) else None
                    if not isinstance(steps, list):
                        continue
                    for step in steps:
                        if type(step) is int and (last is None or step > last):
                            last = step
        return last

    def drop_segments(self) -> tuple[int, int]:
        """Delete every segment, sent or not (the run was deleted on the server, which takes
        nothing more of it): the (samples, events) they held that it had not taken."""
        events = 0
        paths = self.seal()
        with self._lock:
            samples = self.pending_samples
        for path in paths:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            start = self.replay_start(path)
            for record in list(decode_records(data))[start:]:
                listed = record.get("events")
                events += len(listed) if isinstance(listed, list) else 0
            self.discard(path)
        with self._lock:
            self.pending_samples = 0
        return samples, events

    def remove_if_empty(self, foreign: list[Foreign] | None = None) -> bool:
        """Delete the run folder if nothing is left to send; always release the lock.

        Only the files a spool writes, run.json first (a delivery waiting in ``claim`` then
        finds the run gone); the folder itself only if that left it empty. A folder that holds
        a file which is not the spool's with records not delivered from its segments keeps its
        run.json, so that sync finds the run and says so (``foreign``: that file list, if the
        caller already made it)."""
        segments = self.seal()
        if not self._segment_paths() and self.owned():
            files = self.foreign() if foreign is None else foreign
            if any(f.new_records for f in files):
                if self.warn:
                    logger.warning(
                        "noisescope: spooled run %s: kept for `noisescope sync`, which says what "
                        "these files hold: %s", self.dir.name, ", ".join(f.name for f in files)
                    )  # fmt: skip
            else:
                self._remove_own_files()
        self.release()
        return not segments

    def foreign(self) -> list[Foreign]:
        """The files in the run folder that are not the spool's own, each with the records it
        holds and how many of those were not delivered from the spool's segments here."""
        if not self.dir.is_dir() or not self._is_inside():
            return []
        found = []
        for path in sorted(self.dir.iterdir()):
            if _own_name(path.name):
                continue
            if path.is_symlink() or not path.is_file():
                found.append(Foreign(path.name, unread="not a file"))
                continue
            try:
                if path.stat().st_size > FOREIGN_READ_MAX:
                    found.append(Foreign(path.name, unread="too large to read"))
                    continue
                good = check_lines(path.read_bytes())[0]
            except OSError as exc:
                found.append(Foreign(path.name, unread=f"unreadable: {exc.strerror or exc}"))
                continue
            with self._lock:
                new = [record for _, line, record in good if _digest(line) not in self._delivered]
            found.append(Foreign(
                path.name, len(good), sum(batch_size(r) for _, _, r in good),
                len(new), sum(batch_size(r) for r in new),
            ))  # fmt: skip
        return found

    def next_segment_name(self) -> str:
        """The name the spool's next segment would take (for a file to be sent as one)."""
        highest = max(map(_segment_index, self._segment_paths()), default=0)
        return f"seg-{max(highest, self._segment_index) + 1:06d}.jsonl"

    def _open_segment(self) -> None:
        self._close_segment()
        self._make_dir()
        self._segment_index += 1
        path = self.dir / f"seg-{self._segment_index:06d}.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        self._fd = os.open(path, flags, 0o644)
        if os.fstat(self._fd).st_size == 0:  # else another process's records are in it too
            self._own_segments.add(path)
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
