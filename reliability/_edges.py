"""Numeric edge values on every numeric query parameter: each GET route's numeric parameters (read
from the server's own OpenAPI schema, so a new one is covered without editing this list) get
the float range's ends, int64's, 0, negatives, just-above-1 and non-numbers, one parameter at a
time, against a run and a sweep. Every answer must be a 2xx, or a 4xx that names the parameter
it refuses; never a 5xx, nor a 422 that blames the database for arithmetic."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness import columns, run_body
from harness.synthetic_sweep import make_sweep, post
from harness.write_then_read import DATABASE_BLAME

__all__ = ["EDGE_VALUES", "EdgeResult", "run_edges"]

API = "/api/v1"
EDGE_VALUES = [
    "0", "-0", "-1", "5e-324", "1e-300", "1e-6", "0.9999999999999999", "1.0000000000000002",
    "1.5", "2", "1e18", "1e20", "1e300", "1.7976931348623157e308", "1e309", "-1e309", "nan",
    "inf", "9223372036854775807", "9223372036854775808", "-9223372036854775809", "x",
]  # fmt: skip


def _required(route: str, values: dict[str, str]) -> dict[str, str]:
    """The route's required parameters other than the one varied."""
    if route == "/parallelism":
        return {"b_crit": "1000", "per_device_batch": "8"}
    return {"runs": values["run_id"]} if route == "/series" else {}


@dataclass
class EdgeResult:
    parameters: list[str] = field(default_factory=list)
    requests: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    #: (request, status, detail) of every answer that breaks the rule.
    failures: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.requests > 0 and not self.failures


def _numeric(schema: dict[str, Any]) -> bool:
    kinds = {schema.get("type")}
    for key in ("anyOf", "oneOf"):
        kinds |= {s.get("type") for s in schema.get(key, [])}
        kinds |= {s.get("items", {}).get("type") for s in schema.get(key, [])}
    kinds.add(schema.get("items", {}).get("type"))
    return bool(kinds & {"number", "integer"})


def _seed(c: httpx.Client) -> dict[str, str]:
    """A run with samples, an eval and a batch-size event, and a 3-size sweep: the path values."""
    project = f"edges-{uuid.uuid4().hex[:8]}"
    rid = uuid.uuid4().hex
    c.put(f"{API}/runs/{rid}", json=run_body(project=project, task="t")).raise_for_status()
    c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(300)}).raise_for_status()
    events = [{"step": 10, "kind": "eval", "payload": {"loss": 1.5}},
              {"step": 100, "kind": "batch_size", "payload": {"batch_size": 64}}]  # fmt: skip
    c.post(f"{API}/runs/{rid}/events", json={"events": events}).raise_for_status()
    post(c, make_sweep(200.0, (32, 128, 512), rng=random.Random(0)), project=project, task="s")
    return {"run_id": rid, "project": project, "task": "s"}


def run_edges(base_url: str) -> EdgeResult:
    out = EdgeResult()
    with httpx.Client(base_url=base_url, timeout=120) as c:
        values = _seed(c)
        spec = c.get(f"{API}/openapi.json").raise_for_status().json()
        for path, ops in spec["paths"].items():
            op = ops.get("get")
            if op is None:
                continue
            route = path.removeprefix(API)
            target = route.format(**values)
            params = [p for p in op.get("parameters", []) if p["in"] == "query"]
            numeric = [p["name"] for p in params if _numeric(p.get("schema", {}))]
            if "throughput" in {p["name"] for p in params}:
                numeric.append("throughput")
            for name in numeric:
                out.parameters.append(f"{route} {name}")
                for value in EDGE_VALUES:
                    query = _required(route, values)
                    query[name] = f"{value}:100" if name == "throughput" else value
                    r = c.get(API + target, params=query)
                    out.requests += 1
                    out.answers[str(r.status_code)] += 1
                    detail = r.text[:300]
                    blamed = DATABASE_BLAME in detail
                    unnamed = r.status_code == 422 and name not in detail
                    if r.status_code >= 500 or blamed or unnamed:
                        out.failures.append((f"GET {route}?{name}={value}", r.status_code, detail))
    return out
