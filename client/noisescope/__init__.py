"""noisescope: track the gradient noise scale (critical batch size) of training runs.

import noisescope
run = noisescope.init(project="digits", task="mlp", name="bs64", batch_size=64)
run.log_sample(step, b_small, b_big, g_small_sq, g_big_sq)   # usually via a torch probe
run.log(step=step, loss=loss)
run.finish()

api = noisescope.Api()             # read back what the server made of it (as the dashboard does)
api.runs(project="digits")[0].b_simple
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from noisescope import branch, estimators, forecast, protocol, sweep
from noisescope._config import Settings
from noisescope._public import report_all_as_public, report_as_public
from noisescope._results import to_frame
from noisescope._run import Run, init
from noisescope._status import Status
from noisescope._sync import sync
from noisescope._transport import HTTPTransport, Request, Response, Transport, TransportError
from noisescope.recommend import NoiseTracker, Recommendation
from noisescope.schedule import BatchDecision, BatchSizeScheduler

if TYPE_CHECKING:
    from noisescope._api import AnswerError, Api, ApiError, NotFoundError

__version__ = "0.1.0"

# The read API's answers (what ``Api`` returns, and what users annotate with), under the names
# ``protocol`` gives them: it is their one list, the contract's.
BranchPointResult = protocol.BranchPointResult
EventRow = protocol.EventRow
ParallelismPlan = protocol.ParallelismPlan
ParallelismRow = protocol.ParallelismRow
RecommendationResult = protocol.RecommendationResult
RunBranches = protocol.RunBranches
RunSeries = protocol.RunSeries
RunSummary = protocol.RunSummary
SeriesInfo = protocol.SeriesInfo
SeriesPoint = protocol.SeriesPoint
TaskSummary = protocol.TaskSummary

#: The read client, loaded on first use: a training job that only writes, and the server (which
#: imports ``noisescope.protocol``), never load it.
_READ_CLIENT = ("AnswerError", "Api", "ApiError", "NotFoundError")

__all__ = [
    "AnswerError",
    "Api",
    "ApiError",
    "BatchDecision",
    "BatchSizeScheduler",
    "BranchPointResult",
    "EventRow",
    "HTTPTransport",
    "NoiseTracker",
    "NotFoundError",
    "ParallelismPlan",
    "ParallelismRow",
    "Recommendation",
    "RecommendationResult",
    "Request",
    "Response",
    "Run",
    "RunBranches",
    "RunSeries",
    "RunSummary",
    "SeriesInfo",
    "SeriesPoint",
    "Settings",
    "Status",
    "TaskSummary",
    "Transport",
    "TransportError",
    "__version__",
    "branch",
    "estimators",
    "forecast",
    "init",
    "sweep",
    "sync",
    "to_frame",
]


def __getattr__(name: str) -> object:
    if name in _READ_CLIENT:
        from noisescope import _api

        for public in _READ_CLIENT:  # all at once: each shows as noisescope.X from then on
            value = getattr(_api, public)
            report_as_public(value, __name__)
            globals()[public] = value
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


report_all_as_public(__name__, lazy=_READ_CLIENT)
