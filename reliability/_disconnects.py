"""Clients that break their body or vanish mid-body, against a server with auth on: without a
token the server refuses before reading the body (401), so its answer can race uvicorn's own
400 for a broken chunk; with one, the body is read and the disconnect noticed. Each must get
its answer (or, gone, none), nothing may be stored, and the server's log must hold no
traceback (the caller counts those)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import orjson

from harness import columns, run_body
from reliability._raw import _abandon, _exchange, _status

__all__ = ["Disconnect", "run_auth_disconnects"]


@dataclass
class Disconnect:
    name: str
    #: What the answer may start with ("gone": the client left, nothing to read).
    expected: tuple[str, ...]
    got: str

    @property
    def ok(self) -> bool:
        return any(self.got.startswith(e) for e in self.expected)


API = "/api/v1"


def run_auth_disconnects(base_url: str, token: str, repeats: int = 3) -> list[Disconnect]:
    """Each case ``repeats`` times (the traceback came every time), with and without a token."""
    bearer = {"Authorization": f"Bearer {token}"}
    rid = uuid.uuid4().hex
    httpx.put(f"{base_url}{API}/runs/{rid}", json=run_body(), headers=bearer).raise_for_status()
    body = orjson.dumps({"columns": columns(5)})

    def head(framing: str, auth: bool, path: str = "samples") -> bytes:
        who = f"Authorization: Bearer {token}\r\n" if auth else ""
        return (
            f"POST {API}/runs/{rid}/{path} HTTP/1.1\r\nHost: x\r\n{who}{framing}\r\n\r\n".encode()
        )

    chunked, length = "Transfer-Encoding: chunked", f"Content-Length: {len(body)}"
    results = []
    for auth in (False, True):
        who = "with a token" if auth else "no token"
        # without a token, uvicorn's 400 for the broken framing and the app's 401 race
        broken = ("400",) if auth else ("400", "401")
        answered = [
            ("malformed chunk size", head(chunked, auth) + b"zz\r\nabc\r\n"),
            ("malformed mid-body", head(chunked, auth) + b"10\r\n" + body[:16] + b"\r\nzz\r\n"),
        ]
        gone = [
            ("killed mid-body", head(length, auth) + body[:20]),
            ("killed mid-chunk", head(chunked, auth) + b"10\r\n" + body[:16] + b"\r\n"),
            ("killed after a bad chunk", head(chunked, auth) + b"10\r\n" + body[:16] + b"\r\nzz"),
            ("events killed mid-body", head("Content-Length: 99", auth, "events") + b'{"ev'),
        ]
        for i in range(repeats):
            for name, data in answered:
                got = _status(_exchange(base_url, data, wait=10))
                results.append(Disconnect(f"{name}, {who} (#{i + 1})", broken, got))
            for name, data in gone:
                got = _abandon(base_url, data)
                results.append(Disconnect(f"{name}, {who} (#{i + 1})", ("gone",), got))
    stored = httpx.get(f"{base_url}{API}/runs/{rid}", headers=bearer).json().get("n_samples")
    results.append(Disconnect("samples stored by all of these", ("0",), str(stored)))
    return results
