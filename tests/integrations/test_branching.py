"""``branch=BranchOptions(every=N, ...)`` on both callbacks: noisescope.branch from inside the
framework's loop.

The parent run must go on exactly as without branching (parameters, optimizer and scheduler
state, every later step's loss, and the probe's samples), the branches are runs linked to it on
the server, and a sweep killed half-way resumes without redoing its finished branches.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from transformers import Trainer, TrainingArguments, default_data_collator

import noisescope
from harness import QUIET_HF, QUIET_LIGHTNING, ServerProcess
from noisescope.integrations import BranchOptions, HuggingFaceCallback, LightningCallback
from tests.integrations._lit import DigitsMLP, digits_loader
from tests.integrations._tiny import ByteLMDataset, RecordingCollator, tiny_gpt2
from tests.integrations.conftest import stored_run
from tests.integrations.test_hf import DigitsDataset, MeanLossClassifier
from tests.support.database import query

PLAN = {"multipliers": (1, 2, 4), "budget": 32, "seeds": 2, "lr_rule": "sqrt"}


def _branch_runs(server: ServerProcess, parent: str) -> list[tuple[str, int, float]]:
    sql = "SELECT uid, branch_step, batch_size FROM run WHERE parent_uid = :p"
    rows = query(server.database_url, sql, p=parent)
    return sorted((r.uid, r.branch_step, r.batch_size) for r in rows)


def _state(model: nn.Module, optimizer: Any) -> tuple[dict[str, Tensor], dict[str, Any]]:
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return params, optimizer.state_dict()


def _assert_same_state(a: Any, b: Any) -> None:
    (params_a, opt_a), (params_b, opt_b) = a, b
    assert [k for k in params_a if not torch.equal(params_a[k], params_b[k])] == []
    assert opt_a["param_groups"] == opt_b["param_groups"]
    for key, state in opt_a["state"].items():
        for name, value in state.items():
            other = opt_b["state"][key][name]
            assert torch.equal(value, other) if isinstance(value, Tensor) else value == other


# --- Hugging Face ---------------------------------------------------------------------------


def _eval_batches() -> list[dict[str, Tensor]]:
    data = DigitsDataset(96)
    return [default_data_collator([data[i] for i in range(64, 96)])]


def _hf(
    server: ServerProcess, tmp_path: Path, **callback_kwargs: Any
) -> tuple[Trainer, HuggingFaceCallback]:
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=0.02,  # AdamW with a linear decay: optimizer and scheduler state both
        logging_steps=1,
        **QUIET_HF,
    )
    callback = HuggingFaceCallback(
        project="branching", task="digits", url=server.url, dir=tmp_path / "spool", quiet=True,
        **callback_kwargs,
    )  # fmt: skip
    model = MeanLossClassifier()
    trainer = Trainer(model=model, args=args, train_dataset=DigitsDataset(64), callbacks=[callback])
    return trainer, callback


def _hf_record(server: ServerProcess, trainer: Trainer, callback: HuggingFaceCallback) -> Any:
    assert trainer.model is not None and callback.run is not None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    samples = [(s["step"], s["g_small_sq"], s["g_big_sq"]) for s in stored_run(
        server, callback.run.id
    ).samples]  # fmt: skip
    assert trainer.lr_scheduler is not None
    lr = trainer.lr_scheduler.get_last_lr()
    return _state(trainer.model, trainer.optimizer), losses, samples, lr


def test_hf_branching_leaves_the_parent_run_as_it_was(
    server: ServerProcess, tmp_path: Path
) -> None:
    trainer, callback = _hf(
        server, tmp_path / "a", branch=BranchOptions(every=2, eval=_eval_batches(), plan=PLAN)
    )
    with pytest.warns(UserWarning, match="no branches at step 6: the lr is 0.0"):
        trainer.train()  # the linear decay reaches 0 at the last step
    plain, plain_callback = _hf(server, tmp_path / "b")
    plain.train()
    (state, losses, samples, lr) = _hf_record(server, trainer, callback)
    (plain_state, plain_losses, plain_samples, plain_lr) = _hf_record(server, plain, plain_callback)
    _assert_same_state(state, plain_state)
    assert len(losses) == 6 and losses == plain_losses  # every step after a branch point too
    assert len(samples) == 6 and samples == plain_samples  # the probe measured the parent only
    assert lr == plain_lr

    sweeps = callback.branch_sweeps
    assert [s.plan.step for s in sweeps] == [2, 4]
    assert all(s.local is not None and not s.missing and not s.notes for s in sweeps)
    assert sweeps[0].plan.base_batch_size == 8
    # the branches trained (the Trainer's AcceleratedOptimizer stepped), each batch size its own way
    for sweep in sweeps:
        losses = {r.batch_size: r.loss for r in sweep.results if r.seed == 0}
        assert sweep.parent_loss is not None and all(v < sweep.parent_loss for v in losses.values())
        assert len(set(losses.values())) == 3
    assert callback.run is not None
    assert sweeps[0].plan.parent_run_id == callback.run.id
    # 2 branch points x 3 batch sizes x 2 seeds, each a run linked to the parent
    runs = _branch_runs(server, callback.run.id)
    assert len(runs) == 12
    assert sorted({(step, b) for _, step, b in runs}) == [
        (s, b) for s in (2, 4) for b in (8.0, 16.0, 32.0)
    ]
    stores = sorted(p.name for p in (tmp_path / "a" / "out" / "noisescope-branches").iterdir())
    assert stores == [callback.run.id]


class _Killed(Exception):
    pass


def _model_loss(model: nn.Module, batch: Any) -> Tensor:
    loss: Tensor = model(**batch)["loss"]
    return loss


class _CountingLoss:
    """A branch loss counting training calls; raises once ``kill_at`` is reached."""

    def __init__(self, kill_at: int | None = None, loss: Any = _model_loss) -> None:
        self.kill_at = kill_at
        self.loss = loss
        self.train_calls = 0

    def __call__(self, model: nn.Module, batch: Any) -> Tensor:
        if torch.is_grad_enabled():
            if self.train_calls == self.kill_at:
                raise _Killed
            self.train_calls += 1
        loss: Tensor = self.loss(model, batch)
        return loss


def test_hf_a_killed_branch_sweep_resumes(server: ServerProcess, tmp_path: Path) -> None:
    # budget 32: a branch at b=8 trains 4 steps of 2 micro-batches (8 loss calls), b=16 2 steps
    # of 4 and b=32 1 step of 8: every branch makes 8 calls; killed in the 4th branch
    store = tmp_path / "store"
    options = BranchOptions(every=4, eval=_eval_batches(), plan=PLAN, store=store)
    kw: dict[str, Any] = {"run_id": "hf-branch-resume"}
    killed = _CountingLoss(kill_at=8 * 3 + 5)
    trainer, callback = _hf(server, tmp_path / "a", branch=replace(options, loss=killed), **kw)
    with pytest.raises(_Killed):
        trainer.train()
    assert callback.run is not None
    callback.run.finish("failed")  # the Trainer does not end a crashed training's callbacks
    (finished,) = list(store.iterdir())
    assert len(list((finished / "step4").glob("branch-*.json"))) == 3

    resumed_loss = _CountingLoss()
    trainer, callback = _hf(
        server, tmp_path / "b", branch=replace(options, loss=resumed_loss), **kw
    )
    trainer.train()
    (sweep,) = callback.branch_sweeps
    assert sweep.reused == 3 and not sweep.missing and not sweep.notes
    assert resumed_loss.train_calls == 8 * 3  # only the 3 missing branches trained

    fresh_loss = _CountingLoss()
    options = replace(options, store=tmp_path / "fresh", loss=fresh_loss)
    kw.update(run_id="hf-branch-fresh")
    trainer, fresh = _hf(server, tmp_path / "c", branch=options, **kw)
    trainer.train()
    assert fresh_loss.train_calls == 8 * 6
    assert sweep.local == fresh.branch_sweeps[0].local


def test_hf_language_model_branches_count_the_runs_tokens(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A token-unit run branches in nominal tokens, as its own batch size is: the server
    compares the branch runs with the parent (it leaves out branches in other units)."""
    collate = RecordingCollator()
    eval_data = ByteLMDataset(8, seed=5)
    eval_batches = [collate([eval_data[i] for i in range(8)])]
    callback = HuggingFaceCallback(
        project="branching", url=server.url, dir=tmp_path / "spool", quiet=True,
        branch=BranchOptions(
            every=2, eval=eval_batches, plan={"multipliers": (1, 2), "seeds": 2, "lr_rule": "sqrt"}
        ),
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-3,
        lr_scheduler_type="constant", **QUIET_HF,
    )  # fmt: skip
    trainer = Trainer(
        model=tiny_gpt2(), args=args, train_dataset=ByteLMDataset(48),
        data_collator=collate, callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    assert callback.run is not None
    run_tokens = callback.run.batch_size  # nominal: 8 full-length first-batch sequences
    assert run_tokens is not None and run_tokens > 8 * 6 and run_tokens % 8 == 0
    (sweep,) = callback.branch_sweeps
    assert sweep.plan.units == "tokens"
    assert sweep.plan.base_batch_size == run_tokens
    (point,) = noisescope.Api(server.url).branches(callback.run.id).points
    assert (point.step, point.n_runs) == (2, 4)
    assert point.reason is None or "other units" not in point.reason
    assert point.batch_sizes == [run_tokens, 2 * run_tokens]


def test_hf_setups_it_cannot_branch_are_refused(server: ServerProcess, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs eval"):
        HuggingFaceCallback(branch=BranchOptions(every=2, eval=None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="every must be"):
        HuggingFaceCallback(branch=BranchOptions(every=0, eval=[]))
    with pytest.raises(ValueError, match="plan keys"):
        HuggingFaceCallback(branch=BranchOptions(every=2, eval=[], plan={"budjet": 8}))
    for first in (0, -3, 1.5):
        with pytest.raises(ValueError, match="first must be an integer >= 1"):
            BranchOptions(every=2, eval=[], first=first)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"branch=noisescope.integrations.BranchOptions\(every="):
        HuggingFaceCallback(branch_every=2, branch_eval=[])  # type: ignore[call-arg]  # the old keywords
    trainer, _ = _hf(server, tmp_path, branch=BranchOptions(every=2, eval=_eval_batches()))
    trainer.args.bf16 = True
    with pytest.raises(RuntimeError, match=r"mixed precision.*supports one process"):
        trainer.train()


# --- Lightning ------------------------------------------------------------------------------


class _ScheduledMLP(DigitsMLP):
    """The digits MLP with input dropout (the global RNG is part of the parent's state) and a
    step-interval scheduler, recording each training step's loss."""

    # set by _lit after fit: the parent's state and learning rate at the end
    trainer_state: tuple[dict[str, Tensor], dict[str, Any]]
    lr_after: float

    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.losses: list[float] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        x = nn.functional.dropout(x, 0.2, training=self.training)
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _lit(
    server: ServerProcess, tmp_path: Path, **callback_kwargs: Any
) -> tuple[_ScheduledMLP, LightningCallback]:
    torch.manual_seed(0)
    module = _ScheduledMLP()
    callback = LightningCallback(
        project="branching", task="digits-lit", url=server.url, dir=tmp_path, quiet=True,
        **callback_kwargs,
    )  # fmt: skip
    trainer = pl.Trainer(
        max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=0.5, accelerator="cpu",
        devices=1, default_root_dir=tmp_path, callbacks=[callback], **QUIET_LIGHTNING,
    )  # fmt: skip
    trainer.fit(module, digits_loader(8, n=64, shuffle=True))  # 8 micro-batches, 4 steps
    module.trainer_state = _state(module, trainer.optimizers[0])
    module.lr_after = trainer.optimizers[0].param_groups[0]["lr"]
    return module, callback


def _lit_eval() -> list[tuple[Tensor, Tensor]]:
    loader = digits_loader(64, n=192)
    return [b for i, b in enumerate(loader) if i == 2]


def test_lightning_branching_leaves_the_parent_run_as_it_was(
    server: ServerProcess, tmp_path: Path
) -> None:
    module, callback = _lit(
        server, tmp_path / "a",
        branch=BranchOptions(
            every=2, eval=_lit_eval(), plan={**PLAN, "budget": 64}, loss=_mlp_loss
        ),
    )  # fmt: skip
    plain, plain_callback = _lit(server, tmp_path / "b")
    _assert_same_state(module.trainer_state, plain.trainer_state)
    assert module.lr_after == plain.lr_after == 0.025
    assert len(module.losses) == 8 and module.losses == plain.losses
    assert callback.run is not None and plain_callback.run is not None
    samples = stored_run(server, callback.run.id).samples
    plain_samples = stored_run(server, plain_callback.run.id).samples
    key = ("step", "b_small", "b_big", "g_small_sq", "g_big_sq", "loss")
    assert len(samples) == 4
    assert [[s[k] for k in key] for s in samples] == [[s[k] for k in key] for s in plain_samples]

    sweeps = callback.branch_sweeps
    assert [s.plan.step for s in sweeps] == [2, 4]
    assert sweeps[0].plan.base_batch_size == 16
    assert all(s.local is not None and not s.missing and not s.notes for s in sweeps)
    runs = _branch_runs(server, callback.run.id)
    assert len(runs) == 12
    assert sorted({(step, b) for _, step, b in runs}) == [
        (s, b) for s in (2, 4) for b in (16.0, 32.0, 64.0)
    ]


def _mlp_loss(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    assert isinstance(m.net, nn.Module)  # DigitsMLP's Sequential (typed Tensor | Module)
    return nn.functional.cross_entropy(m.net(batch[0]), batch[1])


def test_lightning_a_killed_branch_sweep_resumes(server: ServerProcess, tmp_path: Path) -> None:
    # budget 64 at base 16 in micro-batches of 8: 8 loss calls a branch; killed in the 4th
    store = tmp_path / "store"
    options = BranchOptions(every=2, eval=_lit_eval(), plan={**PLAN, "budget": 64}, store=store)
    kw: dict[str, Any] = {"run_id": "lit-branch-resume"}
    killed = _CountingLoss(8 * 3 + 5, _mlp_loss)
    with pytest.raises(_Killed):
        _lit(server, tmp_path / "a", branch=replace(options, loss=killed), **kw)
    assert len(list((store / "lit-branch-resume" / "step2").glob("branch-*.json"))) == 3
    resumed_loss = _CountingLoss(loss=_mlp_loss)
    _, callback = _lit(server, tmp_path / "b", branch=replace(options, loss=resumed_loss), **kw)
    first, second = callback.branch_sweeps
    assert (first.reused, second.reused) == (3, 0) and not first.notes
    assert resumed_loss.train_calls == 8 * (3 + 6)  # step 2's missing 3 branches, step 4's 6
    fresh_loss = _CountingLoss(loss=_mlp_loss)
    options = replace(options, store=tmp_path / "fresh", loss=fresh_loss)
    kw.update(run_id="lit-branch-fresh")
    _, fresh = _lit(server, tmp_path / "c", branch=options, **kw)
    assert [s.local for s in callback.branch_sweeps] == [s.local for s in fresh.branch_sweeps]


def test_lightning_token_units_branch_in_the_runs_nominal_tokens(
    server: ServerProcess, tmp_path: Path
) -> None:
    _, callback = _lit(
        server, tmp_path, units="tokens", batch_size_fn=lambda batch: 3 * len(batch[0]),
        branch=BranchOptions(every=4, eval=_lit_eval(), plan={**PLAN, "budget": 192}),
    )  # fmt: skip
    assert callback.run is not None and callback.run.batch_size == 3 * 16
    (sweep,) = callback.branch_sweeps
    assert (sweep.plan.units, sweep.plan.base_batch_size) == ("tokens", 48)
    (point,) = noisescope.Api(server.url).branches(callback.run.id).points
    assert (point.step, point.n_runs, point.batch_sizes) == (4, 6, [48.0, 96.0, 192.0])


def test_lightning_setups_it_cannot_branch_are_refused(
    server: ServerProcess, tmp_path: Path
) -> None:
    callback = LightningCallback(
        url=server.url, dir=tmp_path, quiet=True, branch=BranchOptions(every=1, eval=_lit_eval())
    )
    trainer = pl.Trainer(
        max_steps=2, accelerator="cpu", devices=1, precision="bf16-mixed", callbacks=[callback],
        **QUIET_LIGHTNING,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"bf16-mixed.*supports one process on one device"):
        trainer.fit(DigitsMLP(), digits_loader(8, n=32))
    # DDP is refused before anything branches (checked on the Trainer as built: no processes)
    from noisescope.integrations._lightning import _check_branchable

    ddp = pl.Trainer(strategy="ddp", accelerator="cpu", devices=1, logger=False)
    with pytest.raises(RuntimeError, match=r"under DDPStrategy.*no DDP, FSDP, DeepSpeed"):
        _check_branchable(ddp, DigitsMLP())
