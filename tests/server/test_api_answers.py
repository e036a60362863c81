"""The check behind "the same answers before and after" (harness/api_answers.py): it must ask
every GET route the API has, answer the same on two fresh servers (else its hash says nothing
about the code) and see real answers, not only refusals."""

from __future__ import annotations

import re

from harness import AppServer
from harness.api_answers import answers, answers_hash, read_paths

#: Routes that describe the API instead of answering about the database.
_DOCS = {"/api/v1/openapi.json", "/api/v1/docs", "/api/v1/docs/oauth2-redirect", "/api/v1/redoc"}


def _pattern(template: str) -> re.Pattern[str]:
    """A route template as a regular expression (``{task}`` takes slashes: ``{task:path}``)."""
    return re.compile(re.sub(r"\{[^}]+\}", "[^/]+", template.removeprefix("/api/v1")) + "$")


def test_every_get_route_is_asked() -> None:
    with AppServer() as server, server.client() as http:
        spec = http.get("/api/v1/openapi.json").json()
    templates = {path for path, ops in spec["paths"].items() if "get" in ops} - _DOCS
    assert len(templates) >= 15
    asked = read_paths()
    missing = [t for t in sorted(templates) if not any(_pattern(t).match(p) for p in asked)]
    assert missing == []


def test_the_hash_is_the_same_on_two_fresh_servers() -> None:
    assert answers_hash() == answers_hash()


def test_the_answers_are_answers() -> None:
    """Most reads succeed on the written database; the refusals asked for are refused."""
    got = answers()
    statuses = [value[0] for key, value in got.items() if key.startswith("GET ")]
    assert statuses.count(200) >= 200
    assert sorted(s for s in statuses if s != 200) == [404, 404, 422, 422]
    assert all(s < 500 for s in statuses)
    api_errors = [k for k, v in got.items() if k.startswith("Api ") and "Error:" in str(v)[:80]]
    assert api_errors == []
    run = got["GET /runs/00000000000000000000000000000001 {}"][1]
    assert run["tags"] == ["base", "tagged"] and run["last_seen_at"] == "<now>"
    assert run["b_simple"] is not None
