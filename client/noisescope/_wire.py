"""The wire format shared by the client and the server: one definition, two users.

Samples travel column-wise (one JSON array per field): several times cheaper to encode, parse
and validate than one object per sample, which is what keeps ingest near the database's own
insert rate.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict
from urllib.parse import quote

API_PREFIX: Final = "/api/v1"

UNITS: Final = ("examples", "tokens")

#: Event kinds with a meaning of their own (any other kind is a free-form mark on the charts).
#: ``eval``: an evaluation, payload ``{"loss": float}`` (``Run.log(eval_loss=...)``); a sweep's
#: critical batch size is crossed on it when the task's runs have it.
EVAL_EVENT_KIND: Final = "eval"
#: ``notice``: why a run measures nothing, payload ``{"message": str}`` (shown on its page).
NOTICE_EVENT_KIND: Final = "notice"
#: ``branch``: a branch run's outcome (``noisescope.branch``), payload ``{"loss": float | null,
#: "diverged": bool}`` (null loss when it diverged); the server's branch reader reads it.
BRANCH_EVENT_KIND: Final = "branch"
#: ``batch_size``: a batch-size change (``noisescope.schedule``), payload its ``BatchDecision``;
#: the charts mark it, and the sweep analysis reads the batch in use from it.
BATCH_SIZE_EVENT_KIND: Final = "batch_size"
#: Every event kind with a meaning of its own.
EVENT_KINDS: Final = (BATCH_SIZE_EVENT_KIND, EVAL_EVENT_KIND, NOTICE_EVENT_KIND, BRANCH_EVENT_KIND)
RUN_STATUSES: Final = ("running", "finished", "failed", "crashed")


class RunBody(TypedDict, total=False):
    """The body of ``PUT /api/v1/runs/{run_id}`` (the server's ``RunPut`` has these fields and
    is checked against them at import): the client builds it with ``run_body``."""

    project: str
    task: str
    name: str
    config: dict[str, Any]
    tags: list[str]
    batch_size: float | None
    units: str
    status: str
    started_at: str
    #: A branch run (``noisescope.branch``): the run it branched from and the parent's step.
    parent_run_id: str
    branch_step: int


RUN_BODY_FIELDS: Final = tuple(RunBody.__annotations__)


def run_body(
    *,
    project: str,
    task: str,
    name: str,
    config: dict[str, Any],
    tags: list[str],
    batch_size: float | None,
    units: str,
    started_at: str,
    parent_run_id: str | None = None,
    branch_step: int | None = None,
) -> RunBody:
    """A new run's body (status ``running``); only a branch carries ``parent_run_id`` and
    ``branch_step``, so a server without them still takes ordinary runs."""
    body: RunBody = {
        "project": project,
        "task": task,
        "name": name,
        "config": config,
        "tags": tags,
        "batch_size": batch_size,
        "units": units,
        "status": "running",
        "started_at": started_at,
    }
    if parent_run_id is not None and branch_step is not None:
        body["parent_run_id"] = parent_run_id
        body["branch_step"] = branch_step
    return body


#: Limits the server enforces and the client respects when batching.
MAX_SAMPLES_PER_REQUEST: Final = 50_000
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
MAX_NAME_LENGTH: Final = 200
#: The most runs one run list answers (``GET /runs``'s largest ``limit``): the newest this many.
MAX_RUNS_LISTED: Final = 10_000
#: The deepest a run config or an event payload may nest (``{}`` is 1, ``{"a": {}}`` is 2).
#: The server refuses deeper values at write and clips stored ones at read: its JSON encoder
#: stops at 254 levels, and an answer wraps each value in a few more.
MAX_JSON_DEPTH: Final = 64
#: The largest a run config or an event payload may be, as compact JSON (bytes): every run
#: list answer carries each run's config, so one huge config would weigh on every reader.
MAX_JSON_BYTES: Final = 256 * 1024
#: The largest magnitude of a value the server sums (loss, lr, and each sample's |G|^2 and
#: tr(Sigma) estimates), 2^960 (about 9.7e288): the sum of 2^63 of them (a run's most samples)
#: is still a float.
MAX_SUMMED: Final = 2.0**960
#: Unix seconds of 0001-01-01T00:00:00 and 9999-12-31T23:59:59 UTC: the times the server stores
#: (a sample's or an event's ``time`` lies between; the difference of two is a float).
TIME_RANGE: Final = (-62_135_596_800.0, 253_402_300_799.0)


# --- the sample schema -------------------------------------------------------------------------

#: How a ``sample_block`` column sums a field over a block's samples: ``count`` of non-null
#: values, ``sum`` of them (null when there are none), ``min``, ``max``. Each is exact and
#: merges by adding (counts, sums) or widening (extremes), so any union of blocks is exact.
Aggregate = Literal["count", "sum", "min", "max"]


@dataclass(frozen=True)
class SampleField:
    """One field of a sample: THE definition every form of the sample schema (the wire
    columns, the client's ``Sample``, validation, the stored table and its block sums, the
    OpenAPI schema) is derived from or checked against (DEVELOPERS.md, adding a sample field).
    """

    name: str
    type: type[int] | type[float] | type[str]
    #: Its description in the OpenAPI schema of the samples body.
    doc: str
    #: A samples body must carry the column.
    required: bool = False
    #: May be null (an absent column is all null); else an absent column takes ``default``.
    nullable: bool = False
    #: The values the server accepts (it sums or subtracts them: they must stay floats); the
    #: client sends a value outside as null. ``range_why`` is the reason, in the 422's words.
    range: tuple[float, float] | None = None
    range_why: str = ""
    #: On the wire; False: a function of the wire fields (``estimators``), computed by the
    #: server where it is needed (its validation at ingest, its block sums, every read of a
    #: sample) and never stored per sample: only its ``blocks`` aggregates are.
    wire: bool = True
    #: An argument of ``log_sample`` (positional when required, else keyword with ``default``);
    #: False: the client fills it in (``seq``, ``time``).
    logged: bool = True
    default: object = None
    #: The ``sample_block`` columns summing this field, in table order, and how each does.
    blocks: tuple[tuple[str, Aggregate], ...] = ()


#: Every field of a stored sample, in storage order (``run_id`` comes first in the table).
SAMPLE_FIELDS: Final = (
    # a sample's n in its block is the count of its seq (never null)
    SampleField(
        "seq", int, "unique per run", required=True, logged=False, blocks=(("n", "count"),)
    ),
    SampleField(
        "step",
        int,
        "optimizer step",
        required=True,
        blocks=(("step_min", "min"), ("step_max", "max")),
    ),
    SampleField(
        "examples",
        float,
        "examples (or tokens) seen so far",
        nullable=True,
        range=(0.0, MAX_SUMMED),
        range_why="examples (tokens) seen, counted from 0, at most noisescope._wire.MAX_SUMMED",
        blocks=(("examples_min", "min"), ("examples_max", "max")),
    ),
    SampleField("b_small", float, "small batch size, > 0", required=True),
    SampleField(
        "b_big", float, "big batch size, > b_small", required=True, blocks=(("b_big_max", "max"),)
    ),
    SampleField("g_small_sq", float, "|G_small|^2, >= 0", required=True),
    SampleField("g_big_sq", float, "|G_big|^2, >= 0", required=True),
    SampleField(
        "g_sq_est",
        float,
        "the sample's unbiased |G|^2 estimate (noisescope.estimators)",
        wire=False,
        logged=False,
        blocks=(("sum_g_sq", "sum"),),
    ),
    SampleField(
        "trace_sigma_est",
        float,
        "the sample's unbiased tr(Sigma) estimate (noisescope.estimators)",
        wire=False,
        logged=False,
        blocks=(("sum_trace_sigma", "sum"),),
    ),
    SampleField(
        "loss",
        float,
        "training loss",
        nullable=True,
        range=(-MAX_SUMMED, MAX_SUMMED),
        range_why="the server sums it: at most noisescope._wire.MAX_SUMMED in magnitude",
        blocks=(("n_loss", "count"), ("sum_loss", "sum")),
    ),
    SampleField(
        "lr",
        float,
        "learning rate",
        nullable=True,
        range=(-MAX_SUMMED, MAX_SUMMED),
        range_why="the server sums it: at most noisescope._wire.MAX_SUMMED in magnitude",
        blocks=(("n_lr", "count"), ("sum_lr", "sum")),
    ),
    SampleField(
        "time",
        float,
        "Unix time of the step",
        nullable=True,
        range=TIME_RANGE,
        range_why="Unix seconds from 0001-01-01 to 9999-12-31 UTC, noisescope._wire.TIME_RANGE",
        logged=False,
        blocks=(("time_min", "min"), ("time_max", "max")),
    ),
    SampleField("series", str, '"" for the whole model, else a layer/group name', default=""),
)
FIELDS_BY_NAME: Final = {f.name: f for f in SAMPLE_FIELDS}

#: Per-sample columns on the wire, in storage order. ``examples``, ``loss``, ``lr`` and ``time``
#: may hold nulls.
SAMPLE_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS if f.wire)
#: A sample's stored columns after ``run_id``: the wire columns (``series`` stored as its
#: number in the run's series table, ``models.SERIES_COLUMN``).
STORED_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS if f.wire)
#: The columns derived from the stored ones where a sample is read (the estimates).
DERIVED_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS if not f.wire)
#: Every column a sample reads as, in table order: stored and derived (the CSV export's).
READ_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS)
REQUIRED_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS if f.wire and f.required)
NULLABLE_COLUMNS: Final = tuple(f.name for f in SAMPLE_FIELDS if f.wire and f.nullable)
#: The range of each optional sample column the server reads arithmetic from: ``loss`` and
#: ``lr`` are summed, ``examples`` counted from 0 and ``time`` a Unix time (the server refuses
#: a value outside with the request; the client sends it as null, as a non-finite one).
SAMPLE_RANGES: Final = {f.name: f.range for f in SAMPLE_FIELDS if f.range is not None}
#: ``log_sample``'s arguments: the positional ones in order, then the keyword ones.
LOGGED_POSITIONAL: Final = tuple(f.name for f in SAMPLE_FIELDS if f.logged and f.required)
LOGGED_KEYWORD: Final = tuple(f.name for f in SAMPLE_FIELDS if f.logged and not f.required)
#: The columns of a ``sample_block`` row after ``run_id``: its key, then each field's sums as
#: ``(column, aggregate, field)`` in table order. The series is its number in the run (the
#: server's ``series`` table), as in ``sample``.
BLOCK_KEY: Final = ("series_id", "block")
BLOCK_AGGREGATES: Final = tuple(
    (column, how, f.name) for f in SAMPLE_FIELDS for column, how in f.blocks
)
BLOCK_COLUMNS: Final = (*BLOCK_KEY, *(column for column, _, _ in BLOCK_AGGREGATES))


def _table_problems(fields: tuple[SampleField, ...]) -> list[str]:
    """What the readers of the table cannot take (validation and the block sums handle these
    kinds of field and no others): each a sentence, none for a good table."""
    problems = []
    for f in fields:
        if f.type is int and not (f.required and not f.nullable and f.range is None):
            problems.append(f"{f.name}: an int field is required, not nullable and has no range")
        if f.type is str and f.name != "series":
            problems.append(f"{f.name}: series is the one str field")
        if f.range is not None and not (f.type is float and f.range_why):
            problems.append(f"{f.name}: a range is for a float field and says why (range_why)")
        if f.required and f.nullable:
            problems.append(f"{f.name}: a required field cannot be nullable")
        if not f.wire and (f.required or f.nullable or f.logged):
            problems.append(f"{f.name}: a server-computed field is not sent, logged or null")
        if f.logged and not f.wire:
            problems.append(f"{f.name}: a logged field travels on the wire")
        if not f.required and not f.nullable and f.wire and f.default is None:
            problems.append(f"{f.name}: an optional non-null field needs a default")
    return problems


assert not _table_problems(SAMPLE_FIELDS), _table_problems(SAMPLE_FIELDS)


#: A run id: 1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter, digit or ``_``.
#: Ids name spool folders and URL path segments, so ``.``, ``..`` and hidden names are refused.
RUN_ID_PATTERN: Final = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_RUN_ID_RE: Final = re.compile(RUN_ID_PATTERN)


def finite_number(value: Any) -> float | None:
    """A finite number read from a JSON payload or config, else None (booleans, text, NaN and
    infinities are not numbers here): how every reader takes an event's or a config's value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def units_problem(units: object) -> str | None:
    """Why ``units`` is not what a run's sizes can count (``UNITS``), or None when it is."""
    if units in UNITS:
        return None
    return f"units must be {' or '.join(repr(u) for u in UNITS)}, got {units!r}"


def run_ids_matching(given: str, run_ids: Iterable[str]) -> list[str]:
    """The run ids ``given`` names among ``run_ids``: itself when it is one, else each id it
    begins (a prefix, as the pages and the client's lines show an id: its first 8
    characters). One answer is the run; none or several, no run (the CLI says which)."""
    ids = list(run_ids)
    if given in ids:
        return [given]
    return [r for r in ids if given and r.startswith(given)]


def run_id_problem(run_id: object) -> str | None:
    """Why ``run_id`` is not a valid run id, or None when it is (client and server both ask)."""
    if isinstance(run_id, str) and _RUN_ID_RE.fullmatch(run_id):
        return None
    shown = repr(run_id[:80]) if isinstance(run_id, str) else type(run_id).__name__
    return (
        f"run id {shown} is not valid: use 1-64 characters from A-Z a-z 0-9 _ . -, starting "
        "with a letter, digit or _ (the client generates a uuid4 hex)"
    )


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0), counted up to ``limit + 1`` at most; iterative,
    so a value nested thousands deep costs no recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


#: The most tags a run may carry.
MAX_TAGS: Final = 100


def _name_problem(field: str, value: object, blank_ok: bool) -> str | None:
    if not isinstance(value, str):
        return f"{field} must be a string, got {type(value).__name__}"
    if not blank_ok and not value.strip():
        return f"{field} must not be blank"
    if len(value) > MAX_NAME_LENGTH:
        return f"{field} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
    if "\x00" in value:
        return f"{field} must not contain NUL (U+0000) characters"
    return None


def run_fields_problem(
    *, project: object, task: object, name: object, config: object, tags: object
) -> str | None:
    """Why the server would refuse a run with these fields, saying what to change; None when
    it takes them. ``init`` asks before any sample is logged, so a run the server would refuse
    never fills a spool that ``sync`` could not deliver either."""
    for field, value, blank_ok in (
        ("project", project, False),
        ("task", task, False),
        ("name", name, True),
    ):
        problem = _name_problem(field, value, blank_ok)
        if problem is not None:
            return problem
    if not isinstance(tags, list):
        return f"tags must be a list of strings, got {type(tags).__name__}"
    if len(tags) > MAX_TAGS:
        return f"{len(tags)} tags; the limit is {MAX_TAGS}"
    for tag in tags:
        problem = _name_problem("a tag", tag, True)
        if problem is not None:
            return f"{problem} ({str(tag)[:40]!r})"
    return _json_object_problem("config", config)


def _json_object_problem(field: str, value: object) -> str | None:
    """Why the server would refuse ``value`` as a run's config or an event's payload."""
    if not isinstance(value, dict):
        return f"{field} must be a dict, got {type(value).__name__}"
    if json_depth(value) > MAX_JSON_DEPTH:
        return f"{field} nests more than {MAX_JSON_DEPTH} levels deep; flatten it"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    size = len(text.encode())
    if size > MAX_JSON_BYTES:
        return (
            f"{field} is {size} bytes as JSON; the limit is {MAX_JSON_BYTES} bytes: keep "
            "hyperparameters there, store large objects elsewhere"
        )
    return None


#: The longest event kind.
MAX_EVENT_KIND_LENGTH: Final = 64
#: The most events in one request.
MAX_EVENTS_PER_REQUEST: Final = 10_000


def event_problem(step: object, kind: object, payload: object) -> str | None:
    """Why the server would refuse an event (``Run.log_event``), or None: checked when it is
    logged, so that one bad event never costs the others of its request."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        return f"an event's step must be an integer in [0, 2^63-1], got {step!r:.40}"
    if not isinstance(kind, str) or not 1 <= len(kind) <= MAX_EVENT_KIND_LENGTH:
        return f"an event's kind must be 1-{MAX_EVENT_KIND_LENGTH} characters, got {kind!r:.80}"
    if "\x00" in kind:
        return "an event's kind must not contain NUL (U+0000) characters"
    return _json_object_problem("an event's payload", payload)


def runs_path(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}"


def samples_path(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}/samples"


def events_path(run_id: str) -> str:
    return f"{API_PREFIX}/runs/{run_id}/events"


def heartbeat_path(run_id: str) -> str:
    """``POST`` here (empty body, 204) says the run's process is alive while it sends nothing
    else; a running run silent for longer than the server's ``crash_after`` reads as crashed."""
    return f"{API_PREFIX}/runs/{run_id}/heartbeat"


#: How often the client's sender proves the run alive when it has nothing else to send (seconds).
HEARTBEAT_INTERVAL: Final = 30.0
#: The server's default for ``crash_after``: a running run silent this long reads as crashed.
CRASH_AFTER: Final = 120.0


def run_page_url(dashboard_url: str, run_id: str) -> str:
    """The link to a run's page on the dashboard at ``dashboard_url`` (the dashboard's Run page
    reads ``?run=``; client, server and dashboard agree on it here)."""
    return f"{dashboard_url.rstrip('/')}/run?run={quote(run_id, safe='')}"
