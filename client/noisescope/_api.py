"""``noisescope.Api``: read runs, series and analyses from a noisescope server.

In the spirit of ``wandb.Api()`` and ``MlflowClient``: plain method calls that return the
server's own answers as frozen dataclasses (``noisescope._results``, ``noisescope.sweep``),
with ``to_frame`` for pandas. The dashboard reads through this class and nothing else, so a
notebook sees exactly the numbers the pages show.

    api = noisescope.Api("http://127.0.0.1:8765")
    runs = api.runs(project="vision")
    report = api.critical_batch("vision", "digits")
    frame = api.series(runs[0].uid).to_frame()
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import quote, urlencode

from noisescope import _wire
from noisescope._config import DEFAULT_URL, check_url, server_hint
from noisescope._decode import Shape, decode, decoder
from noisescope._redact import redact_text, redact_url
from noisescope._results import (
    EventRow,
    ParallelismPlan,
    PlanOptions,
    RecommendationResult,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    TaskSummary,
)
from noisescope._retry import is_html
from noisescope._transport import (
    AnswerTooLarge,
    DeadlinePassed,
    HTTPTransport,
    Request,
    Response,
    Transport,
    TransportError,
)
from noisescope.forecast import ForecastReport
from noisescope.sweep import CriticalBatchReport

if TYPE_CHECKING:  # Python 3.11's; the annotation is never evaluated at run time
    from typing import Unpack

__all__ = [
    "MAX_ANSWER_BYTES",
    "AnswerError",
    "Api",
    "ApiError",
    "NotFoundError",
    "RecommendationResult",
]

T = TypeVar("T")

#: Runs per request of ``Api.compare`` (the server's limit on one query string).
COMPARE_CHUNK = 100
#: ``Api``'s default cap on one answer's decoded size: far above any list or series the server
#: sends (a 10 000-run list is a few MiB), far below what a decompression bomb unpacks to.
MAX_ANSWER_BYTES = 64 << 20


class ApiError(Exception):
    """A call failed. ``status``: the HTTP status of the answer (0: no whole answer came);
    ``detail``: the server's words, or what came back instead, or why nothing did; ``url``:
    the request's. A password in the URL and a secret query value (``?token=``) are masked
    in all three (``noisescope._redact``): an error is printed, logged and shown on pages."""

    def __init__(self, status: int, detail: str, url: str = "", method: str = "GET") -> None:
        url, detail = redact_url(url), redact_text(detail)
        where = f"{method} {url} " if url else ""
        said = f"answered HTTP {status}" if status else "got no answer"
        super().__init__(f"{where}{said}: {detail}" if where else f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.url = url


class NotFoundError(ApiError):
    """404: no such run, task or project (or none this token may read)."""


class AnswerError(ApiError):
    """The server answered, but not with what this call reads: not JSON, the wrong shape,
    text that is not UTF-8, or larger than ``max_answer_bytes``. Not a noisescope server, or
    a broken one."""


@dataclasses.dataclass(frozen=True)
class Access:
    """What an ``Api``'s token may do on its server (``GET /auth/whoami``): ``scopes`` among
    ``read``, ``write`` and ``manage`` (rename, tag, archive, restore, delete); without a
    token, what the server's ``auth`` mode leaves open to anyone."""

    auth: str
    scopes: list[str]
    project: str | None = None
    token_name: str | None = None


class Api:
    """Read access to one noisescope server.

    ``url`` defaults to ``$NOISESCOPE_URL`` (else the local default), ``token`` to
    ``$NOISESCOPE_TOKEN``: a project token limits every answer to its project. ``timeout``:
    seconds one call may take in all (connecting, waiting, reading every byte);
    ``max_answer_bytes``: the most one answer may hold once decoded. Every failure of a call
    raises ``ApiError`` (or a subclass) naming the URL and what came back.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: Transport | None = None,
    ) -> None:
        self.url = check_url(url or os.environ.get("NOISESCOPE_URL") or DEFAULT_URL)
        token = token if token is not None else (os.environ.get("NOISESCOPE_TOKEN") or None)
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self._transport = transport or HTTPTransport(self.url, token, timeout)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------
    def projects(self) -> list[str]:
        result: list[str] = self._get(list[str], "/projects")
        return result

    def runs(
        self,
        *,
        project: str | None = None,
        task: str | None = None,
        tag: str | None = None,
        status: str | None = None,
        search: str | None = None,
        limit: int = _wire.MAX_RUNS_LISTED,
        current: bool = True,
        archived: Literal["exclude", "include", "only"] = "exclude",
    ) -> list[RunSummary]:
        """Runs, newest first, each with its current B_simple and the batch in use
        (``current=False``: without the current B_simple, a cheaper list for pickers).
        Archived runs are left out unless ``archived`` is "include" or "only"."""
        query = {
            "current": "true" if current else "false",
            "archived": None if archived == "exclude" else archived,
            "project": project,
            "task": task,
            "tag": tag,
            "status": status,
            "search": search,
            "limit": limit,
        }
        result: list[RunSummary] = self._get(list[RunSummary], "/runs", query)
        return result

    def run(self, run_id: str) -> RunSummary:
        result: RunSummary = self._get(RunSummary, f"/runs/{_seg(run_id)}")
        return result

    def series(
        self,
        run_id: str,
        *,
        x: Literal["step", "examples", "time"] = "step",
        series: str = "",
        max_points: int = 2000,
        window: float | None = None,
    ) -> RunSeries:
        """A run's |G|^2, tr(Sigma), B_simple, loss, lr, bucketed by the server to at most
        ``max_points``; ``window`` (steps) smooths by trailing windows of exact sums."""
        query: dict[str, Any] = {"x": x, "series": series, "max_points": max_points}
        if window:
            query["window"] = window
        result: RunSeries = self._get(RunSeries, f"/runs/{_seg(run_id)}/series", query)
        return result

    def compare(
        self, run_ids: Sequence[str], *, max_points: int = 400, window_fraction: float = 0.1
    ) -> list[RunSeries]:
        """Whole-model series of several runs, each smoothed over ``window_fraction`` of its
        own length (so runs of different lengths are smoothed alike). One request per
        ``COMPARE_CHUNK`` runs, all within the one ``timeout``."""
        out: list[RunSeries] = []
        ids = list(run_ids)
        deadline = time.monotonic() + self.timeout
        for lo in range(0, len(ids), COMPARE_CHUNK):
            query = {
                "runs": ids[lo : lo + COMPARE_CHUNK],
                "max_points": max_points,
                "window_fraction": window_fraction,
            }
            part: list[RunSeries] = self._get(list[RunSeries], "/series", query, deadline)
            out += part
        return out

    def series_names(self, run_id: str) -> list[SeriesInfo]:
        result: list[SeriesInfo] = self._get(list[SeriesInfo], f"/runs/{_seg(run_id)}/series-names")
        return result

    def events(
        self,
        run_id: str,
        *,
        kinds: Sequence[str] | None = None,
        exclude_kinds: Sequence[str] = (),
        max_events: int | None = None,
    ) -> list[EventRow]:
        """A run's events in step order (batch-size changes, evaluations, notices, marks): of
        ``kinds`` only (None: all) and none of ``exclude_kinds``. ``max_events``: at most that
        many, every k-th from the first, spread over the whole run (``event_counts`` says how
        many there are)."""
        if kinds is not None and not kinds:
            return []  # no kind asked for (an empty ?kind= list would read as every kind)
        query: dict[str, Any] = {
            "kind": None if kinds is None else list(kinds),
            "exclude_kind": list(exclude_kinds),
            "max_events": max_events,
        }
        path = f"/runs/{_seg(run_id)}/events"
        result: list[EventRow] = self._get(list[EventRow], path, query)
        return result

    def event_counts(self, run_id: str) -> dict[str, int]:
        """How many events of each kind a run holds, by kind."""
        path = f"/runs/{_seg(run_id)}/event-counts"
        result: dict[str, int] = self._get(dict[str, int], path)
        return result

    def samples_csv(self, run_id: str) -> str:
        """Every raw sample of a run as CSV text."""
        url, response = self._request(f"/runs/{_seg(run_id)}/samples.csv")
        try:
            return response.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AnswerError(response.status, f"the CSV is not UTF-8 text ({exc})", url) from None

    def recommendation(
        self,
        run_id: str,
        *,
        batch_size: float | None = None,
        candidates: Sequence[float] | None = None,
        throughput: dict[float, float] | None = None,
    ) -> RecommendationResult:
        query: dict[str, Any] = {"batch_size": batch_size, "candidates": list(candidates or [])}
        if throughput:
            query["throughput"] = [f"{b:g}:{t:g}" for b, t in throughput.items()]
        path = f"/runs/{_seg(run_id)}/recommendation"
        result: RecommendationResult = self._get(RecommendationResult, path, query)
        return result

    # -- run admin: archive, restore, delete, rename, tags -----------------------------------
    def access(self) -> Access:
        """What this client's token may do: run admin needs the ``manage`` scope."""
        result: Access = self._get(Access, "/auth/whoami")
        return result

    def archive_run(self, run_id: str) -> None:
        """Archive a run: it leaves lists, sweeps and comparisons, keeps its data and still
        takes its job's samples; ``restore_run`` brings it back."""
        self._write("PATCH", f"/runs/{_seg(run_id)}", {"archived": True})

    def restore_run(self, run_id: str) -> None:
        """Bring an archived run back into lists, sweeps and comparisons."""
        self._write("PATCH", f"/runs/{_seg(run_id)}", {"archived": False})

    def delete_run(self, run_id: str) -> None:
        """Delete a run for good: its samples, events and the run itself (no undo; archive
        to remove it restorably); its id stays deleted (writes to it answer 410). Needs a token
        of the run's project with the ``manage`` scope, as renaming, tagging and archiving do."""
        self._write("DELETE", f"/runs/{_seg(run_id)}")

    def rename_run(self, run_id: str, name: str) -> None:
        self._write("PATCH", f"/runs/{_seg(run_id)}", {"name": name})

    def set_tags(self, run_id: str, tags: Sequence[str]) -> None:
        """Replace a run's tags with ``tags`` (an empty list removes them all)."""
        if isinstance(tags, str):  # a str is a Sequence[str]: "ab" would become ["a", "b"]
            raise TypeError("tags must be a list of strings, not one string")
        self._write("PATCH", f"/runs/{_seg(run_id)}", {"tags": list(tags)})

    # -- tasks --------------------------------------------------------------------------------
    def tasks(self, project: str | None = None) -> list[TaskSummary]:
        result: list[TaskSummary] = self._get(list[TaskSummary], "/tasks", {"project": project})
        return result

    def critical_batch(
        self,
        project: str,
        task: str,
        *,
        targets: Sequence[float] | None = None,
        loss: Literal["auto", "eval", "train"] = "auto",
        include_diverged: bool = False,
    ) -> CriticalBatchReport:
        """B_crit per loss target from the task's batch-size sweep (``noisescope.sweep``).

        A target's ``b_crit`` is None unless ``determined`` (its ``warnings`` say why);
        ``include_diverged`` keeps the runs whose loss diverged, left out by default."""
        path = f"/tasks/{_seg(project)}/{_seg(task)}/critical-batch"
        query: dict[str, Any] = {"targets": list(targets or []), "loss": loss}
        if include_diverged:
            query["include_diverged"] = "true"
        result: CriticalBatchReport = self._get(CriticalBatchReport, path, query)
        return result

    def branches(self, run_id: str) -> RunBranches:
        """The local critical batch size at each branch step of ``run_id``, recomputed from its
        branch runs (``noisescope.branch``), and where it plateaus."""
        result: RunBranches = self._get(RunBranches, f"/runs/{_seg(run_id)}/branches")
        return result

    def critical_batch_forecast(
        self,
        project: str,
        task: str,
        *,
        losses: Sequence[float] = (),
        targets: Sequence[float] | None = None,
    ) -> ForecastReport:
        """B_crit(L) = B*·L^(-1/α_B) across the task's sweep targets, predicted at ``losses``
        (each marked ``extrapolation`` outside the fitted losses)."""
        path = f"/tasks/{_seg(project)}/{_seg(task)}/critical-batch/forecast"
        query = {"loss": list(losses), "targets": list(targets or [])}
        result: ForecastReport = self._get(ForecastReport, path, query)
        return result

    def parallelism(
        self, b_crit: float | None, per_device_batch: float, **options: Unpack[PlanOptions]
    ) -> ParallelismPlan:
        """How many devices pay off at ``b_crit``: each doubling's speed-up and waste (and,
        with ``batch_size``, a verdict on that batch). ``options`` are those of
        ``noisescope.recommend.parallelism_plan`` (``s_min``, ``step_time``, ``min_speedup``,
        ``max_devices``, ``units``, ``batch_size``, ``reference``), computed on the server
        with its defaults; ``reference`` names what ``b_crit`` is, "B_crit" (a sweep fit) or
        "B_simple" (taken as B_crit), for the sentences.

        Raises ``ValueError`` for a ``b_crit`` that is None: a sweep target's ``b_crit`` is None
        unless it is ``determined``, and no plan is built on a number that is not one."""
        unknown = sorted(set(options) - set(PlanOptions.__annotations__))
        if unknown:
            raise TypeError(f"parallelism() got unexpected keyword arguments: {unknown}")
        if b_crit is None:
            raise ValueError(
                "b_crit is None: this target's B_crit is not determined (see its warnings), so "
                "there is no plan to give; check TargetResult.determined first"
            )
        query = {"b_crit": b_crit, "per_device_batch": per_device_batch, **options}
        result: ParallelismPlan = self._get(ParallelismPlan, "/parallelism", query)
        return result

    # -- plumbing -----------------------------------------------------------------------------
    def _get(
        self,
        tp: Any,
        path: str,
        query: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """The answer at ``path`` decoded as ``tp``; ``AnswerError`` when it is no JSON of
        that shape."""
        url, response = self._request(path, query, deadline)
        try:
            value = json.loads(response.body)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            kind = response.header("Content-Type") or "no content type"
            raise AnswerError(
                response.status, f"not JSON ({kind}; {exc}): {_start(response.body)}", url
            ) from None
        try:
            return decoder(tp)(value)
        except Shape:
            pass  # read it again the slow way, for the message that says where and how
        try:
            return decode(tp, value)
        except Shape as exc:
            raise AnswerError(response.status, f"not the answer expected: {exc}", url) from None

    def _request(
        self,
        path: str,
        query: dict[str, Any] | None = None,
        deadline: float | None = None,
        *,
        method: str = "GET",
        body: dict[str, Any] | None = None,
    ) -> tuple[str, Response]:
        """The request's URL and its 2xx answer; ``ApiError`` for any other outcome. The call
        ends by ``deadline`` (monotonic; default ``timeout`` from now). ``body``: sent as
        JSON (a write)."""
        pairs = [
            (k, v)
            for k, value in (query or {}).items()
            for v in (value if isinstance(value, list) else [value])
            if v is not None
        ]
        full = _wire.API_PREFIX + path + (f"?{urlencode(pairs)}" if pairs else "")
        url = self.url + full

        def error(kind: type[ApiError], status: int, detail: str) -> ApiError:
            return kind(status, detail, url, method)

        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        left = deadline - time.monotonic()
        late = f"no whole answer within {self.timeout:g} s (the timeout, Api(timeout=...))"
        if left <= 0:
            raise error(ApiError, 0, late)
        request = Request(
            method,
            full,
            body=None if body is None else json.dumps(body).encode(),
            headers={} if body is None else {"Content-Type": "application/json"},
            deadline_s=left,
            max_answer_bytes=self.max_answer_bytes,
        )
        try:
            response = self._transport.handle_request(request)
        except DeadlinePassed:
            raise error(ApiError, 0, late) from None
        except AnswerTooLarge as exc:
            raise error(AnswerError, exc.status, self._too_large()) from None
        except TransportError as exc:
            raise error(ApiError, 0, str(exc)) from exc
        if len(response.body) > self.max_answer_bytes:  # a transport that does not stop early
            raise error(AnswerError, response.status, self._too_large())
        if response.status == 404:
            raise error(NotFoundError, 404, response.detail())
        if not 200 <= response.status < 300:
            raise error(ApiError, response.status, response.detail())
        if is_html(response):  # a noisescope server answers /api/v1 with data, never a page
            raise error(AnswerError, response.status, self._web_page())
        return url, response

    def _web_page(self) -> str:
        """What a web page for an answer means: the URL is not the server's (the dashboard's,
        most often), said as ``init`` and ``sync`` say it."""
        return (
            f"a web page (text/html), not a noisescope answer: {self.url} is not a noisescope "
            f"server; {server_hint(self.url)}"
        )

    def _write(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        """Send one write (``method`` with ``body`` as JSON) and check its 2xx answer, with
        the errors and the deadline of a read; a write is not retried (none of these is
        harmful to repeat, but the caller decides)."""
        self._request(path, method=method, body=body)

    def _too_large(self) -> str:
        return (
            f"the answer is larger than {self.max_answer_bytes:,} bytes once decoded (the "
            "limit, Api(max_answer_bytes=...)): ask for less (a filter, fewer points), or "
            "raise the limit if the server is yours"
        )


def _seg(value: str) -> str:
    """One URL path segment: slashes and everything else escaped, and a name that is all dots
    (``.``, ``..``) as ``%2E``s: requests (urllib3) removes the dot segments of a path before
    sending it, so ``/tasks/p/../critical-batch`` would reach another route, while the server
    reads ``%2E%2E`` back as the name ``..``."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if value in (".", "..") else quoted


def _start(body: bytes) -> str:
    """What an answer starts with, for a message: ``empty``, or its first 80 bytes."""
    return (
        repr(body[:80].decode("utf-8", "replace")) + ("..." if len(body) > 80 else "")
        if body
        else "empty"
    )
