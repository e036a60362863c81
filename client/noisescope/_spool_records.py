"""What the spool's files hold: the record format (one JSON object and its CRC32 per line), the
checks a record passes before a request may take it, the words for what was set aside or found
beside the spool's own files, and the replay of records into requests (merged, in order)."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noisescope import _json, _wire
from noisescope._format import plural

Columns = dict[str, list[Any]]


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


def _counts(bad: list[BadLine]) -> tuple[int, int, int]:
    """(samples, records of unknown size, events) in damaged lines."""
    samples = sum(b.samples or 0 for b in bad)
    return samples, sum(b.samples is None for b in bad), sum(b.events for b in bad)


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
