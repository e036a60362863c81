"""A damaged spool (issue 46, item 6), then ``noisescope sync``: the spool fuzzer.

Each case writes two runs through the real client offline (``noisescope.init(mode="offline")``,
one record per flush, about two records per segment), damages one of them one way (a torn
segment, a flipped byte, a duplicated segment, a renamed one, a file manager's copy, wrong field
types in a record whose CRC is valid, a column a value short, a value the server refuses, a
read-only run folder, an unreadable run.json) and syncs the spool root. Held: the server stores
every sample of the spool but the damaged records' (exactly: by seq), sync names each damaged
record or file (with its sample count where it can be known), the other run is delivered whole,
the count sync prints is the count the server stored, its exit code is 1 exactly when something
was left behind, and a second sync stores nothing more.

``tests/client/test_spool_damage.py`` runs it small, syncing in-process against the app;
``run_spool_damage`` runs it bigger, with the ``noisescope sync`` command against a server.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noisescope import Api, NotFoundError, Transport, _spool
from noisescope._spool import check_lines, encode_record

#: Records per segment in the spools written here, about (the fuzzer damages one record among
#: others in its segment).
RECORDS_PER_SEGMENT = 2
#: ``noisescope sync ROOT`` as a function: (exit code, what it printed).
Sync = Callable[[Path], tuple[int, str]]


@dataclass(frozen=True)
class Layout:
    """A run the client spooled: its id, folder, segments (oldest first) and the seqs of each
    segment's records."""

    run_id: str
    folder: Path
    segments: tuple[Path, ...]
    seqs: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def logged(self) -> frozenset[int]:
        return frozenset(s for segment in self.seqs for record in segment for s in record)

    def record(self, segment: int, record: int) -> frozenset[int]:
        """The seqs of one record (both indices from 0)."""
        return frozenset(self.seqs[segment][record])


@dataclass
class Expect:
    """What a damage costs: the seqs it destroys or leaves behind (never stored), the words sync
    must print, whether sync must exit 1 (something not on the server), and a step that undoes
    what is not damage (a read-only folder) before the second sync; ``skip``: why the case could
    not be made here."""

    lost: frozenset[int]
    named: tuple[str, ...]
    left_behind: bool
    undo: Callable[[], None] | None = None
    skip: str | None = None


@dataclass
class DamageResult:
    """One damage kind's figures: samples the damaged run logged, the server stored after sync,
    sync set aside in ``damaged/``, and sync said it did not send (``dropped_counted``: the counts
    in its "not sent" lines); whether every check held, and what did not (or a short note)."""

    name: str
    logged: int
    stored: int
    set_aside: int
    dropped_counted: int
    ok: bool
    note: str
    problems: list[str] = field(default_factory=list)

    def row(self) -> dict[str, str]:
        """Its row in docs/reliability.md."""
        return {
            "damage": self.name, "logged": f"{self.logged:,}", "stored": f"{self.stored:,}",
            "set aside": f"{self.set_aside:,}", "said not sent": f"{self.dropped_counted:,}",
            "held": "yes" if self.ok else "NO", "note": self.note,
        }  # fmt: skip


# -- writing a spool through the client ------------------------------------------------------


def write_spool(root: Path, segments: int, per_record: int, project: str = "damage") -> Layout:
    """One offline run of ``segments * RECORDS_PER_SEGMENT * per_record`` samples written by
    the client, a flush after each ``per_record`` (each flush writes a record; the sender may
    write one part-way, so the layout is read back from disk) and the segment size set after
    the first record so that a segment takes about ``RECORDS_PER_SEGMENT`` records."""
    import noisescope

    run = noisescope.init(
        project=project, task="spool", mode="offline", dir=root, run_id=uuid.uuid4().hex,
        # the sender writes what is buffered when a batch is full (never: twice a record), the
        # interval passed (an hour) or a flush asks (each record's end)
        batch_max=2 * per_record, memory_max=max(10_000, 4 * per_record),
        batch_interval=3600.0, quiet=True,
    )  # fmt: skip
    saved = _spool.SEGMENT_MAX_BYTES
    try:
        for index in range(segments * RECORDS_PER_SEGMENT):
            for i in range(per_record):
                step = 100_000 + index * per_record + i  # as many digits in every record
                run.log_sample(step, 8, 64, 2.5, 1.25, loss=0.5)
            if not run.flush(30):
                raise RuntimeError("the client did not spool a record within 30 s")
            if index == 0:
                [first] = (root / run.id).glob("seg-*.jsonl")
                _spool.SEGMENT_MAX_BYTES = int(first.stat().st_size * (RECORDS_PER_SEGMENT - 0.5))
        status = run.finish()
    finally:
        _spool.SEGMENT_MAX_BYTES = saved
    if status.spooled != segments * RECORDS_PER_SEGMENT * per_record:
        raise RuntimeError(f"the client spooled {status.spooled} samples: {status}")
    folder = root / run.id
    paths = tuple(sorted(folder.glob("seg-*.jsonl")))
    seqs = tuple(
        tuple(tuple(record["columns"]["seq"]) for _, _, record in check_lines(p.read_bytes())[0])
        for p in paths
    )
    # a segment takes records up to 1.5 times the first one's size: two, or more when the
    # sender wrote one part-way
    if len(seqs) < min(segments, 2) or len(seqs[0]) < 2:
        raise RuntimeError(f"unexpected segments: {[len(s) for s in seqs]} records each")
    return Layout(run.id, folder, paths, seqs)


# -- the damages ----------------------------------------------------------------------------


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def _rewrite(path: Path, record: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Record ``record`` of segment ``path`` changed by ``change`` and written back with a
    valid CRC (a record the checksum cannot catch)."""
    lines = _lines(path)
    text = lines[record].rpartition(b"\t")[0]
    value = json.loads(text)
    change(value)
    lines[record] = encode_record(value).rstrip(b"\n")
    path.write_bytes(b"\n".join(lines))


def torn(layout: Layout) -> Expect:
    """The first segment cut in the middle of its last record (a disk or copy cut short)."""
    path = layout.segments[0]
    lines = _lines(path)
    keep = sum(len(line) + 1 for line in lines[:-2]) + len(lines[-2]) // 2
    with path.open("r+b") as f:
        f.truncate(keep)
    # the segment's last record: usually its RECORDS_PER_SEGMENT-th, one more when the sender
    # wrote a batch part-way (a loaded machine)
    lost = layout.record(0, len(layout.seqs[0]) - 1)
    return Expect(lost, (path.name, "incomplete"), True)


def flipped_byte(layout: Layout) -> Expect:
    """One byte of the first record of the first segment changed (a digit, so the JSON still
    parses and sync can count the record's samples)."""
    path = layout.segments[0]
    data = bytearray(path.read_bytes())
    at = data.index(b'"step":[') + len(b'"step":[') + 2  # inside the first step number
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    path.write_bytes(bytes(data))
    lost = layout.record(0, 0)
    return Expect(lost, (path.name, "line 1;", f"{len(lost):,} samples", "checksum"), True)


def duplicated_segment(layout: Layout) -> Expect:
    """The first segment copied under the next segment's name: a segment of the spool's own
    that the server already has; stored once, and not counted twice."""
    copy = layout.folder / f"seg-{len(layout.segments) + 1:06d}.jsonl"
    shutil.copyfile(layout.segments[0], copy)
    again = sum(len(r) for r in layout.seqs[0])
    return Expect(frozenset(), (f"{again:,} already on the server",), False)


def renamed_segment(layout: Layout) -> Expect:
    """The second segment renamed to a name that is not a segment's: not the spool's file, so
    not sent, and named with what it holds."""
    path = layout.segments[1]
    path.rename(path.with_name(f"{path.name}.old"))
    lost = frozenset(s for record in layout.seqs[1] for s in record)
    return Expect(lost, (f"{path.name}.old", f"{len(lost):,} samples"), True)


def file_manager_copy(layout: Layout) -> Expect:
    """``seg-000001 (copy).jsonl`` beside the first segment: not the spool's, its records are
    copies of records delivered; nothing is left behind."""
    path = layout.segments[0]
    shutil.copyfile(path, path.with_name(f"{path.stem} (copy).jsonl"))
    return Expect(frozenset(), (f"{path.stem} (copy).jsonl", "copies"), False)


def wrong_field_types(layout: Layout) -> Expect:
    """The second record of the first segment with ``"seq": 5`` (a number where a list is
    expected) under a valid CRC."""
    path = layout.segments[0]
    _rewrite(path, 1, lambda record: record["columns"].update(seq=5))
    lost = layout.record(0, 1)
    return Expect(lost, (path.name, "line 2;", f"{len(lost):,} samples", "'seq'"), True)


def value_short(layout: Layout) -> Expect:
    """The first record of the last segment with its ``loss`` column a value short (valid CRC):
    merged with the others, it would make the whole request refused."""
    path = layout.segments[-1]
    _rewrite(path, 0, lambda record: record["columns"]["loss"].pop())
    lost = layout.record(len(layout.segments) - 1, 0)
    n = len(lost)
    return Expect(lost, (path.name, "line 1;", f"{n:,} samples", f"{n - 1} values"), True)


def refused_value(layout: Layout) -> Expect:
    """One sample of the first record with ``b_small`` equal to ``b_big`` (valid types, valid
    CRC): the server refuses that row alone, which is set aside; the rest of its record is sent."""
    path = layout.segments[0]
    row = min(3, len(layout.seqs[0][0]) - 1)
    seq = layout.seqs[0][0][row]
    _rewrite(path, 0, lambda record: record["columns"]["b_small"].__setitem__(row, 64.0))
    return Expect(frozenset({seq}), (path.name, "1 sample)", "HTTP 422"), True)


def damaged_run_json(layout: Layout) -> Expect:
    """run.json overwritten with garbage: the run cannot be created, so none of it is sent; it
    is named as failed and stays in the spool, and the other run is delivered."""
    (layout.folder / "run.json").write_bytes(b'{"run_id": "' + layout.run_id.encode())
    return Expect(layout.logged, ("run.json is unreadable",), True)


def read_only_folder(layout: Layout) -> Expect:
    """The run folder made read-only (chmod; as root, which chmod does not stop, ``chattr +i``):
    every record is delivered, and sync says the segments stay because they cannot be deleted."""
    folder = layout.folder
    undo = _make_read_only(folder)
    if undo is None:
        return Expect(frozenset(), (), False, skip="no way to make a folder read-only here")
    return Expect(frozenset(), ("could not be deleted",), False, undo=undo)


def _make_read_only(folder: Path) -> Callable[[], None] | None:
    """Make ``folder`` read-only; the function that undoes it, or None where that fails."""
    mode = folder.stat().st_mode
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(mode)
    try:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    except OSError:
        return None
    probe = folder / ".probe"
    try:
        probe.touch()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES) and done.returncode == 0:
            return lambda: _chattr_off(folder)
    with contextlib.suppress(OSError):
        probe.unlink()
    _chattr_off(folder)
    return None


def _chattr_off(folder: Path) -> None:
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True, check=False)


#: Every damage kind, by name.
DAMAGES: dict[str, Callable[[Layout], Expect]] = {
    "torn segment": torn,
    "flipped byte": flipped_byte,
    "duplicated segment": duplicated_segment,
    "renamed segment": renamed_segment,
    "file-manager copy": file_manager_copy,
    "wrong field types": wrong_field_types,
    "a column a value short": value_short,
    "a value the server refuses": refused_value,
    "unreadable run.json": damaged_run_json,
    "read-only run folder": read_only_folder,
}


# -- one case: write, damage, sync, check ---------------------------------------------------


def stored_seqs(api: Api, run_id: str) -> list[int]:
    """The seqs the server holds for a run, one per stored row (a duplicate would show)."""
    try:
        text = api.samples_csv(run_id)
    except NotFoundError:
        return []
    return [int(row["seq"]) for row in csv.DictReader(io.StringIO(text))]


def _said_counts(output: str) -> tuple[int, int]:
    """(samples set aside in ``damaged/``, samples said not sent) in sync's "not sent" lines."""
    aside = said = 0
    for line in output.splitlines():
        if not line.startswith("not sent "):
            continue
        match = re.search(r"([\d,]+) samples?\b", line)
        n = int(match.group(1).replace(",", "")) if match else 0
        said += n
        aside += n if " set aside in " in line else 0
    return aside, said


def _printed_stored(output: str) -> int | None:
    """The samples sync's last count line says it stored."""
    found = re.findall(r"^[\d,]+ runs?, ([\d,]+) samples? stored", output, re.MULTILINE)
    return int(found[-1].replace(",", "")) if found else None


def run_case(
    name: str, root: Path, sync: Sync, api: Api, *, segments: int = 2, per_record: int = 100
) -> DamageResult:
    """Damage kind ``name`` on a fresh spool under ``root``, beside an undamaged run; sync
    twice; every check of the module's docstring."""
    damaged = write_spool(root, segments, per_record)
    clean = write_spool(root, segments, per_record)
    expect = DAMAGES[name](damaged)
    logged = len(damaged.logged)
    if expect.skip is not None:
        return DamageResult(name, logged, 0, 0, 0, True, f"not run: {expect.skip}")
    problems: list[str] = []
    try:
        code, output = sync(root)
    finally:
        if expect.undo is not None:
            expect.undo()
    stored = stored_seqs(api, damaged.run_id)
    neighbour = stored_seqs(api, clean.run_id)
    if len(set(stored)) != len(stored) or len(set(neighbour)) != len(neighbour):
        problems.append("a sample is stored twice")
    if set(stored) != damaged.logged - expect.lost:
        missing = len(damaged.logged - expect.lost - set(stored))
        extra = len(set(stored) & expect.lost)
        problems.append(f"stored {len(stored)}: {missing} good samples missing, {extra} lost ones")
    if set(neighbour) != clean.logged:
        problems.append(f"the undamaged run: {len(neighbour)} of {len(clean.logged)} stored")
    for words in expect.named:
        if words not in output:
            problems.append(f"sync did not say {words!r}")
    printed = _printed_stored(output)
    if printed != len(stored) + len(neighbour):
        problems.append(f"sync printed {printed} stored, the server holds "
                        f"{len(stored) + len(neighbour)}")  # fmt: skip
    if code != (1 if expect.left_behind else 0):
        problems.append(f"sync exited {code}")
    if "Traceback" in output or "internal error" in output:
        problems.append("sync printed a traceback or an internal error")
    again_code, again = sync(root)
    if _printed_stored(again) != 0 or stored_seqs(api, damaged.run_id) != stored:
        problems.append(f"a second sync stored more: {again.splitlines()[-1:]}")
    aside, said = _said_counts(output)
    note = "; ".join(problems) or _summary(output, code, again_code)
    return DamageResult(name, logged, len(stored), aside, said, not problems, note, problems)


def _summary(output: str, code: int, again_code: int) -> str:
    """What sync said about the damage, shortened: its "not sent" or "note" line, if any."""
    said = [line.split(": ", 1)[-1] for line in output.splitlines()
            if line.startswith(("not sent ", "note ", "failed "))]  # fmt: skip
    text = said[0] if said else "nothing set aside"
    text = re.sub(r"/\S*/(damaged/)", r"\1", text)  # paths differ from run to run
    text = re.sub(r"/\S+/", "", text)
    return f"exit {code}, then {again_code}: {text[:160]}"


def in_process_sync(url: str, transport_for: Callable[[], Transport]) -> Sync:
    """``noisescope sync`` in this process (its printing and exit code, ``_sync.report``) with
    ``transport_for()`` as its transport (an in-process app)."""
    from noisescope._sync import report, sync

    def run(root: Path) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            result = sync(root, url=url, transport=transport_for())
            code = report(result, root)
        return code, out.getvalue()

    return run


def run_spool_damage(
    server_url: str, workdir: Path, *, segments: int = 5, per_record: int = 2000
) -> list[DamageResult]:
    """Every damage kind at a bigger size (``segments`` segments of ``RECORDS_PER_SEGMENT``
    records of ``per_record`` samples per run), synced with the ``noisescope sync`` command to
    the server at ``server_url``; one spool root per kind under ``workdir``."""
    from reliability._infra import sync_spool

    def command(root: Path) -> tuple[int, str]:
        return sync_spool(root, server_url)

    api = Api(server_url)
    try:
        return [
            run_case(name, workdir / re.sub(r"\W+", "-", name), command, api,
                     segments=segments, per_record=per_record) for name in DAMAGES
        ]  # fmt: skip
    finally:
        api.close()
