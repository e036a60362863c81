"""``noisescope._redact``: the one rule that takes secrets out of what noisescope prints, raises,
logs or writes (a URL's password, a secret query value), and leaves everything else as it is."""

from __future__ import annotations

import pytest

from noisescope._redact import redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://me:pw@host:8765", "http://me:***@host:8765"),
        ("http://me:p@ss@host/x", "http://me:***@host/x"),  # an unescaped "@" in the password
        ("/api/v1/runs?token=abc&limit=5", "/api/v1/runs?token=***&limit=5"),
        ("/api/v1/runs?%74oken=abc", "/api/v1/runs?token=***"),  # read as "token" by servers
        ("/api/v1/tasks?ACCESS_TOKEN=abc", "/api/v1/tasks?ACCESS_TOKEN=***"),
        (
            "http://127.0.0.1:8765/api/v1/runs?project=p",
            "http://127.0.0.1:8765/api/v1/runs?project=p",
        ),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "GET http://me:pw@h:1/api?token=abc&b=c answered HTTP 404",
            "GET http://me:***@h:1/api?token=***&b=c answered HTTP 404",
        ),
        (  # a URL typed without its scheme, as the URL check quotes it
            "noisescope url 'me:pw@host:1' is not an http(s) URL: use e.g. 'http://me:pw@host:1'",
            "noisescope url 'me:***@host:1' is not an http(s) URL: use e.g. 'http://me:***@host:1'",
        ),
        (
            "postgresql+psycopg://postgres:s3@127.0.0.1/x",
            "postgresql+psycopg://postgres:***@127.0.0.1/x",
        ),
    ],
)
def test_redact_text_masks_secrets(text: str, shown: str) -> None:
    assert redact_text(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "ConnectionError to http://127.0.0.1:9: [Errno 111] Connection refused",
        "run 'a:b' does not exist: create it first with PUT /api/v1/runs/a",
        "http://host:8765/a@b",
        "at 12:30 a@b",
        "[::1]:8765",
        "monkey=banana",
    ],
)
def test_redact_text_leaves_other_text_alone(text: str) -> None:
    assert redact_text(text) == text
