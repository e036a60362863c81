"""Measure the local critical batch size of a digits MLP by branching (docs/branching.md).

    python examples/branching.py                       # ~1 minute on one CPU core
    python examples/branching.py --url http://127.0.0.1:8000   # and log every branch run

The parent run trains at batch 16 with SGD; at each ``--branch-at`` step, ``noisescope.branch``
trains short continuations at 16, 32, ..., 256 on the same 2,048 examples (lr scaled linearly),
3 seeds each, and reports the largest batch whose loss stays within ε = 1% of batch 16's.
The parent run then goes on from exactly where it was.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

from noisescope import branch


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

    def step(self, idx: torch.Tensor, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad()
        F.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
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
    log = branch.LogTo("examples", "digits-branching", args.url) if args.url else None
    for step in range(args.steps + 1):
        if step in branch_at:
            plan = branch.plan(
                step=step,
                batch_size=batch,
                lr=lr,
                multipliers=(1, 2, 4, 8, 16),
                budget=2048,
                lr_rule="linear",
                seeds=args.seeds,
                epsilon=0.01,
            )
            result = branch.run(plan, trainer, f"{args.store}/step{step}", log=log)
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
            trainer.step(torch.randint(0, len(trainer.y), (batch,), generator=trainer.gen), lr)
    print(f"parent finished at step {args.steps}, loss {trainer.evaluate():.3f}")


if __name__ == "__main__":
    main()
