"""One rule for "B_simple now": the same samples give the same window and the same answer on
``GET /runs/{id}``, the recommendation, the Runs table, ``NoiseTracker`` and the scheduler."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness import AppServer, run_body
from noisescope.estimators import CURRENT_BLOCK
from noisescope.recommend import NoiseTracker
from noisescope.schedule import BatchSizeScheduler
from noisescope_dashboard import _frames, _text
from noisescope_server.models import BLOCK_SIZE

API = "/api/v1"
B_SMALL, B_BIG = 8.0, 32.0


def _run_norms(n: int, *, fade: bool, seed: int) -> list[tuple[float, float]]:
    """Squared norms of a run whose |G|^2 falls 300x as it trains, tr(Sigma) = 50 throughout
    (B_simple grows from ~0.2 to ~50); with ``fade`` the last third has |G|^2 = 0.01 and
    only a lower bound can be known. E|G_B|^2 = |G|^2 + tr(Sigma)/B (docs/science.md eq. 1)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        g_sq = 300.0 * 300.0 ** (-i / n)
        if fade and i > 2 * n // 3:
            g_sq = 0.01
        # non-negative noise with mean 1 (Gamma(4, 1/4)): squared norms scatter about their mean
        out.append(
            (
                (g_sq + 50.0 / B_SMALL) * rng.gammavariate(4.0, 0.25),
                (g_sq + 50.0 / B_BIG) * rng.gammavariate(4.0, 0.25),
            )
        )
    return out


def _columns(norms: list[tuple[float, float]]) -> dict[str, list[Any]]:
    n = len(norms)
    return {
        "seq": list(range(n)),
        "step": list(range(n)),
        "examples": [i * B_BIG for i in range(n)],
        "b_small": [B_SMALL] * n,
        "b_big": [B_BIG] * n,
        "g_small_sq": [small for small, _ in norms],
        "g_big_sq": [big for _, big in norms],
        "loss": [None] * n,
        "lr": [None] * n,
        "time": [1_700_000_000.0 + i for i in range(n)],
        "series": [""] * n,
    }


def test_storage_blocks_are_the_rule_s_blocks() -> None:
    assert BLOCK_SIZE == CURRENT_BLOCK


@pytest.mark.parametrize(
    ("n", "fade"),
    [(3000, False), (3000, True), (12_000, False)],  # raw samples, a bound, storage blocks
)
def test_every_surface_gives_the_one_window(
    server: AppServer, client: TestClient, n: int, fade: bool
) -> None:
    norms = _run_norms(n, fade=fade, seed=n + fade)
    run_id = uuid.uuid4().hex
    assert client.put(f"{API}/runs/{run_id}", json=run_body(batch_size=B_BIG)).status_code < 300
    cols = _columns(norms)
    for lo in range(0, n, 5000):
        part = {name: values[lo : lo + 5000] for name, values in cols.items()}
        r = client.post(f"{API}/runs/{run_id}/samples", json={"columns": part})
        assert r.status_code == 200, r.text
    api = server.api()
    run = api.run(run_id)
    rec = client.get(f"{API}/runs/{run_id}/recommendation").json()["recommendation"]

    tracker = NoiseTracker()
    sched = BatchSizeScheduler(8, min_batch_size=32, max_batch_size=32, warmup_steps=10**9)
    for step, (small, big) in enumerate(norms):
        tracker.log_sample(step, B_SMALL, B_BIG, small, big)
        sched.observe_norms(step, B_SMALL, B_BIG, small, big)
    mine = tracker.current()

    assert run.window_samples == mine.n > 0
    steps = tracker.samples.steps(mine)
    assert steps is not None
    assert (run.window_first_step, run.window_last_step) == tuple(int(s) for s in steps)
    if fade:  # the signal has faded: a lower bound, never a number borrowed from the past
        assert run.b_simple is None and mine.b_simple is None
        assert run.b_simple_lower is not None and mine.lower_bound is not None
        assert run.b_simple_lower == pytest.approx(mine.lower_bound, rel=1e-9)
        assert run.b_simple_lower > 50.0 * 0.5
        assert rec["b_simple"] is None
        assert rec["b_simple_lower"] == pytest.approx(run.b_simple_lower, rel=1e-12)
        assert "at most" in rec["verdict"]
        bound = run.b_simple_lower
        assert sched.noise_scale is not None
        assert abs(sched.noise_scale - bound) <= 0.05 * bound  # re-read at 1% growth
        (row,) = _frames.runs_table([run]).to_dict("records")
        assert row["b_simple"] == _text.at_least(bound) and row["ratio"] == ""
        return
    assert run.b_simple is not None and mine.b_simple is not None
    assert not run.b_simple_trend  # the window's own number
    assert run.b_simple == pytest.approx(mine.b_simple, rel=1e-9)
    iv = mine.interval.b_simple
    assert iv is not None
    assert (run.b_simple_lo, run.b_simple_hi) == pytest.approx((iv.lo, iv.hi), rel=1e-9)
    assert rec["b_simple"] == pytest.approx(run.b_simple, rel=1e-12)
    assert tracker.recommendation().b_simple == pytest.approx(rec["b_simple"], rel=1e-9)
    assert sched.noise_scale is not None
    assert abs(sched.noise_scale - run.b_simple) <= 0.05 * run.b_simple
    (row,) = _frames.runs_table([run]).to_dict("records")
    assert row["b_simple"] == _text.count(run.b_simple)
    # "now": the exact B_simple over the window is what the window reports, within its
    # interval, and nowhere near the run's early average
    g_true = [300.0 * 300.0 ** (-i / n) for i in range(n - int(mine.n), n)]
    exact = 50.0 / (sum(g_true) / len(g_true))
    assert iv.lo <= exact <= iv.hi
    assert run.b_simple > 10 * 50.0 / (sum(300.0 * 300.0 ** (-i / n) for i in range(n)) / n)
    assert math.isfinite(run.b_simple)


def _loss_run(n: int, seed: int) -> list[tuple[float, float, float]]:
    """Squared norms and batch losses of a run whose loss falls ~8x, with |G|^2 = 0.5 L^2 and
    tr(Sigma) = 60 L (B_simple = 120 / L, ~500 at the end): its last tenth cannot pin |G|^2,
    and the window states only a bound; the loss trend over the run states a number."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        loss = 2.0 * (1.0 + 20.0 * i / n) ** -0.7
        g_sq, trace_sigma = 0.5 * loss**2, 60.0 * loss
        out.append(
            (
                (g_sq + trace_sigma / B_SMALL) * rng.gammavariate(4.0, 0.25),
                (g_sq + trace_sigma / B_BIG) * rng.gammavariate(4.0, 0.25),
                loss * (1.0 + 0.05 * rng.gauss(0.0, 1.0)),
            )
        )
    return out


@pytest.mark.parametrize(("n", "seed"), [(3000, 1), (12_000, 0)])  # raw samples, storage blocks
def test_every_surface_gives_the_loss_trend(
    server: AppServer, client: TestClient, n: int, seed: int
) -> None:
    rows = _loss_run(n, seed)
    run_id = uuid.uuid4().hex
    assert client.put(f"{API}/runs/{run_id}", json=run_body(batch_size=B_BIG)).status_code < 300
    cols = _columns([(small, big) for small, big, _ in rows])
    cols["loss"] = [loss for _, _, loss in rows]
    for lo in range(0, n, 5000):
        part = {name: values[lo : lo + 5000] for name, values in cols.items()}
        r = client.post(f"{API}/runs/{run_id}/samples", json={"columns": part})
        assert r.status_code == 200, r.text
    run = server.api().run(run_id)
    rec = client.get(f"{API}/runs/{run_id}/recommendation").json()["recommendation"]
    tracker, window_only = NoiseTracker(), NoiseTracker()
    for step, (small, big, loss) in enumerate(rows):
        tracker.log_sample(step, B_SMALL, B_BIG, small, big, loss=loss)
        window_only.log_sample(step, B_SMALL, B_BIG, small, big)
    mine = tracker.current()
    assert window_only.current().b_simple is None  # the window alone: a bound
    assert mine.trend and mine.b_simple is not None
    assert 0.5 <= mine.b_simple / 508.0 <= 2.0  # 120 / L at the end
    iv = mine.interval.b_simple
    assert iv is not None
    assert run.b_simple == pytest.approx(mine.b_simple, rel=1e-9)
    assert (run.b_simple_lo, run.b_simple_hi) == pytest.approx((iv.lo, iv.hi), rel=1e-9)
    assert run.b_simple_trend and run.window_samples == mine.n
    steps = tracker.samples.steps(mine)
    assert steps is not None
    assert (run.window_first_step, run.window_last_step) == tuple(int(s) for s in steps)
    assert rec["b_simple"] == pytest.approx(run.b_simple, rel=1e-12)
    assert tracker.recommendation().b_simple == pytest.approx(rec["b_simple"], rel=1e-9)
    (row,) = _frames.runs_table([run]).to_dict("records")
    assert row["b_simple"] == _text.count(run.b_simple)
