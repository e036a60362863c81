"""Request bodies on a real server: gzip members and trailing data, the read timeout, and
clients that go away mid-body (an info line, never a traceback in the server's log)."""

from __future__ import annotations

import gzip
import socket
import time
import uuid
import zlib
from collections.abc import Iterator

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from harness import ServerProcess, columns, run_body

API = "/api/v1"
GZ = {"Content-Encoding": "gzip"}


@pytest.fixture
def target(client: TestClient) -> str:
    rid = uuid.uuid4().hex
    assert client.put(f"{API}/runs/{rid}", json=run_body()).status_code == 201
    return rid


def _n_samples(client: TestClient, rid: str) -> int:
    return int(client.get(f"{API}/runs/{rid}").json()["n_samples"])


def test_a_multi_member_gzip_body_is_read_to_its_last_member(
    client: TestClient, target: str
) -> None:
    body = orjson.dumps({"columns": columns(30)})
    members = b"".join(gzip.compress(body[i : i + 50]) for i in range(0, len(body), 50))
    r = client.post(f"{API}/runs/{target}/samples", content=members, headers=GZ)
    assert r.status_code == 200, r.text
    assert r.json() == {"received": 30, "inserted": 30}


@pytest.mark.parametrize(
    "tail", [b"garbage", b"\x00\x00\x00\x00", b"\x1f"], ids=["text", "zeros", "half-magic"]
)
def test_trailing_data_after_gzip_is_refused(client: TestClient, target: str, tail: bytes) -> None:
    body = gzip.compress(orjson.dumps({"columns": columns(5)})) + tail
    r = client.post(f"{API}/runs/{target}/samples", content=body, headers=GZ)
    assert r.status_code == 400, r.text
    assert f"{len(tail)} bytes of trailing data" in r.json()["detail"]
    assert _n_samples(client, target) == 0


def test_trailing_data_after_deflate_is_refused(client: TestClient, target: str) -> None:
    body = zlib.compress(orjson.dumps({"columns": columns(5)})) + b"xx"
    r = client.post(
        f"{API}/runs/{target}/samples", content=body, headers={"Content-Encoding": "deflate"}
    )
    assert r.status_code == 400 and "trailing data" in r.json()["detail"], r.text


def test_the_bomb_guard_counts_every_member(client: TestClient, target: str) -> None:
    # two members of 0.6 MiB each: each alone is under the module server's 1 MiB limit
    member = gzip.compress(b" " * (600 << 10))
    r = client.post(f"{API}/runs/{target}/samples", content=member * 2, headers=GZ)
    assert r.status_code == 413 and "decompressed" in r.json()["detail"], r.text


# --- slow and vanishing clients ------------------------------------------------------------------


ADMIN = "admin-secret-for-body-tests"


def _info_server(auth: str = "off") -> ServerProcess:
    """A server with a 2 s read timeout, logging at info level."""
    env = {"NOISESCOPE_READ_TIMEOUT": "2", "NOISESCOPE_ADMIN_TOKEN": ADMIN}
    proc = ServerProcess(env=env, auth=auth)
    proc.command = lambda: [*ServerProcess.command(proc)[:-1], "info"]  # type: ignore[method-assign]
    return proc


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerProcess]:
    with _info_server() as proc:
        yield proc


@pytest.fixture(scope="module", params=["off", "write", "all"])
def any_auth_server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with _info_server(request.param) as proc:
        yield proc


def _connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _head(run_id: str, length: int | None, path: str = "samples") -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return f"POST {API}/runs/{run_id}/{path} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode()


def _read_answer(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def test_a_body_that_does_not_arrive_in_time_gets_408(slow_server: ServerProcess) -> None:
    rid = uuid.uuid4().hex
    httpx.put(f"{slow_server.url}{API}/runs/{rid}", json=run_body()).raise_for_status()
    body = orjson.dumps({"columns": columns(5)})
    with _connect(slow_server) as sock:
        sock.sendall(_head(rid, len(body)) + body[:10])  # ...and nothing more
        answer = _read_answer(sock)  # the server answers and closes the connection
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"did not arrive within 2 s" in answer and b"read timeout" in answer
    got = httpx.get(f"{slow_server.url}{API}/runs/{rid}").json()
    assert got["n_samples"] == 0


def test_a_body_trickled_byte_by_byte_is_still_bounded(slow_server: ServerProcess) -> None:
    """Each byte resets uvicorn's keep-alive timer; the read timeout is one deadline."""
    rid = uuid.uuid4().hex
    body = orjson.dumps({"columns": columns(5)})
    with _connect(slow_server) as sock:
        sock.sendall(_head(rid, len(body)))
        sock.settimeout(0.5)
        answer = b""
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
                answer += sock.recv(65536)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass
            if answer:
                break
    assert answer.startswith(b"HTTP/1.1 408"), answer


def _abandon(server: ServerProcess, data: bytes) -> None:
    with _connect(server) as sock:
        sock.sendall(data)
        time.sleep(0.2)  # let the server start reading before the connection goes


def test_clients_that_vanish_mid_body_log_no_traceback(any_auth_server: ServerProcess) -> None:
    """With auth on, the 401 of a request without a token comes before its body is read: a
    broken chunk then made uvicorn answer 400 and close, and the 401 written into the closed
    connection logged a traceback (issue 29 item 5), every time."""
    slow_server = any_auth_server
    admin = {"Authorization": f"Bearer {ADMIN}"}
    made = httpx.post(f"{slow_server.url}{API}/projects/proj/tokens", headers=admin)
    token = {"Authorization": f"Bearer {made.json()['token']}"}
    rid = uuid.uuid4().hex
    put_run = httpx.put(f"{slow_server.url}{API}/runs/{rid}", json=run_body(), headers=token)
    put_run.raise_for_status()
    body = orjson.dumps({"columns": columns(5)})
    put = f"PUT {API}/runs/{uuid.uuid4().hex} HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n"
    cases = [
        _head(rid, len(body)) + body[:20],  # killed mid-body
        _head(rid, None) + b"10\r\n" + body[:16] + b"\r\n",  # chunked, then gone
        _head(rid, None) + b"zz\r\nabc\r\n",  # malformed chunk size
        _head(rid, None) + b"10\r\n" + body[:16] + b"\r\nzz\r\n",  # malformed mid-body
        _head(rid, 5, "events") + b"{",
        put.encode() + b'{"project"',
    ]
    for data in cases:
        _abandon(slow_server, data)
    # the server is still serving, stored nothing, and said what happened at info level
    said = "disconnected before sending" if slow_server.auth == "off" else "Invalid HTTP request"
    deadline = time.monotonic() + 30
    while said not in slow_server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the last answers' log lines
    got = httpx.get(f"{slow_server.url}{API}/runs/{rid}", headers=token)
    assert got.json()["n_samples"] == 0
    log = slow_server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert said in log
    assert "WARNING" not in log, log
