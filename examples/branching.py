"""Measure the local critical batch size of a digits MLP by branching (docs/branching.md).

    python examples/branching.py                       # ~1 minute on one CPU core
    python examples/branching.py --url http://127.0.0.1:8765   # and log the runs there

The parent run trains at batch 16 with SGD; at each ``--branch-at`` step, ``noisescope.branch``
trains short continuations at 16, 32, ..., 256 on the same 2,048 examples (lr scaled linearly),
3 seeds each, and reports the largest batch whose loss stays within ε = 1% of batch 16's.
The parent run then goes on from exactly where it was.

With ``--url`` the parent is a run of its own (project ``examples``, task
``digits-branching``), its noise scale measured by a ``GradientNoiseProbe`` (detached while
the branches train: they are no samples of the parent), and every branch is a run linked to it,
so the parent's Run page draws the local critical batch at each branch step beside its B_simple.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

import noisescope
from noisescope import branch
from noisescope.torch import GradientNoiseProbe


class DigitsTrainer:
    """The four things noisescope.branch needs: save, restore, train a branch, evaluate."""

    def __init__(self, seed: int = 0) -> None:
        data = load_digits()
        self.x = torch.tensor(data.data, dtype=torch.float32) / 16.0
        self.y = torch.tensor(data.target, dtype=torch.long)
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.gen = torch.Generator().manual_seed(seed)

    def step(self, idx: torch.Tensor, lr: float, probe: GradientNoiseProbe | None = None) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        if probe is not None:  # the parent's steps are measured, the branches' are not
            probe.micro_step(batch_size=len(idx))
            probe.step(loss=loss.item(), lr=lr)
        self.opt.step()

    # --- noisescope.branch.Branchable
    def save(self) -> Any:
        return copy.deepcopy((self.model.state_dict(), self.opt.state_dict()))

    def restore(self, state: Any) -> None:
        model_state, opt_state = copy.deepcopy(state)
        self.model.load_state_dict(model_state)
        self.opt.load_state_dict(opt_state)

    def train(self, b: branch.Branch, run: Any) -> None:
        # Seed j draws the same examples at every batch size: paired seeds, a tighter interval.
        draws = torch.randint(
            0, len(self.y), (b.examples,), generator=torch.Generator().manual_seed(b.seed)
        )
        for i in range(b.steps):
            self.step(draws[i * b.batch_size : (i + 1) * b.batch_size], b.lr)

    def evaluate(self) -> float:
        with torch.no_grad():
            return float(F.cross_entropy(self.model(self.x), self.y))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="log the branch runs to this server")
    p.add_argument("--steps", type=int, default=400, help="parent run length")
    p.add_argument("--branch-at", default="20,200", help="comma-separated parent steps")
    p.add_argument("--store", default="branches", help="where finished branches are kept")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    branch_at = {int(s) for s in args.branch_at.split(",")}

    trainer = DigitsTrainer()
    batch, lr = 16, 0.1
    parent = probe = log = None
    if args.url:
        parent = noisescope.init(
            args.url,
            project="examples",
            task="digits-branching",
            name=f"parent b={batch}",
            batch_size=batch,
            config={"lr": lr, "optimizer": "SGD"},
        )
        probe = GradientNoiseProbe(trainer.model, parent, source="per_example")
        # one line for the parent (its link, above); none per branch run
        log = branch.LogTo(
            "examples", "digits-branching", args.url, name="branch", init_kwargs={"quiet": True}
        )
    for step in range(args.steps + 1):
        if step in branch_at:
            if probe is not None:
                probe.remove()  # the branches' backward passes are no samples of the parent
            plan = branch.plan(
                step=step,
                batch_size=batch,
                lr=lr,
                multipliers=(1, 2, 4, 8, 16),
                budget=2048,
                lr_rule="linear",
                seeds=args.seeds,
                epsilon=0.01,
                parent_run_id=None if parent is None else parent.id,
            )
            result = branch.run(plan, trainer, f"{args.store}/step{step}", log=log)
            if probe is not None and parent is not None:
                measured, probe = (
                    probe.step_count,
                    GradientNoiseProbe(trainer.model, parent, source="per_example"),
                )
                probe.step_count = measured
            local = result.local
            assert local is not None
            if local.b_crit is None:
                found = f"> {local.b_crit_lo:.0f}"
            else:
                lo, hi = local.b_crit_lo or 0.0, local.b_crit_hi or float("inf")
                found = f"{local.b_crit:.0f} [{lo:.0f}, {hi:.0f}]"
            trained = len(result.results) - result.reused
            print(
                f"step {step}: loss {result.parent_loss:.3f}, local critical batch {found} "
                f"({trained} branches trained, {result.reused} reused)"
            )
        if step < args.steps:
            idx = torch.randint(0, len(trainer.y), (batch,), generator=trainer.gen)
            trainer.step(idx, lr, probe)
    final = trainer.evaluate()
    if parent is not None:
        parent.log(step=args.steps, eval_loss=final)
        parent.finish()
    print(f"parent finished at step {args.steps}, loss {final:.3f}")


if __name__ == "__main__":
    main()
