"""Every entry that takes a run id refuses an invalid one with a 422 naming the rule, however
the id is spelled in the URL (``..``, ``%2e%2e``, ``..%2Fx``), on reads as on writes."""

from __future__ import annotations

import socket

import pytest
from starlette.testclient import TestClient

from harness import ServerProcess, columns, run_body

API = "/api/v1"
RULE = "1-64 characters from A-Z a-z 0-9 _ . -"

#: URL spellings of invalid ids (httpx would resolve a literal "..", so those go raw).
HOSTILE = {
    "dot": "%2e",
    "dotdot": "%2e%2e",
    "dotdot-upper": "%2E%2E",
    "traversal": "..%2Fx",
    "traversal-deep": "..%2F..%2Fetc",
    "hidden": ".x",
    "65 chars": "a" * 65,
    "space": "a%20b",
    "non-ascii": "%C3%A9t%C3%A9",
}
ENTRIES = [
    ("PUT", "/runs/{id}", run_body()),
    ("PATCH", "/runs/{id}", {"status": "finished"}),
    ("GET", "/runs/{id}", None),
    ("POST", "/runs/{id}/samples", {"columns": columns(2)}),
    ("POST", "/runs/{id}/events", {"events": [{"step": 1, "kind": "m"}]}),
    ("POST", "/runs/{id}/heartbeat", None),
    ("GET", "/runs/{id}/series", None),
    ("GET", "/runs/{id}/series-names", None),
    ("GET", "/runs/{id}/events", None),
    ("GET", "/runs/{id}/samples.csv", None),
    ("GET", "/runs/{id}/recommendation", None),
]


@pytest.mark.parametrize("spelling", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize(
    ("method", "path", "body"), ENTRIES, ids=[f"{m} {p}" for m, p, _ in ENTRIES]
)
def test_every_entry_refuses_invalid_ids(
    client: TestClient, method: str, path: str, body: object, spelling: str
) -> None:
    r = client.request(method, API + path.format(id=spelling), json=body)
    assert r.status_code == 422, r.text
    assert RULE in r.json()["detail"]


@pytest.mark.parametrize("method", ["PUT", "PATCH", "POST"])
def test_an_empty_id_is_refused(client: TestClient, method: str) -> None:
    for path in ("/runs/", "/runs//samples", "/runs//heartbeat"):
        r = client.request(method, API + path, json=run_body())
        assert r.status_code == 422, (path, r.text)
        assert "run id '' is not valid" in r.json()["detail"]


def _raw_status(url: str, method: str, target: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer or b"}" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


@pytest.mark.parametrize(
    "target", ["/runs/..", "/runs/../samples", "/runs/./events", "/runs/../x/heartbeat"]
)
@pytest.mark.parametrize("method", ["GET", "PUT", "POST"])
def test_literal_dot_segments_are_refused(
    server_process: ServerProcess, method: str, target: str
) -> None:
    """Raw bytes on a socket (httpx would resolve the dot segments): a real process."""
    status, answer = _raw_status(server_process.url, method, API + target)
    assert status == 422, answer
    assert RULE.encode() in answer


@pytest.mark.parametrize("bad", [".", "..", "../x", "a" * 65, ""])
def test_runs_lists_are_checked(client: TestClient, bad: str) -> None:
    r = client.get(f"{API}/series", params={"runs": ["ok", bad]})
    assert r.status_code == 422, r.text
    assert "runs" in r.json()["detail"] and RULE in r.json()["detail"]


def test_valid_ids_still_work_and_the_list_keeps_its_trailing_slash(
    client: TestClient,
) -> None:
    for rid in ("_x", "a.b-c_D", "9" * 64):
        assert client.put(f"{API}/runs/{rid}", json=run_body()).status_code in (200, 201)
        assert client.get(f"{API}/runs/{rid}").status_code == 200
    assert client.get(f"{API}/runs/", follow_redirects=True).status_code == 200
