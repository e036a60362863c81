"""``GET /api/v1/runs/{run_id}/recommendation``: what to do with a run's measured noise scale.

Built from stored samples through the read module (``queries.get_run``: B_simple over the last
``window`` samples with its block-jackknife/Fieller interval, and ``queries.run_events``: the
latest batch-size change) and ``noisescope.recommend.recommend`` (science.md's S-E model and
Pollux's efficiency/goodput, all in ``noisescope.estimators``). The client's ``NoiseTracker``
builds the same ``Recommendation`` locally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from noisescope.estimators import Interval, NoiseScale, NoiseScaleInterval
from noisescope.recommend import Recommendation, recommend
from noisescope.schedule import EVENT_KIND
from noisescope_server import queries
from noisescope_server.api.deps import EngineDep, ReadScope

__all__ = ["RecommendationOut", "router"]

router = APIRouter(tags=["query"])


@dataclass(frozen=True)
class RecommendationOut:
    run_id: str
    units: str
    last_step: int | None
    #: Samples in the window B_simple was computed from (the run's most recent ones).
    window_samples: int
    #: Where ``batch_size`` came from: "query", "event" (latest batch_size event) or "run".
    batch_size_source: str
    recommendation: Recommendation


def _finite_positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise HTTPException(422, f"{name} must be a finite positive number, got {value}")
    return value


def _parse_throughput(items: list[str]) -> dict[float, float]:
    out: dict[float, float] = {}
    for item in items:
        batch, sep, rate = item.partition(":")
        try:
            if not sep:
                raise ValueError
            b, t = float(batch), float(rate)
        except ValueError:
            raise HTTPException(
                422,
                f"throughput entries look like BATCH:PER_SECOND (e.g. throughput=64:1200), "
                f"got {item!r}",
            ) from None
        out[_finite_positive("throughput batch size", b)] = _finite_positive("throughput", t)
    return out


def _batch_in_use(
    run: queries.RunSummary, events: list[queries.EventRow], given: float | None
) -> tuple[float, str]:
    if given is not None:
        return _finite_positive("batch_size", given), "query"
    for event in reversed(events):
        value = event.payload.get("batch_size") if event.kind == EVENT_KIND else None
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            return float(value), "event"
    if run.batch_size is not None and run.batch_size > 0:
        return float(run.batch_size), "run"
    raise HTTPException(
        422,
        "this run has no batch size on record (no batch_size at init, no batch_size event): "
        "pass ?batch_size=N",
    )


@router.get(
    "/runs/{run_id}/recommendation",
    response_model=RecommendationOut,
    summary="Batch-size recommendation from the run's recent B_simple (S-E model, goodput)",
)
def get_recommendation(
    run_id: str,
    engine: EngineDep,
    scope: ReadScope,
    batch_size: Annotated[
        float | None, Query(description="batch in use (default: latest batch_size event, run)")
    ] = None,
    candidates: Annotated[
        list[float] | None, Query(max_length=200, description="batch sizes to predict for")
    ] = None,
    throughput: Annotated[
        list[str] | None,
        Query(max_length=200, description="measured BATCH:PER_SECOND pairs (enables goodput)"),
    ] = None,
    window: Annotated[int, Query(ge=2, le=1_000_000, description="recent samples used")] = (
        queries.RECENT_WINDOW
    ),
    reference_batch: Annotated[float, Query(ge=0, description="B0 of (φ+B0)/(φ+B)")] = 0.0,
) -> RecommendationOut:
    run = queries.get_run(engine, run_id, window=window, project_scope=scope)
    events = queries.run_events(engine, run_id, project_scope=scope)
    batch, source = _batch_in_use(run, events, batch_size)
    cands = [_finite_positive("candidates", c) for c in candidates] if candidates else None
    rates = _parse_throughput(throughput) if throughput else None
    if not math.isfinite(reference_batch):
        raise HTTPException(422, "reference_batch must be finite")
    noise: NoiseScaleInterval | NoiseScale
    if run.b_simple is not None and run.b_simple_lo is not None and run.b_simple_hi is not None:
        noise = NoiseScaleInterval(
            level=queries.LEVEL,
            n=run.window_samples,
            n_blocks=0,
            g_sq=None,
            trace_sigma=None,
            b_simple=Interval(run.b_simple, run.b_simple_lo, run.b_simple_hi),
        )
    else:
        noise = NoiseScale(
            0.0,
            0.0,
            run.window_samples,
            run.b_simple,
            None if run.b_simple else run.b_simple_reason,
        )
    rec = recommend(
        noise, batch, candidates=cands, throughput=rates, reference_batch=reference_batch
    )
    return RecommendationOut(
        run_id=run.uid,
        units=run.units,
        last_step=run.last_step,
        window_samples=run.window_samples,
        batch_size_source=source,
        recommendation=rec,
    )
