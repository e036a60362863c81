"""``noisescope.Api`` against a deliberately broken server: every failure of a call is an
``ApiError`` (the dashboard catches nothing else) that names the URL and what came back; one
deadline bounds a whole call; an answer's decoded size is capped (issue 29 items 2-4)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import noisescope
from harness.broken_http import Answer, BrokenServer, bomb, json_answer, reset, trickle
from noisescope._transport import Request, Response


@pytest.fixture(scope="module")
def broken() -> Iterator[BrokenServer]:
    with BrokenServer(json_answer("[]")) as srv:
        yield srv


def _projects(api: noisescope.Api) -> object:
    return api.projects()


def _runs(api: noisescope.Api) -> object:
    return api.runs()


def _run(api: noisescope.Api) -> object:
    return api.run("r1")


def _csv(api: noisescope.Api) -> object:
    return api.samples_csv("r1")


HALF = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[{"
SUMMARY_KEYS = '"project": "p", "task": "t", "name": "n", "status": "running"'
CASES: list[tuple[str, Any, Callable[[noisescope.Api], object], str]] = [
    ("HTML with 200", Answer(b"<html>up</html>", content_type="text/html"), _runs, "web page"),
    ("HTML for the CSV", Answer(b"<html>up</html>", content_type="text/html"), _csv, "web page"),
    ("empty body with 200", Answer(b""), _runs, "not JSON"),
    ("{} for a list", json_answer("{}"), _runs, "expected a list"),
    ("[] for an object", json_answer("[]"), _run, "expected an object"),
    ("a string for an object", json_answer('"up"'), _run, "expected an object"),
    ("null for an object", json_answer("null"), _run, "expected an object, got null"),
    ("{} for a run", json_answer("{}"), _run, "missing"),
    ("a number where text goes", json_answer('["p", 5]'), _projects, "[1]: expected a string"),
    ("a run without its id", json_answer(f"[{{{SUMMARY_KEYS}}}]"), _runs, "missing uid"),
    ("JSON 100 000 deep", json_answer("[" * 100_000 + "]" * 100_000), _runs, "not JSON"),
    ("bad UTF-8 in the CSV", Answer(b"seq\n\xff\xfe", content_type="text/csv"), _csv, "UTF-8"),
    ("bad UTF-8 in JSON", Answer(b'["\xff"]'), _runs, "not JSON"),
    ("HTML with 500", Answer(b"<html>oops</html>", 500, "text/html"), _runs, "HTTP 500"),
    ("deep JSON with 400", json_answer("[" * 100_000 + "]" * 100_000, 400), _runs, "HTTP 400"),
    ("304 with no body", Answer(b"", 304), _runs, "HTTP 304"),
    ("corrupt gzip", Answer(b"nope", extra=(("Content-Encoding", "gzip"),)), _runs, "no answer"),
    ("reset before answering", reset(), _runs, "no answer"),
    ("reset mid-answer", reset(HALF), _runs, "no answer"),
    ("closed mid-answer", Answer(b"[").raw().replace(b": 1\r", b": 9\r"), _runs, "no answer"),
]


@pytest.mark.parametrize(
    ("behaviour", "call", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_failure_is_an_api_error_naming_the_url_and_what_came_back(
    broken: BrokenServer, behaviour: Any, call: Callable[[noisescope.Api], object], needle: str
) -> None:
    broken.behaviour = behaviour if callable(behaviour) else _send(behaviour)
    with noisescope.Api(broken.url, timeout=10) as api, pytest.raises(noisescope.ApiError) as exc:
        call(api)
    assert broken.url in str(exc.value) and needle in str(exc.value), str(exc.value)


def _send(raw: bytes) -> Callable[[Any], None]:
    return lambda conn: conn.sendall(raw)


@pytest.mark.parametrize("head_too", [False, True], ids=["body", "status line and head"])
def test_one_deadline_bounds_a_call_whoever_trickles(broken: BrokenServer, head_too: bool) -> None:
    """A byte every 0.2 s never lets one read wait a second, so a per-read timeout of 1 s
    held the call for the whole 60 s answer."""
    answer = json_answer("[" + " " * 300 + "]")
    broken.behaviour = trickle(answer, 0.2, head_too=head_too)
    start = time.monotonic()
    with noisescope.Api(broken.url, timeout=1) as api, pytest.raises(noisescope.ApiError) as exc:
        api.runs()
    assert time.monotonic() - start < 20  # the trickle takes over 60 s
    assert exc.value.status == 0 and "within 1 s" in str(exc.value), str(exc.value)


def test_a_decompression_bomb_is_refused_unread(broken: BrokenServer) -> None:
    """64 MiB of zeros in about 64 KiB of gzip: refused past the cap, never held whole."""
    broken.behaviour = bomb(64 << 20)
    tracemalloc.start()
    try:
        api = noisescope.Api(broken.url, max_answer_bytes=1 << 20)
        with api, pytest.raises(noisescope.AnswerError) as exc:
            api.runs()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "larger than 1,048,576 bytes" in str(exc.value) and "max_answer_bytes" in str(exc.value)
    assert broken.url in str(exc.value)
    assert peak < 16 << 20, peak


def test_an_answer_within_the_cap_is_read(broken: BrokenServer) -> None:
    broken.behaviour = bomb(1 << 20)  # 1 MiB of "0": the JSON number 000..., not a list
    api = noisescope.Api(broken.url, max_answer_bytes=2 << 20)
    with api, pytest.raises(noisescope.AnswerError, match="not JSON"):
        api.runs()
    broken.behaviour = json_answer('["a", "b"]')
    with noisescope.Api(broken.url, max_answer_bytes=10) as api:
        assert api.projects() == ["a", "b"]


class _Streamlit:
    """The dashboard's answer to every path: its app page, with 200."""

    def handle_request(self, request: Request) -> Response:
        page = b"<!doctype html><html><title>Streamlit</title>Streamlit Inc.</html>"
        return Response(200, page, {"Content-Type": "text/html"})

    def close(self) -> None:
        pass


def test_the_dashboards_url_gets_the_servers_url_as_init_and_sync_say_it() -> None:
    """Issue 47 item 6: Api at the dashboard's own URL said "not JSON (text/html) ...
    Streamlit Inc." where ``init`` and ``sync`` name the server's port."""
    api = noisescope.Api("http://127.0.0.1:8501", transport=_Streamlit())
    with api, pytest.raises(noisescope.AnswerError) as exc:
        api.projects()
    said = str(exc.value)
    assert "this looks like the dashboard (port 8501)" in said, said
    assert "use http://127.0.0.1:8765" in said and "Streamlit" not in said, said


def test_a_web_page_elsewhere_asks_whether_it_is_the_dashboard(broken: BrokenServer) -> None:
    broken.behaviour = Answer(b"<html>up</html>", content_type="text/html")
    with noisescope.Api(broken.url) as api, pytest.raises(noisescope.AnswerError) as exc:
        api.run("r1")
    assert "is it the dashboard? the server's default port is 8765" in str(exc.value)
