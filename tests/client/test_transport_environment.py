"""``HTTPTransport`` reads the environment once, when it is made, and still honours what requests
would read there on each request: the proxy and ``NO_PROXY``, and a ``~/.netrc`` login unless a
token is given (then the bearer token is what is sent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.broken_http import BrokenServer, json_answer
from noisescope._transport import HTTPTransport, Request

HEALTH = Request("GET", "/api/v1/health", None, {})


@pytest.fixture(autouse=True)
def _no_inherited_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _first_line(head: bytes) -> str:
    return head.split(b"\r\n", 1)[0].decode()


def test_the_proxy_in_the_environment_carries_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    with BrokenServer(json_answer('{"status": "ok"}')) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        transport = HTTPTransport("http://noisescope.invalid:8765")
        answer = transport.handle_request(HEALTH)
        transport.close()
    assert answer.status == 200
    # a forward proxy is asked for the absolute URL
    assert _first_line(proxy.requests[0]) == (
        "GET http://noisescope.invalid:8765/api/v1/health HTTP/1.1"
    )


def test_no_proxy_sends_straight_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    with BrokenServer(json_answer('{"status": "ok"}')) as server:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        transport = HTTPTransport(server.url)
        answer = transport.handle_request(HEALTH)
        transport.close()
    assert answer.status == 200
    assert _first_line(server.requests[0]) == "GET /api/v1/health HTTP/1.1"


def test_the_environment_is_read_when_the_transport_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with BrokenServer(json_answer('{"status": "ok"}')) as server:
        transport = HTTPTransport(server.url)
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # set later: not read per request
        answer = transport.handle_request(HEALTH)
        transport.close()
    assert answer.status == 200
    assert _first_line(server.requests[0]) == "GET /api/v1/health HTTP/1.1"


@pytest.mark.parametrize("token", [None, "secret"])
def test_a_netrc_login_is_used_only_without_a_token(
    token: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine 127.0.0.1 login someone password pw\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with BrokenServer(json_answer('{"status": "ok"}')) as server:
        transport = HTTPTransport(server.url, token=token)
        transport.handle_request(HEALTH)
        transport.close()
    headers = server.requests[0].decode().lower()
    if token is None:
        assert "authorization: basic " in headers  # someone:pw, as requests would send
    else:
        assert "authorization: bearer secret" in headers and "basic" not in headers
