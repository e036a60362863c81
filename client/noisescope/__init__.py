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

import dataclasses
import inspect
import typing

from noisescope import branch, estimators, forecast, sweep
from noisescope._api import Api, ApiError, NotFoundError, RecommendationResult
from noisescope._config import Settings
from noisescope._results import (
    BranchPointResult,
    EventRow,
    ParallelismPlan,
    ParallelismRow,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    SeriesPoint,
    TaskSummary,
    to_frame,
)
from noisescope._run import Run, init
from noisescope._status import Status
from noisescope._sync import sync
from noisescope._transport import HTTPTransport, Request, Response, Transport, TransportError
from noisescope.recommend import NoiseTracker, Recommendation
from noisescope.schedule import BatchDecision, BatchSizeScheduler

__version__ = "0.1.0"

__all__ = [
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


def _report_as_public(obj: object) -> None:
    """Show ``obj`` as ``noisescope.X`` (reprs, tracebacks, docs), as httpx does.

    ``typing.get_type_hints`` (``Api``'s decoder) and pydantic (the server's response models,
    from dataclass fields' ``type``) resolve a class's string annotations in the module named by
    ``__module__``, so they are resolved first, in the module that wrote them; functions resolve
    theirs through ``__globals__`` and need nothing.
    """
    if isinstance(obj, type):
        own = inspect.get_annotations(obj)
        if own:
            hints = typing.get_type_hints(obj, include_extras=True)
            obj.__annotations__ = {name: hints[name] for name in own}
            for field in dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ():
                field.type = hints[field.name]
        obj.__module__ = __name__
    elif inspect.isfunction(obj):
        obj.__module__ = __name__


for _name in __all__:
    _report_as_public(globals()[_name])
del _name
