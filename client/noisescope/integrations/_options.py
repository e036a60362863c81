"""``BranchOptions``: the framework callbacks' opt-in branching, one object (docs/branching.md).

Torch-free, so that ``noisescope.integrations`` names it without importing a framework.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = ["PLAN_KEYS", "BranchOptions", "refuse_branch_keywords"]

#: Plan settings the callbacks pass on to ``noisescope.branch.plan``.
PLAN_KEYS = ("multipliers", "budget", "lr_rule", "seeds", "epsilon", "level")

#: The keyword arguments the callbacks took before ``branch=BranchOptions(...)``.
_OLD_KEYWORDS = ("every", "eval", "loss", "store", "first", "plan")


@dataclass(frozen=True)
class BranchOptions:
    """Branch every ``every`` optimizer steps from inside the framework's training loop
    (``HuggingFaceCallback(branch=...)``, ``LightningCallback(branch=...)``): at each branch
    step ``noisescope.branch`` trains short continuations at batch sizes b, 2b, ... from the
    trainer's state on its own train dataset, evaluates them and puts the state back.

    Args:
        every: branch every N optimizer steps (an integer >= 1).
        eval: the batches every branch is evaluated on (a list or a DataLoader, in the form
            the model takes); neither Trainer hands its evaluation data to callbacks.
        loss: ``fn(model, batch) -> loss`` for branch training and evaluation; default: the
            model's own ``loss`` output (Hugging Face), ``training_step(batch, 0)``, its tensor
            or its ``"loss"`` (Lightning).
        store: where finished branches are kept, one folder per run id and branch step;
            default: ``<output_dir>`` (Hugging Face) or ``<default_root_dir>`` (Lightning)
            ``/noisescope-branches``.
        first: the first branch step (default: ``every``).
        plan: ``noisescope.branch.plan`` settings (``multipliers``, ``budget``, ``lr_rule``,
            ``seeds``, ``epsilon``, ``level``); ``branch.plan``'s defaults otherwise.

    Checked when made: a ``ValueError`` says what to change.
    """

    every: int
    eval: Iterable[Any]
    loss: Callable[[nn.Module, Any], Tensor] | None = None
    store: str | os.PathLike[str] | None = None
    first: int | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        every = self.every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"BranchOptions: every must be an integer >= 1, got {every!r}")
        if self.eval is None:
            raise ValueError(
                "BranchOptions needs eval: the batches (a DataLoader or a list, in the form "
                "the model's forward takes) every branch is evaluated on"
            )
        first = self.first
        if first is not None and (
            isinstance(first, bool) or not isinstance(first, int) or first < 1
        ):
            raise ValueError(f"BranchOptions: first must be an integer >= 1, got {first!r}")
        unknown = sorted(set(self.plan) - set(PLAN_KEYS))
        if unknown:
            raise ValueError(f"BranchOptions: plan keys must be among {PLAN_KEYS}, got {unknown}")
        # frozen all the way: the plan is a read-only copy of the mapping given
        object.__setattr__(self, "plan", MappingProxyType(dict(self.plan)))


def refuse_branch_keywords(callback: str, init_kwargs: Mapping[str, Any]) -> None:
    """A ``TypeError`` naming the replacement for the old ``branch_*`` keyword arguments
    (which would otherwise reach ``noisescope.init`` as unknown arguments)."""
    old = [f"branch_{name}" for name in _OLD_KEYWORDS if f"branch_{name}" in init_kwargs]
    if old:
        given = ", ".join(f"{name[len('branch_') :]}=..." for name in old)
        raise TypeError(
            f"{callback} takes branch=noisescope.integrations.BranchOptions({given}) instead "
            f"of {', '.join(old)}"
        )
