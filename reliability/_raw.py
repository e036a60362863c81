"""What an HTTP library will not send, sent over raw sockets to a real server: literal ``.`` and
``..`` path segments, bodies that stop, trickle or break their chunked framing, and clients that
vanish mid-body. Each must get its 4xx (or, when the client is gone, nothing) and the server's
log must hold no traceback; the caller counts those."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import httpx
import orjson

from reliability._hostile import API, RUN_ID_RULE, good_columns


@dataclass
class RawResult:
    name: str
    #: The status the answer starts with ("gone": the client left, no answer to read).
    expected: str
    got: str
    needle: str = ""

    @property
    def ok(self) -> bool:
        return self.got.startswith(self.expected) and self.needle in self.got


def _address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _exchange(base_url: str, data: bytes, *, trickle: bytes = b"", wait: float = 30.0) -> bytes:
    """Send ``data`` (then ``trickle`` a byte every 0.2 s) and read until the server closes or
    a whole answer is in; ``b""`` when none came."""
    with socket.create_connection(_address(base_url), timeout=wait) as sock:
        sock.sendall(data)
        sock.settimeout(0.2 if trickle else wait)
        answer = b""
        for byte in trickle:
            try:
                sock.sendall(bytes([byte]))
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if answer:
                break
        sock.settimeout(wait)
        try:
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith((b"}", b"\n0")):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
    return answer


def _status(answer: bytes) -> str:
    if not answer:
        return "no answer"
    line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    body = answer.split(b"\r\n\r\n", 1)[-1][:200].decode("utf-8", "replace")
    return f"{parts[1] if len(parts) > 1 else line} {body}"


def _answer(base_url: str, data: bytes) -> str:
    return _status(_exchange(base_url, data))


def _abandon(base_url: str, data: bytes) -> str:
    with socket.create_connection(_address(base_url), timeout=10) as sock:
        sock.sendall(data)
        time.sleep(0.2)  # the server starts reading; then the client is gone
    return "gone"


def run_raw(base_url: str, read_timeout: float) -> list[RawResult]:
    """Every case against one server whose read timeout is ``read_timeout`` seconds."""
    rid = uuid.uuid4().hex
    httpx.put(
        f"{base_url}{API}/runs/{rid}", json={"project": "raw", "task": "t"}
    ).raise_for_status()
    body = orjson.dumps({"columns": good_columns(5)})

    def head(path: str, framing: str, method: str = "POST") -> bytes:
        return f"{method} {API}{path} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode()

    length = f"Content-Length: {len(body)}"
    chunked = "Transfer-Encoding: chunked"
    samples = f"/runs/{rid}/samples"
    results: list[RawResult] = []
    cases: list[tuple[str, str, str, Callable[[], str]]] = []
    for method in ("GET", "PUT", "POST"):
        for path in ("/runs/..", "/runs/.", "/runs/../samples", "/runs/../x/heartbeat"):
            data = head(path, "Content-Length: 0", method)
            cases.append((f"literal {method} {path}", "422", RUN_ID_RULE,
                          partial(_answer, base_url, data)))  # fmt: skip
    timeout_text = f"did not arrive within {read_timeout:g} s"
    cases += [
        ("body stops half-way", "408", timeout_text,
         lambda: _status(_exchange(base_url, head(samples, length) + body[:20]))),
        ("body trickled a byte per 0.2 s", "408", timeout_text,
         lambda: _status(_exchange(base_url, head(samples, length), trickle=body))),
        ("malformed chunk size", "400", "Invalid HTTP request",
         lambda: _status(_exchange(base_url, head(samples, chunked) + b"zz\r\nabc\r\n"))),
        ("client killed mid-body", "gone", "",
         lambda: _abandon(base_url, head(samples, length) + body[:20])),
        ("client killed mid-chunk", "gone", "",
         lambda: _abandon(base_url, head(samples, chunked) + b"10\r\n" + body[:16] + b"\r\n")),
        ("client killed after a bad chunk", "gone", "",
         lambda: _abandon(base_url, head(samples, chunked) + b"10\r\n" + body[:16] + b"\r\nzz")),
        ("client killed mid-PUT", "gone", "",
         lambda: _abandon(base_url, head(f"/runs/{uuid.uuid4().hex}", "Content-Length: 99", "PUT")
                          + b'{"project"')),
    ]  # fmt: skip
    for name, expected, needle, send in cases:
        try:
            got = send()
        except OSError as exc:
            got = f"error {exc!r}"
        results.append(RawResult(name, expected, got, needle))
    stored = httpx.get(f"{base_url}{API}/runs/{rid}").json().get("n_samples")
    results.append(RawResult("samples stored by all of these", "0", str(stored)))
    return results
