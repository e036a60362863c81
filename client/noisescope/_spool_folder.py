"""A run folder of the spool: where it is, who holds it, and its run.json and end files.

Run folders are direct children of the spool root, named by a valid run id
(``_wire.run_id_problem``), or ``<run id>.rank<r>``; every path is resolved and refused if it leads
outside the root (a symlinked run folder). The spool removes only a folder it created (the
marker), and only the files it writes there. ``RunSpool`` (``_spool``) adds the segments.

Who holds a run folder: its live run holds ``lock`` (``acquire``); a delivery (``noisescope
sync``, or a live run delivering what earlier runs left) holds run.json too, then ``lock``
(``claim``). A second sync that finds run.json held waits for the first, and finds the run gone
once that one delivered it (run.json is the first file a removal deletes).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal

from noisescope import _wire
from noisescope._spool_io import _overwrite_file, _replace_file, _same_file

try:  # POSIX only; on other systems concurrent sync of a live run is not guarded.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

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
#: A run folder: the run id, or ``<run id>.rank<r>`` when several ranks spool on one host.
_RANK_SUFFIX = re.compile(r"\.rank[0-9]{1,6}")
#: How long a delivery waits between looks at a run folder another delivery holds.
_CLAIM_POLL_S = 0.05


class SpoolPathError(OSError):
    """A run folder that resolves outside the spool root (refused; nothing is written)."""


Columns = dict[str, list[Any]]


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


class SpoolFolder:
    """One run folder: its paths, its holder (a live run or one delivery), run.json and the
    end. Thread-safe; ``RunSpool`` adds the segments."""

    def __init__(self, root: Path, run_id: str, name: str | None = None) -> None:
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
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        #: run.json's content while it is not on disk yet (a full disk when the run began).
        self._meta_unwritten: bytes | None = None
        #: Why run.json is not on disk yet (then nothing of the run is in the spool), if it is not.
        self.meta_problem: str | None = None
        #: run.json, held by a delivery (``claim``).
        self._meta_fd: int | None = None
        #: Whether ``claim`` waited for another delivery of this folder.
        self.waited = False

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
        """Account for what the folder holds once it is taken (``RunSpool``: its segments)."""

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

    def _segment_paths(self) -> list[Path]:
        """The spool's own segments, by their number (other files are not segments)."""
        if not self.dir.is_dir() or not self._is_inside():
            return []
        paths = [p for p in self.dir.glob("seg-*.jsonl") if SEGMENT_NAME.fullmatch(p.name)]
        return sorted(paths, key=_segment_index)

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

    def _is_inside(self) -> bool:
        try:
            self._contained()
        except OSError:
            return False
        return True
