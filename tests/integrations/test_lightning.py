"""The Lightning callback, end to end against a real server, on one process and under DDP.

The module under test records |G_big|^2 itself in ``on_before_optimizer_step`` (before Lightning
clips; ``gradient_clip_val`` is tiny, so a post-clip reading could not match).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import httpx
import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor

from harness import QUIET_LIGHTNING, ServerProcess
from noisescope.integrations import LightningCallback
from tests.integrations._lit import DigitsMLP, digits_loader
from tests.integrations._subprocess import pythonpath as _pythonpath
from tests.integrations.conftest import Stored, assert_same_samples, stored_run
from tests.support.dynamo import compiled_counts

ROOT = Path(__file__).resolve().parents[2]


def _trainer(callbacks: list[Any], **overrides: Any) -> pl.Trainer:
    settings: dict[str, Any] = {
        "max_epochs": 2,
        "accumulate_grad_batches": 3,
        "gradient_clip_val": 0.01,
        "accelerator": "cpu",
        "devices": 1,
        "callbacks": callbacks,
        **QUIET_LIGHTNING,
    }
    settings.update(overrides)
    return pl.Trainer(**settings)


def test_accumulation_samples_reach_the_server(server: ServerProcess, tmp_path: Path) -> None:
    # 80 examples in micro-batches of 16: 5 per epoch, so cycles of 3 and then 2 micro-batches
    torch.manual_seed(0)
    module = DigitsMLP()
    callback = LightningCallback(
        project="integrations", task="digits", url=server.url, dir=tmp_path, quiet=True
    )
    _trainer([callback]).fit(module, digits_loader(16, n=80))
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)

    assert stored.run["units"] == "examples"
    assert stored.run["batch_size"] == 48
    config = stored.run["config"]
    config = json.loads(config) if isinstance(config, str) else config
    assert config["hparams"]["lr"] == 0.05
    assert config["trainer"]["accumulate_grad_batches"] == 3
    assert [s["step"] for s in stored.samples] == [0, 1, 2, 3]
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(16, 48), (16, 32)] * 2
    assert len(module.big_norms_sq) == 4
    for sample, recorded in zip(stored.samples, module.big_norms_sq, strict=True):
        k_used = sample["b_big"] / 16
        # Lightning divides by K=3 even when the cycle holds 2: its gradient is (k/3) G_big
        assert sample["g_big_sq"] * (k_used / 3) ** 2 == pytest.approx(recorded, rel=1e-5)
        assert math.isfinite(sample["g_small_sq"])
        assert sample["g_small_sq"] > sample["g_big_sq"] * 0.5
        assert sample["loss"] == pytest.approx(math.log(10), rel=0.2)
        assert sample["lr"] == 0.05


def test_small_batches_first_measures_the_first_micro_batch_only(
    server: ServerProcess, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    module = DigitsMLP()
    torch.manual_seed(0)
    reference = DigitsMLP()  # the same initial weights
    x, y = next(iter(digits_loader(16, n=48)))
    torch.nn.functional.cross_entropy(reference.net(x), y).backward()
    # cast: .grad is Tensor | None; the backward above set every parameter's
    first_sq = sum(
        float(cast(Tensor, p.grad).double().square().sum()) for p in reference.parameters()
    )

    callback = LightningCallback(
        project="integrations",
        task="digits",
        small_batches="first",
        url=server.url,
        dir=tmp_path,
        quiet=True,
    )
    _trainer([callback], max_epochs=1).fit(module, digits_loader(16, n=48))
    assert callback.run is not None
    (sample,) = stored_run(server, callback.run.id).samples
    assert (sample["b_small"], sample["b_big"]) == (16, 48)
    assert sample["g_small_sq"] == pytest.approx(first_sq, rel=1e-5)
    assert sample["g_big_sq"] == pytest.approx(module.big_norms_sq[0], rel=1e-5)
    with pytest.raises(ValueError, match="small_batches"):
        LightningCallback(small_batches="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="units"):
        LightningCallback(units="pixels")
    # a typo fails here, not at the first training step (unmeasured)
    with pytest.raises(TypeError, match=r"'projet' \(did you mean 'project'\?\)"):
        LightningCallback(projet="p")  # type: ignore[call-arg]


class _CallsItself(DigitsMLP):
    """``training_step`` calls the module (``self(x)``): under Lightning's compile, which
    compiles ``forward`` and ``training_step``, the module call and its hooks are traced."""

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)


def test_compiled_module_logs_the_eager_samples_without_a_graph_break(
    server: ServerProcess, tmp_path: Path
) -> None:
    """``trainer.fit(torch.compile(module))`` as Lightning documents it (inductor): the
    accumulation test's seeded training, 2 epochs of cycles of 3 and 2 micro-batches, logs
    the eager samples (float32: rel 1e-6) and dynamo reports no graph break."""
    samples = {}
    for compile_ in (False, True):
        torch.manual_seed(0)
        module = _CallsItself()
        callback = LightningCallback(
            project="integrations", task="digits", url=server.url, dir=tmp_path, quiet=True
        )
        with compiled_counts() as counts:
            _trainer([callback]).fit(
                torch.compile(module) if compile_ else module,  # type: ignore[arg-type]
                digits_loader(16, n=80),
            )
        assert callback.run is not None
        samples[compile_] = stored_run(server, callback.run.id).samples
    assert module._compiler_ctx is not None  # Lightning compiled forward and training_step
    assert counts.graphs >= 1
    assert counts.graph_breaks == {}, counts.graph_breaks
    assert len(samples[False]) == 4
    assert_same_samples(samples[False], samples[True], rel=1e-6)


class _CrashingMLP(DigitsMLP):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if batch_idx == 2:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_a_second_fit_starts_a_new_run_and_a_crash_marks_it_failed(
    server: ServerProcess, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    callback = LightningCallback(
        project="integrations", task="digits", url=server.url, dir=tmp_path, quiet=True
    )
    _trainer([callback], max_epochs=1).fit(DigitsMLP(), digits_loader(16, n=48))
    first = callback.run
    assert first is not None and first.finished
    with pytest.raises(RuntimeError, match="boom"):
        _trainer([callback], max_epochs=1).fit(_CrashingMLP(), digits_loader(16, n=48))
    second = callback.run
    assert second is not None and second.finished and second.id != first.id
    assert callback.probe is None  # detached: the model trains on untouched
    assert stored_run(server, first.id).run["status"] == "finished"
    assert stored_run(server, second.id).run["status"] == "failed"


def test_fp16_loss_scale_is_divided_out(server: ServerProcess, tmp_path: Path) -> None:
    """AMP with a GradScaler (x1024): measured before Lightning un-scales, divided by 1024^2."""
    from lightning.pytorch.plugins import MixedPrecision

    torch.manual_seed(0)
    module = DigitsMLP()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    callback = LightningCallback(url=server.url, dir=tmp_path, quiet=True)
    trainer = _trainer(
        [callback], max_epochs=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)]
    )
    trainer.fit(module, digits_loader(16, n=96))
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert len(stored.samples) == 2
    # the module reads the gradient after Lightning un-scaled it
    for sample, recorded in zip(stored.samples, module.big_norms_sq, strict=True):
        assert sample["g_big_sq"] == pytest.approx(recorded, rel=1e-4)


def _notices(server: ServerProcess, run_id: str) -> list[str]:
    """The callback's notices (the probe may also say which source it measures with)."""
    events = httpx.get(f"{server.url}/api/v1/runs/{run_id}/events", timeout=30).json()
    notices = [e["payload"]["message"] for e in events if e["kind"] == "notice"]
    return [n for n in notices if not n.startswith("measuring with")]


def test_a_callback_that_stops_measuring_says_why_on_the_runs_page(
    server: ServerProcess, tmp_path: Path
) -> None:
    calls = [0]

    def items(batch: Any) -> float:
        calls[0] += 1
        if calls[0] >= 4:  # after the run has started: it has a page to explain
            raise ValueError("unreadable batch")
        return float(len(batch[0]))

    callback = LightningCallback(url=server.url, dir=tmp_path, quiet=True, batch_size_fn=items)
    with pytest.warns(UserWarning, match="not measuring this run"):
        _trainer([callback], max_epochs=1).fit(DigitsMLP(), digits_loader(16, n=192))
    assert callback.run is not None
    assert _notices(server, callback.run.id) == [
        "not measuring this run: could not read the micro-batch: ValueError('unreadable batch')"
    ]


def _fit_params(callbacks: list[Any]) -> dict[str, Tensor]:
    torch.manual_seed(3)
    module = DigitsMLP()
    _trainer(callbacks, max_epochs=1).fit(module, digits_loader(16, n=96, shuffle=True))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_parameters_identical_with_and_without_the_callback(
    server: ServerProcess, tmp_path: Path
) -> None:
    callback = LightningCallback(url=server.url, dir=tmp_path, quiet=True, layers=True)
    with_cb = _fit_params([callback])
    without = _fit_params([])
    assert callback.run is not None
    assert callback.run.status().sent > 0
    assert with_cb.keys() == without.keys()
    assert [k for k in with_cb if not torch.equal(with_cb[k], without[k])] == []


def _fit_on_two_ranks(
    server: ServerProcess, tmp_path: Path, script: str
) -> tuple[dict[str, Any], Stored]:
    """Runs a 2-process script of this folder against ``server``: rank 0's output and its run."""
    out = tmp_path / "ranks.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script)), server.url, str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result, stored_run(server, result["run_id"])


@pytest.mark.slow
def test_ddp_two_gloo_processes(server: ServerProcess, tmp_path: Path) -> None:
    """Lightning's ``ddp`` strategy, 2 CPU processes: micro-batch per rank vs all-reduced."""
    result, stored = _fit_on_two_ranks(server, tmp_path, "_lightning_ddp.py")
    # per rank: micro-batches of 8, 2 per step; 2 ranks: B_big = 8 * 2 * 2
    assert [s["step"] for s in stored.samples] == [0, 1, 2]
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(8, 32)] * 3
    assert stored.run["batch_size"] == 32
    # rank 0's module read the all-reduced gradient before clipping: the same |G_big|^2
    for sample, recorded in zip(stored.samples, result["big_norms_sq"], strict=True):
        assert sample["g_big_sq"] == pytest.approx(recorded, rel=1e-5)
        assert sample["g_small_sq"] > 0
    # only rank 0 sent: one run, no duplicate samples
    assert len(stored.samples) == 3


def test_model_parallel_fsdp2_two_gloo_processes(server: ServerProcess, tmp_path: Path) -> None:
    """Lightning's ModelParallelStrategy with ``fully_shard`` in ``configure_model`` (FSDP2),
    2 CPU processes: the probe finds the sharded parameters itself; each rank's micro-batch
    is a G_small, the reduce-scattered gradient (its shards summed over ranks) G_big."""
    result, stored = _fit_on_two_ranks(server, tmp_path, "_lightning_fsdp2.py")
    assert [s["step"] for s in stored.samples] == [0, 1, 2]
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(8, 32)] * 3
    for sample, recorded in zip(stored.samples, result["big_norms_sq"], strict=True):
        assert sample["g_big_sq"] == pytest.approx(recorded, rel=1e-5)
        assert sample["g_small_sq"] > 0
