"""The retry policy: which answers are retried, how long to wait, what ``Retry-After`` says.

Connection errors, timeouts, 408, 425, 429 and 5xx are retried with exponential backoff and
jitter, never sooner than the server's ``Retry-After``; 404 means the server lost the run
(create it again); 410 that the run was deleted there (nothing more is sent for it, and it is
never created again); any other answer is final, and a 405 or a web page is no noisescope
server's (``not_noisescope``).
"""

from __future__ import annotations

import email.utils
import random
import time
from typing import Any, Literal

from noisescope._config import server_hint
from noisescope._transport import Response

#: What an answer means for the request's data: ``refused`` is the sender's reading of a 401/403
#: on a run the server had taken (a token revoked mid-run): the spool keeps everything;
#: ``gone``: the run was deleted on the server, which takes nothing more of it (HTTP 410).
Outcome = Literal["ok", "retry", "fatal", "missing", "refused", "gone"]


class Backoff:
    """Exponential backoff with "equal jitter": ``d = min(cap, base·2^k)``, wait U(d/2, d).

    Jitter keeps many clients that lost the same server from retrying in lock step. A server's
    ``Retry-After`` is honoured as a lower bound.
    """

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self, retry_after: float | None = None) -> float:
        # the exponent is capped: 2.0**1024 overflows, i.e. after ~1000 failed retries (hours
        # of outage) the sender would otherwise fail on every tick and stop backing off
        ceiling = min(self.cap, self.base * (2.0 ** min(self.failures, 64)))
        self.failures += 1
        delay = self._rng.uniform(ceiling / 2.0, ceiling)
        if retry_after is not None:
            delay = max(delay, min(retry_after, 3600.0))
        return delay

    def reset(self) -> None:
        self.failures = 0


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify(response: Response) -> Outcome:
    status = response.status
    if 200 <= status < 300:
        return "ok"
    if status in (408, 425, 429) or status >= 500:
        return "retry"
    if status == 404:
        return "missing"
    if status == 410:
        return "gone"
    return "fatal"


def is_html(response: Response) -> bool:
    return (response.header("Content-Type") or "").lower().startswith("text/html")


def not_noisescope(response: Response) -> bool:
    """An answer no noisescope server gives to a run's creation (a 405, or a web page: e.g. the
    Streamlit dashboard's port)."""
    return response.status == 405 or is_html(response)


def not_noisescope_problem(url: str, request: str, response: Response) -> str:
    """The sentence for such an answer from ``url`` to ``request`` ("PUT /api/v1/runs/ID")."""
    page = " and a web page" if is_html(response) else ""
    return (
        f"{url} is not a noisescope server: it answered {request} with HTTP "
        f"{response.status}{page}; {server_hint(url)} (set url= or NOISESCOPE_URL)"
    )


def answer_field(response: Response, key: str) -> Any:
    """``key`` of a JSON-object answer; None from any other answer (an older server, a
    proxy's page, a body that is not JSON)."""
    try:
        answer = response.json()
    except (ValueError, RecursionError):
        return None
    return answer.get(key) if isinstance(answer, dict) else None


def inserted(response: Response, count: int) -> int:
    """How many of ``count`` samples a samples answer says were stored anew
    (``{"inserted": m}``); ``count`` from an answer that does not say."""
    said = answer_field(response, "inserted")
    return said if type(said) is int and 0 <= said <= count else count


def refused_rows(response: Response, count: int) -> list[int]:
    """The samples of a request of ``count`` that a 422 names (``{"rows": [...]}``), sorted;
    none when it names none, or names one that is not in the request."""
    rows = answer_field(response, "rows")
    if not isinstance(rows, list) or not all(type(i) is int and 0 <= i < count for i in rows):
        return []
    return sorted(set(rows))
