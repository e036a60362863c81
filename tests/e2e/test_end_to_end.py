"""The whole path: a torch training loop -> client -> real HTTP server -> SQL -> dashboard reads.

The loop is least squares at a fixed parameter (learning rate 0), so the truth is the closed
form of docs/science.md ("Ground truth for tests"): with x ~ N(0, I_d), y = x.w* + eps,
eps ~ N(0, sigma^2) and delta = w - w*,

    |G|^2 = |delta|^2,   tr(Sigma) = (|delta|^2 + sigma^2) d + |delta|^2,
    B_simple = (d + 1) + d sigma^2 / |delta|^2.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

torch = pytest.importorskip("torch")

import noisescope  # noqa: E402
from harness import ServerProcess  # noqa: E402
from noisescope.torch import GradientNoiseProbe  # noqa: E402
from noisescope_server import queries  # noqa: E402
from tests.support.database import query  # noqa: E402

D, SIGMA = 8, 1.0
MICRO, K, STEPS = 4, 8, 400
DELTA_SQ = 1.0
G_SQ_TRUE = DELTA_SQ
TRACE_SIGMA_TRUE = (DELTA_SQ + SIGMA**2) * D + DELTA_SQ
B_SIMPLE_TRUE = (D + 1) + D * SIGMA**2 / DELTA_SQ  # = 17


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


def _train(url: str) -> str:
    gen = torch.Generator().manual_seed(0)
    w_star = torch.randn(D, generator=gen)
    delta = torch.randn(D, generator=gen)
    delta *= math.sqrt(DELTA_SQ) / delta.norm()
    model = torch.nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta).unsqueeze(0))

    with noisescope.init(
        url=url, project="e2e", task="lsq", name="fixed-w", batch_size=MICRO * K
    ) as run:
        probe = GradientNoiseProbe(model, run, source="micro", micro_loss="mean/k")
        for _ in range(STEPS):
            total = 0.0
            for _ in range(K):
                x = torch.randn(MICRO, D, generator=gen)
                y = x @ w_star + SIGMA * torch.randn(MICRO, generator=gen)
                loss = 0.5 * ((model(x).squeeze(1) - y) ** 2).mean() / K
                loss.backward()
                probe.micro_step(batch_size=MICRO)
                total += loss.item()
            probe.step(loss=total)
            model.zero_grad(set_to_none=True)  # lr 0: the truth stays put
        status = run.finish()
    assert status.sent == STEPS and status.dropped == 0 and status.spooled == 0
    return run.id


def test_training_loop_to_dashboard_reads(server: ServerProcess) -> None:
    run_id = _train(server.url)
    (counts,) = query(
        server.database_url,
        "SELECT count(*), count(DISTINCT seq), min(b_small), max(b_big) FROM sample "
        "JOIN run ON run.id = sample.run_id WHERE run.uid = :uid",
        uid=run_id,
    )
    assert tuple(counts) == (STEPS, STEPS, MICRO, MICRO * K)

    engine = sa.create_engine(server.database_url)  # the server's own read queries take one
    try:
        series = queries.run_series(engine, run_id, max_points=50)
        n = sum(p.n for p in series.points)
        sum_g_sq = sum(p.sum_g_sq for p in series.points)
        sum_trace_sigma = sum(p.sum_trace_sigma for p in series.points)
        estimate = noisescope.estimators.NoiseScale.from_sums(sum_g_sq, sum_trace_sigma, n)
        assert n == STEPS
        assert estimate.g_sq == pytest.approx(G_SQ_TRUE, rel=0.15)
        assert estimate.trace_sigma == pytest.approx(TRACE_SIGMA_TRUE, rel=0.10)
        assert estimate.b_simple == pytest.approx(B_SIMPLE_TRUE, rel=0.15)

        (summary,) = queries.list_runs(engine, project="e2e")
        assert summary.uid == run_id and summary.n_samples == STEPS
        assert summary.b_simple is not None
        assert summary.b_simple_lo is not None and summary.b_simple_hi is not None
        assert summary.b_simple_lo < B_SIMPLE_TRUE < summary.b_simple_hi
    finally:
        engine.dispose()
