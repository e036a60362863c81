"""``GET /api/v1/runs/{run_id}/recommendation``: what to do with a run's measured noise scale.

Built from the run's summary (``queries.get_run``): its *current* B_simple with its interval
(``estimators.current_noise_scale``, the same window the Runs table and the Run page show) and the
batch in use (latest batch-size event, else the run's batch size); then
``noisescope.recommend.recommend`` (docs/science.md's S-E model and Pollux's efficiency/goodput).
The client's ``NoiseTracker`` builds the same ``Recommendation`` locally.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from noisescope.protocol import RecommendationResult, RunSummary
from noisescope.recommend import recommend
from noisescope_server import queries
from noisescope_server.api.deps import EngineDep, ReadScope
from noisescope_server.errors import value_errors_as_bad_input

__all__ = ["router"]

router = APIRouter(tags=["query"])


def _parse_throughput(items: list[str]) -> dict[float, float]:
    """``BATCH:PER_SECOND`` pairs as numbers; ``recommend`` checks their values."""
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
        out[b] = t
    return out


def _batch_in_use(run: RunSummary, given: float | None) -> tuple[float, str]:
    if given is not None:
        return given, "query"
    if run.batch_in_use is not None and run.batch_in_use_source is not None:
        return run.batch_in_use, run.batch_in_use_source
    raise HTTPException(
        422,
        "this run has no batch size on record (no batch_size at init, no batch_size event): "
        "pass ?batch_size=N",
    )


@router.get(
    "/runs/{run_id}/recommendation",
    response_model=RecommendationResult,
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
    reference_batch: Annotated[float, Query(ge=0, description="B0 of (φ+B0)/(φ+B)")] = 0.0,
) -> RecommendationResult:
    run = queries.get_run(engine, run_id, project_scope=scope)
    batch, source = _batch_in_use(run, batch_size)
    rates = _parse_throughput(throughput) if throughput else None
    with value_errors_as_bad_input():  # recommend() checks every number it is given
        rec = recommend(
            run,
            batch,
            candidates=candidates or None,
            throughput=rates,
            reference_batch=reference_batch,
            units=run.units,
        )
    return RecommendationResult(
        run_id=run.uid,
        units=run.units,
        last_step=run.last_step,
        window_samples=run.window_samples,
        batch_size_source=source,
        recommendation=rec,
    )
