"""``noisescope.Api`` against a deliberately broken server (harness/broken_http.py): each
failure mode (wrong content type, wrong shape, a trickle, a decompression bomb, a reset) must
end the call with an ``ApiError`` that names the URL and what came back, within the call's
timeout, without holding an answer past ``max_answer_bytes``."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import noisescope
from harness.broken_http import Answer, BrokenServer, bomb, json_answer, reset, trickle
from noisescope._api import MAX_ANSWER_BYTES

__all__ = ["ClientCase", "run_read_client"]

#: The call's timeout in the trickle cases (s); each trickle would take over a minute.
TIMEOUT = 2.0
_HALF = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[{"


@dataclass
class ClientCase:
    kind: str
    name: str
    #: The exception's class, "returned" when the call returned.
    raised: str
    names_url: bool
    seconds: float
    #: Peak memory the client's Python objects held during the call (tracemalloc), MiB.
    peak_mib: float
    message: str
    #: The most the case may take (s) and hold (MiB).
    max_seconds: float = 30.0
    max_mib: float = 80.0

    @property
    def ok(self) -> bool:
        api_error = self.raised in ("ApiError", "NotFoundError", "AnswerError")
        fast = self.seconds <= self.max_seconds
        return api_error and self.names_url and fast and self.peak_mib <= self.max_mib


def _call(
    server: BrokenServer, behaviour: Any, call: Callable[[noisescope.Api], object], **kw: Any
) -> tuple[str, bool, float, float, str]:
    server.behaviour = behaviour
    api = noisescope.Api(server.url, **kw)
    tracemalloc.start()
    start = time.monotonic()
    try:
        call(api)
    except Exception as exc:  # what the dashboard would have to catch
        raised, message = type(exc).__name__, str(exc)
    else:
        raised, message = "returned", ""
    finally:
        seconds = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        api.close()
    return raised, server.url in message, seconds, peak, message


def run_read_client(bomb_bytes: int) -> list[ClientCase]:
    """Every case against one broken server; the bomb unpacks to ``bomb_bytes``."""
    deep = "[" * 100_000 + "]" * 100_000
    runs: Callable[[noisescope.Api], object] = lambda api: api.runs()  # noqa: E731
    run: Callable[[noisescope.Api], object] = lambda api: api.run("r1")  # noqa: E731
    csv: Callable[[noisescope.Api], object] = lambda api: api.samples_csv("r1")  # noqa: E731
    slow = json_answer("[" + " " * 300 + "]")
    cases: list[tuple[str, str, Any, Callable[[noisescope.Api], object], dict[str, Any]]] = [
        ("content type", "HTML with 200", Answer(b"<html>up</html>", content_type="text/html"),
         runs, {}),
        ("content type", "empty body with 200", Answer(b""), runs, {}),
        ("content type", "bad UTF-8 in the CSV", Answer(b"seq\n\xff", content_type="text/csv"),
         csv, {}),
        ("content type", "HTML with 500", Answer(b"<html>x</html>", 500, "text/html"), runs, {}),
        ("shape", "{} where a list goes", json_answer("{}"), runs, {}),
        ("shape", "[] where an object goes", json_answer("[]"), run, {}),
        ("shape", "null where an object goes", json_answer("null"), run, {}),
        ("shape", "a run without its fields", json_answer('{"uid": "r1"}'), run, {}),
        ("shape", "JSON 100,000 deep", json_answer(deep), runs, {}),
        ("shape", "JSON 100,000 deep with 400", json_answer(deep, 400), runs, {}),
        ("trickle", f"body a byte per 0.2 s (timeout {TIMEOUT:g} s)", trickle(slow, 0.2),
         runs, {"timeout": TIMEOUT}),
        ("trickle", f"status line and head a byte per 0.2 s (timeout {TIMEOUT:g} s)",
         trickle(slow, 0.2, head_too=True), runs, {"timeout": TIMEOUT}),
        ("bomb", f"gzip of {bomb_bytes >> 20} MiB, default cap "
         f"({MAX_ANSWER_BYTES >> 20} MiB)", bomb(bomb_bytes), runs, {}),
        ("bomb", f"gzip of {bomb_bytes >> 20} MiB, max_answer_bytes=1 MiB", bomb(bomb_bytes),
         runs, {"max_answer_bytes": 1 << 20}),
        ("bomb", "corrupt gzip", Answer(b"nope", extra=(("Content-Encoding", "gzip"),)), runs, {}),
        ("reset", "reset before answering", reset(), runs, {}),
        ("reset", "reset mid-answer", reset(_HALF), runs, {}),
    ]  # fmt: skip
    out = []
    with BrokenServer(json_answer("[]")) as server:
        for kind, name, behaviour, call, kw in cases:
            raised, names_url, seconds, peak, message = _call(server, behaviour, call, **kw)
            limit = TIMEOUT + 3.0 if kind == "trickle" else 30.0
            cap = (kw.get("max_answer_bytes") or MAX_ANSWER_BYTES) / 2**20
            out.append(ClientCase(kind, name, raised, names_url, seconds, peak, message,
                                  limit, cap * 1.25 + 16))  # fmt: skip
    return out
