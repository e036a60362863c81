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

Who holds a run folder: its live run holds ``lock`` (``acquire``); a delivery (``noisescope
sync``, or a live run delivering what earlier runs left) holds run.json too, then ``lock``
(``claim``). A second sync that finds run.json held waits for the first, and finds the run gone
once that one delivered it (run.json is the first file a removal deletes).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from noisescope import _json, _wire
from noisescope._format import plural

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
#: The subfolder of a run folder where records that cannot be sent are copied (``SetAside``).
DAMAGED_NAME = "damaged"
#: A segment: the spool writes ``seg-000001.jsonl``, ``seg-000002.jsonl``, ... (any other name
#: in a run folder is not its own, whatever it holds).
SEGMENT_NAME = re.compile(r"seg-([0-9]{6,12})\.jsonl")
#: A file that is not the spool's is read, to say what it holds, up to this size.
FOREIGN_READ_MAX = 4 * SEGMENT_MAX_BYTES
#: A run folder: the run id, or ``<run id>.rank<r>`` when several ranks spool on one host.
_RANK_SUFFIX = re.compile(r"\.rank[0-9]{1,6}")
#: How long a delivery waits between looks at a run folder another delivery holds.
_CLAIM_POLL_S = 0.05

logger = logging.getLogger("noisescope")


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
    for _, record in _crc_records(data):
        yield record


def _crc_records(data: bytes) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(line, record) for each line of ``data`` whose CRC matches and holds a JSON object."""
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
            yield line, record


def batch_size(record: Mapping[str, Any]) -> int:
    """The samples in a record; 0 for events, and for a record whose ``seq`` is not a list."""
    columns = record.get("columns")
    seq = columns.get("seq") if isinstance(columns, dict) else None
    return len(seq) if isinstance(seq, list) else 0


# -- checking records: what a request may merge -----------------------------------------------

_WIRE_FIELDS = tuple(f for f in _wire.SAMPLE_FIELDS if f.wire)
#: The Python types of the JSON values each wire column takes (bool is not a number on the wire).
_COLUMN_TYPES: dict[str, frozenset[type]] = {
    f.name: frozenset(
        ({int} if f.type is int else {int, float} if f.type is float else {str})
        | ({type(None)} if f.nullable else set())
    )
    for f in _WIRE_FIELDS
}
#: What each wire column takes, in words.
_COLUMN_TAKES = {
    f.name: {int: "integers", float: "numbers", str: "strings"}[f.type]
    + (" or null" if f.nullable else "")
    for f in _WIRE_FIELDS
}
#: The value an absent optional column means (null; ``""`` for ``series``).
_COLUMN_DEFAULTS = {f.name: f.default for f in _WIRE_FIELDS if not f.required}
_JSON_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}  # fmt: skip


def _kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def record_problem(record: Mapping[str, Any]) -> str | None:
    """Why a spooled record cannot go into a request as it is, or None: its shape and value
    types by ``_wire.SAMPLE_FIELDS`` (the row rules are the server's, which names refused rows).
    Checked before records are merged: a column a value short would make the whole merged
    request refused, or shift the values of the records after it."""
    if "events" in record:
        events = record["events"]
        if not isinstance(events, list):
            return f"its events are {_kind(events)}, not a list"
        if not all(isinstance(event, dict) for event in events):
            return "an event is not an object"
        return None
    columns = record.get("columns")
    if not isinstance(columns, dict):
        return "it holds neither sample columns nor events"
    unknown = sorted(str(name) for name in columns if name not in _COLUMN_TYPES)
    if unknown:
        return f"unknown column {unknown[0]!r}"
    missing = [name for name in _wire.REQUIRED_COLUMNS if name not in columns]
    if missing:
        return f"no {missing[0]!r} column"
    for name, values in columns.items():
        if not isinstance(values, list):
            return f"column {name!r} is {_kind(values)}, not a list"
    count = len(columns["seq"])
    for name, values in columns.items():
        if len(values) != count:
            return f"column {name!r} has {len(values)} values where 'seq' has {count}"
    for name, values in columns.items():
        allowed = _COLUMN_TYPES[name]
        if not set(map(type, values)) <= allowed:
            value = next(v for v in values if type(v) not in allowed)
            shown = json.dumps(value, default=repr)[:40]
            return f"column {name!r} holds {shown}; it takes {_COLUMN_TAKES[name]}"
    return None


def _complete(record: dict[str, Any]) -> dict[str, Any]:
    """A checked record with every wire column (an absent optional one as its default), so that
    records merge column by column."""
    columns = record.get("columns")
    if not isinstance(columns, dict) or len(columns) == len(_COLUMN_TYPES):
        return record
    count = len(columns["seq"])
    full = {
        name: columns[name] if name in columns else [_COLUMN_DEFAULTS[name]] * count
        for name in _COLUMN_TYPES
    }
    return {**record, "columns": full}


@dataclass(frozen=True)
class BadLine:
    """A line of a spool file that cannot be sent: its number (from 1), bytes, why, and the
    samples or events it holds where its JSON still tells (``samples`` None: unknown)."""

    number: int
    line: bytes
    why: str
    samples: int | None
    events: int = 0


def _contents(text: bytes) -> tuple[int | None, int]:
    """(samples, events) a damaged line's JSON still shows; samples None when it does not."""
    try:
        value = _json.loads(text)
    except ValueError:
        return None, 0
    if not isinstance(value, dict):
        return None, 0
    if isinstance(value.get("events"), list):
        return 0, len(value["events"])
    columns = value.get("columns")
    if not isinstance(columns, dict):
        return None, 0
    seq = columns.get("seq")
    if isinstance(seq, list):
        return len(seq), 0
    # a seq that is not a list: the other columns tell, if they agree
    lengths = {len(values) for values in columns.values() if isinstance(values, list)}
    return (lengths.pop(), 0) if len(lengths) == 1 else (None, 0)


def check_lines(
    data: bytes, checked: bool = False
) -> tuple[list[tuple[int, bytes, dict[str, Any]]], list[BadLine]]:
    """A spool file's lines: (number from 1, line, record) for each one a request may take, in
    order, and the others, each with why (a torn last line, a changed byte, a record the wire
    does not take). ``checked``: the records were checked when they were written (a segment
    this process wrote from the sender's columns), so only their checksums are."""
    good: list[tuple[int, bytes, dict[str, Any]]] = []
    bad: list[BadLine] = []
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        text, sep, crc = line.rpartition(b"\t")
        why: str | None = None
        record: Any = None
        if not sep or len(crc) != 8 or not all(c in b"0123456789abcdef" for c in crc):
            why = "it has no checksum"
        elif int(crc, 16) != zlib.crc32(text):
            why = "its checksum does not match (a byte changed on disk)"
        if why is not None and number == len(lines):
            why = "its last line is incomplete (the writer stopped part-way)"
        if why is None:
            try:
                record = _json.loads(text)
            except ValueError:
                why = "its JSON does not parse"
        if why is None and not isinstance(record, dict):
            why = f"it is {_kind(record)}, not a record"
        if why is None and not checked:
            why = record_problem(record)
        if why is None:
            good.append((number, line, record))
            continue
        samples, events = _contents(text if sep else line)
        bad.append(BadLine(number, line, why, samples, events))
    return good, bad


def _digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=16).digest()


def held(samples: int, unknown: int, events: int) -> str:
    """What set-aside records held: "500 samples", "3 events", "an unknown number of samples",
    "500 samples and 1 record of unknown size" (``unknown``: records whose size is not known)."""
    parts = []
    if samples or not (unknown or events):
        parts.append(plural(samples, "sample"))
    if events:
        parts.append(plural(events, "event"))
    if unknown:
        parts.append(
            f"{plural(unknown, 'record')} of unknown size" if parts
            else "an unknown number of samples"
        )  # fmt: skip
    return " and ".join(parts)


@dataclass(frozen=True)
class SetAside:
    """Records of one segment that were not sent, copied out of the way: ``copy`` (under the
    run's ``damaged/``), or None where that failed (``problem``) and the segment stays."""

    source: str
    lines: tuple[int, ...]
    samples: int
    #: Records whose samples could not be counted (their JSON is damaged too).
    unknown: int
    events: int
    why: str
    copy: Path | None
    problem: str | None = None

    @property
    def records(self) -> int:
        return len(self.lines)

    def held(self) -> str:
        """What the records held: "500 samples", "3 events", "an unknown number of samples"."""
        return held(self.samples, self.unknown, self.events)

    def sentence(self) -> str:
        where = (
            f"set aside in {self.copy}"
            if self.copy is not None
            else f"left in {self.source} (they could not be copied out: {self.problem})"
        )
        shown = ", ".join(map(str, self.lines[:10])) + (", ..." if len(self.lines) > 10 else "")
        lines = f"line{'s' if self.records > 1 else ''} {shown}"
        return (
            f"{plural(self.records, 'record')} of {self.source} ({lines}; {self.held()}), "
            f"{where}: {self.why}"
        )


@dataclass(frozen=True)
class Foreign:
    """A file in a run folder that is not the spool's own, and the records it holds: how many,
    and how many of them are not copies of records this spool delivered (``new_*``)."""

    name: str
    records: int = 0
    samples: int = 0
    new_records: int = 0
    new_samples: int = 0
    #: Why its records were not counted (a folder, a link, too large, unreadable), if so.
    unread: str | None = None

    def sentence(self, next_segment: str) -> str:
        head = f"{self.name} is not a file of the spool; left in place"
        if self.unread is not None:
            return f"{head} ({self.unread})"
        if not self.records:
            return f"{head} (it holds no spool records)"
        if not self.new_records:
            return (
                f"{head}: its {plural(self.records, 'record')} are copies of records "
                "delivered from the spool's segments"
            )
        return (
            f"{self.name}, not a file of the spool, is left in place: "
            f"{plural(self.new_records, 'record')} ({plural(self.new_samples, 'sample')}) in "
            f"it are not in the spool's segments; to send them, rename it {next_segment} and "
            "run sync again"
        )


def _own_name(name: str) -> bool:
    """Whether a name in a run folder is one the spool writes."""
    if name in (META_NAME, END_NAME, LOCK_NAME, MARKER_NAME, DAMAGED_NAME):
        return True
    if name.startswith(f".{META_NAME}.") and name.endswith(".tmp"):
        return True
    return SEGMENT_NAME.fullmatch(name) is not None


def _segment_index(path: Path) -> int:
    match = SEGMENT_NAME.fullmatch(path.name)
    return int(match.group(1)) if match is not None else 0


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
        #: run.json, held by a delivery (``claim``).
        self._meta_fd: int | None = None
        #: Whether ``claim`` waited for another delivery of this folder.
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
        self._scanned()
        return True

    def claim(self, wait: bool) -> Literal["taken", "live", "busy", "gone"]:
        """Take an existing run folder for a delivery, creating nothing but its lock file (as
        ``acquire``): "taken", or why not: "live" (its live process holds it), "busy" (another
        delivery holds it; ``wait`` waits for that one to end instead), "gone" (no run.json:
        delivered and removed meanwhile, or never there). ``waited`` says whether it waited."""
        meta = self.dir / META_NAME
        while True:
            if not self._is_inside():
                return "gone"
            try:
                meta_fd = os.open(meta, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                return "gone"
            if fcntl is not None:
                try:
                    fcntl.flock(meta_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(meta_fd)
                    if not wait:
                        return "busy"
                    self.waited = True
                    time.sleep(_CLAIM_POLL_S)
                    continue
                if not _same_file(meta_fd, meta):  # replaced or removed while we waited
                    os.close(meta_fd)
                    continue
            try:
                lock_fd = self._open_lock()
            except OSError:
                os.close(meta_fd)
                raise
            if lock_fd is not None and fcntl is not None:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(lock_fd)
                    os.close(meta_fd)
                    return "live"
            self._meta_fd, self._lock_fd = meta_fd, lock_fd
            self._scanned()
            return "taken"

    def _open_lock(self) -> int | None:
        """The lock file, opened (made if missing; read-only where it cannot be written: a lock
        needs no write); None in a folder that cannot take one, where no live process can hold
        one either."""
        path = self.dir / LOCK_NAME
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None

    def release(self) -> None:
        with self._lock:
            self._close_segment()
            for fd in (self._lock_fd, self._meta_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._lock_fd = self._meta_fd = None

    def _scanned(self) -> None:
        """``_scan``, the lock given back if it fails (an unreadable segment)."""
        try:
            self._scan()
        except BaseException:
            self.release()
            raise

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

    def has_meta_file(self) -> bool:
        """Whether the run folder, inside the root, holds a run.json (readable or not)."""
        return self._is_inside() and (self.dir / META_NAME).is_file()

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

    def end_damaged(self) -> bool:
        """Whether the end file holds something that is not a final status (not the blank of a
        running run): a damaged end."""
        if self.read_end() is not None or not self._is_inside():
            return False
        try:
            return bool((self.dir / END_NAME).read_bytes().strip())
        except OSError:
            return False

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

    def _remove_own_files(self) -> None:
        order = [META_NAME, END_NAME]
        tmp = [p.name for p in self.dir.iterdir() if p.name.startswith(f".{META_NAME}.")]
        for name in [*order, *tmp, LOCK_NAME]:
            path = self.dir / name
            if _own_name(name) and not path.is_dir():
                with contextlib.suppress(OSError):
                    path.unlink()
        with contextlib.suppress(OSError):
            if {p.name for p in self.dir.iterdir()} <= {MARKER_NAME}:
                (self.dir / MARKER_NAME).unlink()
                self.dir.rmdir()

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

    def _segment_paths(self) -> list[Path]:
        """The spool's own segments, by their number (other files are not segments)."""
        if not self.dir.is_dir() or not self._is_inside():
            return []
        paths = [p for p in self.dir.glob("seg-*.jsonl") if SEGMENT_NAME.fullmatch(p.name)]
        return sorted(paths, key=_segment_index)

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

    def _is_inside(self) -> bool:
        try:
            self._contained()
        except OSError:
            return False
        return True


def _counts(bad: list[BadLine]) -> tuple[int, int, int]:
    """(samples, records of unknown size, events) in damaged lines."""
    samples = sum(b.samples or 0 for b in bad)
    return samples, sum(b.samples is None for b in bad), sum(b.events for b in bad)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except OSError:
        return False


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
    per merge (a single larger record is passed through whole). Only records with the same
    columns, each as long as its ``seq``, are merged (``read`` makes them so): a record that
    is not is passed alone, where it cannot shift the values of the others."""
    merged: Columns | None = None
    count = 0
    last = start - 1
    for index in range(start, len(records)):
        columns = records[index].get("columns")
        size = batch_size(records[index])
        if not isinstance(columns, dict) or size == 0:
            last = index
            continue
        alone = any(not isinstance(v, list) or len(v) != size for v in columns.values())
        if merged is not None and (
            count + size > limit or alone or merged.keys() != columns.keys()
        ):
            yield last, merged
            merged, count = None, 0
        if alone:
            yield index, columns
            last = index
            continue
        if merged is None:
            merged = {name: list(values) for name, values in columns.items()}
        else:
            for name in merged:
                merged[name].extend(columns[name])
        count += size
        last = index
    if merged is not None:
        yield last, merged
