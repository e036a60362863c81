"""The per-sample sums of a short run, in Python over its samples as the read seam gives them
(``queries._samples``: rows and decoded chunks, the per-sample estimates derived there, as no
table stores them): what ``_series`` and ``_buckets`` sum in SQL over ``sample`` rows where
``_samples.summed_in_sql`` allows (a run without chunks, on SQLite), in the same shape and by
the same rules, for the other runs (compacted ones; every run on PostgreSQL). Long runs read
``sample_block`` either way; only a run short enough to be read sample by sample comes
here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from noisescope_server.queries._samples import sample_rows

_FINE = ("step", "g_sq_est", "trace_sigma_est", "loss", "lr", "examples", "b_big")


def fine_columns(
    conn: Connection,
    run_id: int,
    series: str,
    x: str,
    n_fine: int,
    x_min: Any,
    x_max: Any,
) -> list[Sequence[Any]]:
    """``_series._fine_columns`` of the sample path: (fine index, n, sum_g, sum_s, n_loss,
    sum_loss, n_lr, sum_lr, x_lo, x_hi, step_lo, step_hi, examples_hi, b_big_max) in fine
    index order, the step columns being the x columns along steps."""
    if x_min is None:
        return []
    span = float(x_max) - float(x_min)
    scale = (n_fine / (span * (1.0 + 1e-9))) if span > 0 else 0.0
    low = float(x_min)
    groups: dict[int, list[Any]] = {}
    for row in sample_rows(conn, run_id, (x, *_FINE), series=series):
        xv, step, g, s, loss, lr, examples, b_big = row
        if xv is None:
            continue
        key = math.floor((float(xv) - low) * scale)
        acc = groups.get(key)
        if acc is None:
            groups[key] = [1, g, s, 0, None, 0, None, xv, xv, step, step, examples, b_big]
            acc = groups[key]
            _add_optional(acc, 3, loss)
            _add_optional(acc, 5, lr)
            continue
        acc[0] += 1
        acc[1] += g
        acc[2] += s
        _add_optional(acc, 3, loss)
        _add_optional(acc, 5, lr)
        acc[7] = min(acc[7], xv)
        acc[8] = max(acc[8], xv)
        acc[9] = min(acc[9], step)
        acc[10] = max(acc[10], step)
        if examples is not None:
            acc[11] = examples if acc[11] is None else max(acc[11], examples)
        acc[12] = max(acc[12], b_big)
    if not groups:
        return []
    keys = sorted(groups)
    columns: list[Sequence[Any]] = [keys]
    columns += [[groups[k][i] for k in keys] for i in range(13)]
    if x == "step":  # as the SQL path: the step columns are the x columns
        columns[10:12] = columns[8:10]
    return columns


def _add_optional(acc: list[Any], at: int, value: Any) -> None:
    """Count a nullable value at ``acc[at]`` and sum it at ``acc[at + 1]`` (SQL's count and
    sum: a sum of no values is null)."""
    if value is None:
        return
    acc[at] += 1
    acc[at + 1] = value if acc[at + 1] is None else acc[at + 1] + value


_BUCKET = (
    "series", "step", "g_sq_est", "trace_sigma_est", "loss", "lr", "examples", "time", "b_big"
)  # fmt: skip


def bucket_rows(
    conn: Connection, run_id: int, uid: str, series: Sequence[str], max_points: int
) -> list[tuple[Any, ...]]:
    """``_buckets.bucket_sums``'s SQL rows for one run read from its samples: (uid, series,
    bucket, n, sum_g_sq, sum_trace_sigma, step_lo, step, examples, time, loss, lr,
    batch_size, n_loss), buckets splitting each series' step range evenly."""
    wanted = set(series)
    by_series: dict[str, list[tuple[Any, ...]]] = {}
    for row in sample_rows(conn, run_id, _BUCKET):
        if row[0] in wanted:
            by_series.setdefault(row[0], []).append(row)
    out: list[tuple[Any, ...]] = []
    for name in sorted(by_series):
        rows = by_series[name]
        low = min(r[1] for r in rows)
        span = max(r[1] for r in rows) - low
        times = [r[7] for r in rows if r[7] is not None]
        t0 = min(times) if times else None
        groups: dict[int, list[tuple[Any, ...]]] = {}
        for r in rows:
            groups.setdefault((r[1] - low) * max_points // (span + 1), []).append(r)
        for bucket in sorted(groups):
            members = groups[bucket]
            losses = [r[4] for r in members if r[4] is not None]
            lrs = [r[5] for r in members if r[5] is not None]
            examples = [r[6] for r in members if r[6] is not None]
            ends = [r[7] for r in members if r[7] is not None]
            out.append(
                (
                    uid,
                    name,
                    bucket,
                    len(members),
                    sum(r[2] for r in members),
                    sum(r[3] for r in members),
                    min(r[1] for r in members),
                    max(r[1] for r in members),
                    max(examples) if examples else None,
                    max(ends) - t0 if ends and t0 is not None else None,
                    sum(losses) / len(losses) if losses else None,
                    sum(lrs) / len(lrs) if lrs else None,
                    max(r[8] for r in members),
                    len(losses),
                )
            )
    return out
