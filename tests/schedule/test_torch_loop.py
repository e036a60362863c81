"""The documented training loop: probe (micro-batches) -> scheduler -> accumulation steps and lr."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from noisescope.recommend import NoiseTracker  # noqa: E402
from noisescope.schedule import BatchSizeScheduler  # noqa: E402
from noisescope.torch import GradientNoiseProbe  # noqa: E402


def test_loop_grows_accumulation_and_the_probe_measures_the_new_batch() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    d = 16
    w_true = torch.randn(d, generator=gen)
    model = torch.nn.Linear(d, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = NoiseTracker()
    probe = GradientNoiseProbe(model, tracker, source="micro", micro_loss="mean/k")
    sched = BatchSizeScheduler(
        micro_batch_size=4,
        max_batch_size=256,
        base_lr=0.01,
        lr_rule="linear",
        max_lr=0.05,
        warmup_steps=20,
        cooldown_steps=20,
    )
    b_bigs = []
    for _ in range(250):
        k = sched.accum_steps
        for _ in range(k):
            x = torch.randn(4, d, generator=gen)
            y = x @ w_true + 0.5 * torch.randn(4, generator=gen)
            loss = 0.5 * ((model(x).squeeze(-1) - y) ** 2).mean()
            (loss / k).backward()
            probe.micro_step(batch_size=4)
        sample = probe.step(loss=float(loss.detach()), lr=sched.lr)
        assert sample is not None
        b_bigs.append(sample.b_big)
        assert sample.b_big == pytest.approx(sched.batch_size)
        sched.apply_lr(opt)
        opt.step()
        opt.zero_grad()
        sched.observe(sample)
    # the noise scale rose as the loss fell, and the batch followed it by accumulation
    assert sched.decisions
    assert sched.batch_size > 8
    assert all(d.direction == "grow" for d in sched.decisions)
    assert opt.param_groups[0]["lr"] == pytest.approx(sched.lr)
    # near the noise floor the signal fades: a number, or at least a lower bound above the
    # batch the schedule started from
    rec = tracker.recommendation()
    assert rec.b_simple is not None or (
        rec.b_simple_lower is not None and rec.b_simple_lower > b_bigs[0]
    )
