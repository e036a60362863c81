"""The wire format shared by the client and the server: one definition, two users.

Samples travel column-wise (one JSON array per field): several times cheaper to encode, parse
and validate than one object per sample, which is what keeps ingest near the database's own
insert rate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import quote

API_PREFIX: Final = "/api/v1"

#: Per-sample columns, in storage order. ``loss`` and ``lr`` may hold nulls.
SAMPLE_COLUMNS: Final = (
    "seq",
    "step",
    "examples",
    "b_small",
    "b_big",
    "g_small_sq",
    "g_big_sq",
    "loss",
    "lr",
    "time",
    "series",
)
REQUIRED_COLUMNS: Final = ("seq", "step", "b_small", "b_big", "g_small_sq", "g_big_sq")
NULLABLE_COLUMNS: Final = ("examples", "loss", "lr", "time")

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
RUN_STATUSES: Final = ("running", "finished", "failed", "crashed")

#: Limits the server enforces and the client respects when batching.
MAX_SAMPLES_PER_REQUEST: Final = 50_000
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
MAX_NAME_LENGTH: Final = 200
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
#: The range of each optional sample column the server reads arithmetic from: ``loss`` and
#: ``lr`` are summed, ``examples`` counted from 0 and ``time`` a Unix time (the server refuses
#: a value outside with the request; the client sends it as null, as a non-finite one).
SAMPLE_RANGES: Final = {
    "examples": (0.0, MAX_SUMMED),
    "loss": (-MAX_SUMMED, MAX_SUMMED),
    "lr": (-MAX_SUMMED, MAX_SUMMED),
    "time": TIME_RANGE,
}


#: A run id: 1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter, digit or ``_``.
#: Ids name spool folders and URL path segments, so ``.``, ``..`` and hidden names are refused.
RUN_ID_PATTERN: Final = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_RUN_ID_RE: Final = re.compile(RUN_ID_PATTERN)


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
