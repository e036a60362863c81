"""Pydantic models of the JSON bodies (validation + the published OpenAPI schema).

Samples are deliberately NOT modelled per sample: the columnar body is validated as arrays in
``validate.validate_samples``; ``SAMPLES_BODY_SCHEMA`` only documents it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, cast, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)

from noisescope import protocol
from noisescope_server.crud import FUTURE_TOLERANCE
from noisescope_server.jsonclip import encode
from noisescope_server.tokens import DEFAULT_SCOPES
from noisescope_server.utc import in_utc_range
from noisescope_server.validate import branch_plan_problem

__all__ = [
    "SAMPLES_BODY_SCHEMA",
    "EventItem",
    "EventsBody",
    "IngestResult",
    "RunPatch",
    "RunPut",
    "RunPutResult",
    "TokenCreate",
]


def _no_nul(value: str) -> str:
    """PostgreSQL text cannot hold U+0000: reject it here (422) instead of failing in the DB."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000) characters")
    return value


def _readable_back(value: dict[str, Any]) -> dict[str, Any]:
    """Refuse a value nested deeper (``protocol.MAX_JSON_DEPTH``) or larger
    (``protocol.MAX_JSON_BYTES``) than the API returns whole."""
    depth = protocol.json_depth(value)
    if depth > protocol.MAX_JSON_DEPTH:
        raise ValueError(
            f"nests more than {protocol.MAX_JSON_DEPTH} levels deep (the limit, "
            "noisescope._wire.MAX_JSON_DEPTH); flatten it, e.g. with dotted keys"
        )
    size = len(encode(value))
    if size > protocol.MAX_JSON_BYTES:
        raise ValueError(
            f"is {size} bytes as JSON; the limit is {protocol.MAX_JSON_BYTES} bytes "
            "(noisescope._wire.MAX_JSON_BYTES): keep hyperparameters here, store large "
            "objects elsewhere"
        )
    return value


NoNul = AfterValidator(_no_nul)
#: A run config or event payload: a JSON object no deeper than ``protocol.MAX_JSON_DEPTH``.
JsonObject = Annotated[dict[str, Any], AfterValidator(_readable_back)]


def _run_id(value: str) -> str:
    problem = protocol.run_id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


RunId = Annotated[StrictStr, AfterValidator(_run_id)]
#: A time the server stores (in UTC): ISO 8601 text or Unix seconds, within the UTC calendar.
StoredTime = Annotated[datetime, AfterValidator(in_utc_range)]
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=protocol.MAX_NAME_LENGTH, strip_whitespace=True),
    NoNul,
]
#: A run's display name (may be empty) and its tags: the same limits at creation and later.
RunName = Annotated[str, StringConstraints(max_length=protocol.MAX_NAME_LENGTH), NoNul]
Tags = Annotated[list[RunName], Field(max_length=protocol.MAX_TAGS)]
Units = Literal["examples", "tokens"]
Status = Literal["running", "finished", "failed", "crashed"]


class _Strict(BaseModel):
    """One policy with the samples endpoint: no coercion (``true`` is not 1, ``"64"`` is not
    64; an integer is a number). Times alone are lax: ISO 8601 text or Unix seconds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class RunPut(_Strict):
    """Create or update a run (PUT is idempotent: the client generates the run id)."""

    project: Name
    task: Name
    name: RunName = ""
    config: JsonObject = Field(default_factory=dict)
    tags: Tags = Field(default_factory=list)
    batch_size: float | None = Field(default=None, gt=0)
    units: Units = "examples"
    status: Status = "running"
    started_at: StoredTime | None = Field(
        default=None, strict=False, description="ISO 8601 or Unix seconds; default: now"
    )
    parent_run_id: RunId | None = Field(
        default=None,
        description="a branch run (noisescope.branch): the id of the run it branched from",
    )
    branch_step: StrictInt | None = Field(
        default=None, ge=0, le=2**63 - 1, description="the parent's step the branch started at"
    )

    @field_validator("config")
    @classmethod
    def _branch_plan(cls, config: dict[str, Any]) -> dict[str, Any]:
        problem = branch_plan_problem(config)
        if problem is not None:
            raise ValueError(problem)
        return config

    @model_validator(mode="after")
    def _branch_fields_together(self) -> RunPut:
        if (self.parent_run_id is None) != (self.branch_step is None):
            raise ValueError("parent_run_id and branch_step go together (a branch of a run)")
        return self


class RunPutResult(BaseModel):
    run_id: str
    project: str
    created: bool
    dashboard_url: str | None = Field(
        default=None,
        description="the run's dashboard page (null unless NOISESCOPE_DASHBOARD_URL is set)",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what was stored otherwise than sent, and why: a started_at or ended_at "
        f"more than {FUTURE_TOLERANCE.total_seconds() / 60:g} minutes ahead of the server's "
        "clock is stored as the server's time",
    )


class RunPatch(_Strict):
    """Change some of a run's fields; an absent or null field stays as it is. ``status``,
    ``ended_at`` and ``batch_size`` come from the run's job; ``name``, ``tags`` and
    ``archived`` from people (the dashboard, the CLI, ``noisescope.Api``)."""

    status: Status | None = None
    ended_at: StoredTime | None = Field(default=None, strict=False)
    batch_size: float | None = Field(default=None, gt=0)
    name: RunName | None = Field(default=None, description="the run's new name")
    tags: Tags | None = Field(default=None, description="the run's tags: replaces the list")
    archived: bool | None = Field(
        default=None,
        description="true: archive (left out of lists, sweeps and comparisons; restorable); "
        "false: restore",
    )


class EventItem(_Strict):
    step: int = Field(ge=0, le=2**63 - 1)
    kind: Annotated[
        str, StringConstraints(min_length=1, max_length=protocol.MAX_EVENT_KIND_LENGTH), NoNul
    ]
    payload: JsonObject = Field(default_factory=dict)
    time: float | None = Field(
        default=None,
        ge=protocol.TIME_RANGE[0],
        le=protocol.TIME_RANGE[1],
        description="Unix seconds, within 0001-01-01..9999-12-31 UTC",
    )
    seq: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="client sequence number: re-sends ignored"
    )


class EventsBody(_Strict):
    events: list[EventItem] = Field(max_length=protocol.MAX_EVENTS_PER_REQUEST)


class IngestResult(BaseModel):
    received: int
    inserted: int


Scope = Literal["read", "write", "manage"]


class TokenCreate(_Strict):
    name: Annotated[str, StringConstraints(max_length=protocol.MAX_NAME_LENGTH), NoNul] = ""
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: [cast(Scope, s) for s in DEFAULT_SCOPES],
        description="read; write (ingest into the project's runs); manage (rename, tag, "
        "archive, restore, delete). Default: read and write",
    )


def _column(items: dict[str, Any], description: str) -> dict[str, Any]:
    return {"type": "array", "items": items, "description": description}


def _item(field: protocol.SampleField) -> dict[str, Any]:
    """A wire column's element schema, from the field table (``protocol.SAMPLE_FIELDS``)."""
    if field.type is int:
        return {"type": "integer", "minimum": 0}
    if field.type is str:
        return {"type": "string", "maxLength": protocol.MAX_NAME_LENGTH}
    return _NUM_NULL if field.nullable else _NUM


_NUM = {"type": "number"}
_NUM_NULL = {"anyOf": [{"type": "number"}, {"type": "null"}]}
SAMPLES_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["columns"],
    "properties": {
        "columns": {
            "type": "object",
            "description": (
                "One array per field, all the same length (at most "
                f"{protocol.MAX_SAMPLES_PER_REQUEST} samples, {protocol.MAX_BODY_BYTES} bytes per "
                "request). Re-sending a (run, seq) is ignored."
            ),
            "required": list(protocol.REQUIRED_COLUMNS),
            "additionalProperties": False,
            "properties": {
                f.name: _column(_item(f), f.doc) for f in protocol.SAMPLE_FIELDS if f.wire
            },
        }
    },
}


# The run body and its literals are the client's (``protocol.RunBody``), checked at import.
assert tuple(RunPut.model_fields) == protocol.RUN_BODY_FIELDS, tuple(RunPut.model_fields)
assert get_args(Units) == protocol.UNITS, get_args(Units)
assert get_args(Status) == protocol.RUN_STATUSES, get_args(Status)
