"""The paper's other domains (experiments/domains.py): each task's reduced sweep gives a
determined B_crit and a B_simple, and each trainer measures what it says it does."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

from experiments import analysis
from experiments.__main__ import TASK_NAMES
from experiments.domains import CARTPOLE_MAX_RETURN, CartPoleReinforce, DigitsCNN, DigitsVAE
from experiments.runner import Progress, Stale, run_sweep
from experiments.tasks import TASKS


def _needs_gymnasium(name: str) -> None:
    if name == "cartpole":
        pytest.importorskip("gymnasium")  # the RL task's optional dependency only


def test_every_task_is_named_by_the_command() -> None:
    assert set(TASK_NAMES) == set(TASKS)


@pytest.mark.parametrize("name", ["digits_cnn", "digits_vae", "cartpole"])
def test_the_reduced_sweep_determines_b_crit_and_measures_b_simple(
    name: str, tmp_path: Path
) -> None:
    _needs_gymnasium(name)
    spec = TASKS[name].sized(quick=True)
    records = run_sweep(spec, tmp_path, None, Progress(io.StringIO()))
    report = analysis.analyse(
        analysis.to_sweep_runs(records), spec.loss_targets, task=name, units=spec.units
    )
    determined = [t for t in report.targets if t.determined]
    assert determined, [t.warnings for t in report.targets]
    for t in determined:
        assert t.b_crit is not None and min(spec.batch_sizes) <= t.b_crit <= max(spec.batch_sizes)
        assert t.b_simple is not None and t.b_simple > 0, t.b_simple_reason


def test_the_vae_starts_near_64_ln_2_nats_and_its_loss_is_the_negative_elbo() -> None:
    """At initialisation the decoder's logits are near 0, so each pixel costs about ln 2 nats
    and the KL term is small: the negative ELBO of 64 pixels starts near 64 ln 2 = 44.4."""
    vae = DigitsVAE(seed=0, sampler_seed=1, k=4)
    first = vae.eval_loss()
    assert abs(first - 64 * math.log(2)) < 3
    assert vae.eval_loss() == first  # the evaluation's noise is fixed
    for _ in range(30):
        vae.step(64, lr=0.01)
    assert vae.eval_loss() < first - 5


def test_the_conv_net_batch_gradient_is_the_mean_of_its_micro_batches() -> None:
    cnn = DigitsCNN(seed=0, sampler_seed=1, k=4)
    result = cnn.step(32, lr=0.0)
    assert (result.b_small, result.b_big) == (8.0, 32.0)
    # |mean of k vectors|² ≤ mean of their |·|², with equality only when all are equal.
    assert 0 < result.g_big_sq < result.g_small_sq


def test_cartpole_counts_episodes_and_its_loss_is_the_return_short_of_500() -> None:
    _needs_gymnasium("cartpole")
    agent = CartPoleReinforce(seed=0, sampler_seed=1, k=4, eval_episodes=8)
    states, actions, alive, lengths = agent._play(6, env_seed=3, gen=torch.Generator())
    assert states.shape[1] == actions.shape[1] == alive.shape[1] == 6
    # Each episode's return is its length: one reward per step while it is alive.
    assert alive.sum(dim=0).tolist() == lengths.tolist()
    assert all(1 <= n <= CARTPOLE_MAX_RETURN for n in lengths)
    result = agent.step(8, lr=0.01)
    assert (result.b_small, result.b_big) == (2.0, 8.0)
    assert 0 <= result.loss < CARTPOLE_MAX_RETURN
    loss = agent.eval_loss()
    assert loss == agent.eval_loss()  # fixed random numbers: the same policy, the same loss


def test_runs_of_an_earlier_version_of_a_task_are_archived_on_the_server() -> None:
    """The server's sweep of a task is the run cache's: a run this cache logged that it no
    longer holds (its task's trainer changed since) is archived, restorably; the cached ones
    stay, and so do the task's runs this cache did not log (issue 56 item 1: a run logged by
    hand, or from another run cache, is never archived)."""
    from experiments.runner import CACHE_CONFIG_KEY, archive_stale
    from harness import AppServer, columns, run_body
    from noisescope import protocol

    spec = TASKS["cartpole"]
    out = Path("unused")
    kept, stale, by_hand, elsewhere = "a" * 32, "b" * 32, "c" * 32, "d" * 32
    configs = {
        kept: {CACHE_CONFIG_KEY: str(out.resolve())},
        stale: {CACHE_CONFIG_KEY: str(out.resolve())},
        by_hand: {"lr": 0.1},
        elsewhere: {CACHE_CONFIG_KEY: "/some/other/checkout/experiments/runs/full"},
    }
    with AppServer() as server:
        with server.client() as http:
            for uid, config in configs.items():
                body = run_body(spec.project, spec.name, config=config)
                put = http.put(f"{protocol.API_PREFIX}/runs/{uid}", json=body)
                assert put.status_code == 201
                body = {"columns": columns(10)}
                assert http.post(f"{protocol.API_PREFIX}/runs/{uid}/samples", json=body).is_success
        api = server.api()
        record = {"run_id": kept, "batch_size": 4, "lr": 0.04, "seed": 0}
        assert archive_stale([record], spec, api, out) == Stale(archived=1, foreign=2)
        left = {r.uid for r in api.runs(project=spec.project, task=spec.name)}
        assert left == {kept, by_hand, elsewhere}
        assert api.run(stale).archived_at is not None
        assert archive_stale([record], spec, api, out) == Stale(0, 2)  # nothing more to do


def test_a_quick_sweep_logs_to_a_project_of_its_own() -> None:
    """``--quick`` never shares a project with the full sweep (whose runs it would otherwise
    enter or archive, issue 56 item 1)."""
    from experiments.runner import PROJECT

    for spec in TASKS.values():
        assert spec.project == PROJECT
        assert spec.sized(True).project == PROJECT + "-quick"
        assert spec.sized(False).project == PROJECT


def test_each_frontier_point_is_placed_among_the_rates_tried_at_its_batch_size() -> None:
    """Interior (slower rates on both sides), at the stability edge (the next larger rate
    diverged), or at an open edge of what was tried: the page's "frontier points" table."""
    from types import SimpleNamespace

    from experiments.report import frontier_edges, tried_rates

    def record(batch: float, lr: float, diverged: bool = False) -> dict[str, object]:
        losses = [2.0, 1.0, 0.5] if not diverged else [2.0, 1.0, 9.0]
        return {
            "batch_size_units": batch,
            "lr": lr,
            "status": "reached",  # the curve alone says it diverged
            "evals": {"step": [0.0, 10.0, 20.0], "loss": losses},
        }

    records = [
        *(record(4, lr) for lr in (0.1, 0.2, 0.4)),  # 0.2: interior
        record(8, 0.2), record(8, 0.4), record(8, 0.8, diverged=True),  # 0.4: stability edge
        record(16, 0.2), record(16, 0.4),  # 0.4: grid top
        record(32, 0.2), record(32, 0.4),  # 0.2: grid bottom
    ]  # fmt: skip

    def point(batch: float, lr: float) -> SimpleNamespace:
        return SimpleNamespace(batch_size=float(batch), lr=lr)

    target = SimpleNamespace(points=[point(4, 0.2), point(8, 0.4), point(16, 0.4), point(32, 0.2)])
    edges = frontier_edges(tried_rates(records), target)  # type: ignore[arg-type]
    assert edges == {
        "interior": [4.0],
        "stability edge": [8.0],
        "grid top": [16.0],
        "grid bottom": [32.0],
    }
