"""A run's current B_simple: its trailing window, read as raw samples or 64-sample blocks."""

from __future__ import annotations

from typing import Any, TypedDict

from sqlalchemy import Connection, bindparam, select

from noisescope.estimators import CURRENT_RAW_LIMIT, RunBlocks, current_noise_scale
from noisescope_server.models import BLOCK_SIZE, WHOLE_MODEL, SampleBlock
from noisescope_server.queries._common import LEVEL, fetch_tuples
from noisescope_server.queries._samples import last_rows

# The rule reads a window as raw samples up to CURRENT_RAW_LIMIT and as storage blocks beyond,
# as ``estimators.NoiseSamples`` does in a training loop, so the same samples give the same
# answer (tests/server/test_current_rule.py checks BLOCK_SIZE == CURRENT_BLOCK).


class CurrentFields(TypedDict):
    """A run's current window (``estimators.current_window``) and where it lies: the fields of
    ``RunSummary`` it fills, under their names and types there (``RunSummary(..., **fields)``;
    tests/server/test_current_fields.py holds the two together). Listed as the window reads: its
    extent, the means over it, then B_simple."""

    window_samples: int
    window_first_step: int | None
    window_last_step: int | None
    #: Why the window stopped growing before its interval was narrow (``CurrentNoiseScale``).
    window_limit: str | None
    g_sq: float | None
    trace_sigma: float | None
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    b_simple_reason: str | None
    #: While ``b_simple`` is None: a lower bound on it, where one is known.
    b_simple_lower: float | None
    #: Whether ``b_simple`` comes from the loss trend (``CurrentNoiseScale.trend``).
    b_simple_trend: bool


def no_current(reason: str) -> CurrentFields:
    """The fields of a run whose current window is not read, with why."""
    return CurrentFields(
        b_simple=None,
        b_simple_lo=None,
        b_simple_hi=None,
        b_simple_reason=reason,
        g_sq=None,
        trace_sigma=None,
        window_samples=0,
        window_first_step=None,
        window_last_step=None,
        b_simple_lower=None,
        window_limit=None,
        b_simple_trend=False,
    )


def read_current(conn: Connection, run_id: int, n_samples: int) -> CurrentFields:
    """The current B_simple of a run (``estimators.current_noise_scale``): windows of up to
    ``CURRENT_RAW_LIMIT`` samples are read as raw samples, longer ones as 64-sample blocks,
    so either way the interval has its full count of blocks and the read stays small. Rows
    come as plain DBAPI tuples: a window is up to thousands of them per run, on every list."""
    steps_of: dict[float, tuple[int, int]] = {}  # a window's steps, by its sample count

    def trailing(target: int) -> tuple[list[float], list[float], list[float]]:
        if target <= CURRENT_RAW_LIMIT:
            rows = _trailing_samples(conn, run_id, min(target, n_samples))
            block_n = [1.0] * len(rows)
            lo_steps = hi_steps = [r[2] for r in rows]
        else:
            rows = _trailing_blocks(conn, run_id, target)
            block_n = [float(r[0]) for r in rows]
            rows = [r[1:] for r in rows]
            lo_steps, hi_steps = [r[2] for r in rows], [r[3] for r in rows]
        if rows:
            steps_of[sum(block_n)] = (int(min(lo_steps)), int(max(hi_steps)))
        return block_n, [float(r[0]) for r in rows], [float(r[1]) for r in rows]

    def whole_run() -> RunBlocks | None:
        """The run with its training loss for the loss trend, read as ``NoiseSamples`` reads
        it: raw samples up to ``CURRENT_RAW_LIMIT``, else every storage block."""
        if n_samples <= CURRENT_RAW_LIMIT:
            columns = ("g_sq_est", "trace_sigma_est", "loss", "step")
            raw = last_rows(conn, run_id, columns, n_samples, series="")
            rows = [(1, g, s, int(loss is not None), loss or 0.0, st, st) for g, s, loss, st in raw]
        else:
            rows = fetch_tuples(conn, _WHOLE_BLOCKS, {"run_id": run_id})
        if not rows:
            return None
        # the trend's window is a trailing count of samples: its steps, from the end
        held = 0.0
        for row in reversed(rows):
            held += float(row[0])
            steps_of.setdefault(held, (int(row[5]), int(rows[-1][6])))
        return (
            [float(r[0]) for r in rows],
            [float(r[1]) for r in rows],
            [float(r[2]) for r in rows],
            [float(r[3]) for r in rows],
            [float(r[4] or 0.0) for r in rows],
        )

    window = current_noise_scale(float(n_samples), trailing, level=LEVEL, whole_run=whole_run)
    steps = steps_of.get(window.n)  # the rule may have read one doubling further back
    used, interval = window.n, window.interval
    b_iv, g_iv, s_iv = interval.b_simple, interval.g_sq, interval.trace_sigma
    return CurrentFields(
        b_simple=None if b_iv is None else b_iv.value,
        b_simple_lo=None if b_iv is None else b_iv.lo,
        b_simple_hi=None if b_iv is None else b_iv.hi,
        b_simple_reason=interval.reason if b_iv is None else None,
        g_sq=None if g_iv is None else g_iv.value,
        trace_sigma=None if s_iv is None else s_iv.value,
        window_samples=int(used),
        window_first_step=steps[0] if steps and used else None,
        window_last_step=steps[1] if steps and used else None,
        b_simple_lower=window.lower_bound,
        window_limit=window.limit,
        b_simple_trend=window.trend,
    )


# Built once with bound parameters: a run list reads every run's window, and building and
# compiling the statement per run cost about a third of the reads' CPU (100 runs).
_BLOCKS = (
    select(
        SampleBlock.n,
        SampleBlock.sum_g_sq,
        SampleBlock.sum_trace_sigma,
        SampleBlock.step_min,
        SampleBlock.step_max,
    )
    .where(SampleBlock.run_id == bindparam("run_id"), SampleBlock.series_id == WHOLE_MODEL)
    .order_by(SampleBlock.block.desc())
    .limit(bindparam("count"))
    .offset(bindparam("skip"))
)


# Every whole-model block of a run, oldest first, for the loss trend (a run beyond
# CURRENT_RAW_LIMIT samples whose window states no number): a 1M-sample run is ~16k rows.
_WHOLE_BLOCKS = (
    select(
        SampleBlock.n,
        SampleBlock.sum_g_sq,
        SampleBlock.sum_trace_sigma,
        SampleBlock.n_loss,
        SampleBlock.sum_loss,
        SampleBlock.step_min,
        SampleBlock.step_max,
    )
    .where(SampleBlock.run_id == bindparam("run_id"), SampleBlock.series_id == WHOLE_MODEL)
    .order_by(SampleBlock.block)
)


def _trailing_samples(conn: Connection, run_id: int, count: int) -> list[Any]:
    """The last ``count`` whole-model samples (|𝒢|², 𝒮, step), oldest first.

    (Summing them into the interval's blocks in SQL, with a window function, measured slower
    on SQLite than reading the rows: a fetch of 1,000 rows is about a millisecond.)"""
    return last_rows(conn, run_id, ("g_sq_est", "trace_sigma_est", "step"), count, series="")


def _trailing_blocks(conn: Connection, run_id: int, target: int) -> list[Any]:
    """The run's last 64-sample blocks that hold at least ``target`` samples, oldest first.

    Read newest first, a page at a time: a block holds at most ``BLOCK_SIZE`` samples, so the
    window needs at least ceil(missing / BLOCK_SIZE) more blocks, and a long run's older
    blocks are never fetched."""
    fetched: list[Any] = []
    count = 0
    while count < target:
        need = -(-(target - count) // BLOCK_SIZE)
        page = fetch_tuples(conn, _BLOCKS, {"run_id": run_id, "count": need, "skip": len(fetched)})
        for block in page:
            if count >= target:
                break
            fetched.append(block)
            count += int(block[0])
        if len(page) < need:  # the run has no more blocks
            break
    return fetched[::-1]
