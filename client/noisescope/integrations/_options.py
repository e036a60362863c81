"""What the framework callbacks take: ``CallbackOptions``, the keyword arguments both share,
and ``BranchOptions``, their opt-in branching in one object (docs/branching.md).

Torch-free, so that ``noisescope.integrations`` names them without importing a framework.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from noisescope._transport import Transport  # (loaded by ``import noisescope`` already)

if TYPE_CHECKING:
    from torch import Tensor, nn

__all__ = [
    "PLAN_KEYS",
    "PROBE_KEYS",
    "RUN_KEYS",
    "BranchOptions",
    "CallbackOptions",
    "InitOptions",
    "check_options",
]

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


class InitOptions(TypedDict, total=False):
    """``noisescope.init``'s keyword arguments, which a callback passes on to the run it starts
    (a key left out: ``init``'s default, or the framework's). Held to ``init``'s signature and
    ``Settings`` by a test."""

    url: str | None
    project: str | None
    task: str | None
    name: str | None
    config: dict[str, Any] | None
    tags: list[str] | None
    batch_size: float | None
    units: str | None
    run_id: str | None
    token: str | None
    mode: str | None
    dir: str | os.PathLike[str] | None
    flush_timeout: float | None
    rank: int | None
    world_size: int | None
    all_ranks: bool | None
    quiet: bool | None
    dashboard_url: str | None
    transport: Transport | None
    parent_run_id: str | None
    branch_step: int | None
    resume: bool | str
    # the advanced ``Settings`` fields ``init`` takes as further keywords
    batch_max: int
    batch_interval: float
    memory_max: int
    spool_max_bytes: int
    request_timeout: float
    backoff_base: float
    backoff_max: float
    heartbeat_interval: float
    gzip_min_bytes: int
    resume_orphans: bool


class CallbackOptions(InitOptions, total=False):
    """The keyword arguments of both framework callbacks (``HuggingFaceCallback(run,
    **options)``, ``LightningCallback(run, ..., **options)``): ``noisescope.init``'s, for the
    run a callback starts, and the probe's own below. One declaration for both, so that
    neither can drift from the other; editors and type checkers read it as keywords (PEP 692).

    ``project``, ``task``, ``name`` and ``tags`` name the run (task and name default to what
    the framework knows); ``units`` is "examples" or "tokens" (default: the units of a run
    passed in, else the framework's). Any other ``noisescope.init`` argument (``url``,
    ``token``, ``mode``, ``dir``, ...) is passed on as given.
    """

    #: Also log one series per layer (see ``GradientNoiseProbe``).
    layers: bool | Mapping[str, Any]
    #: Measure every n-th optimizer step only.
    every: int
    #: "all" (each micro-batch's gradient is a G_small: most precise) or "first" (only the
    #: first micro-batch's: the least overhead, a noisier tr(Sigma)). See ``GradientNoiseProbe``.
    small_batches: Literal["all", "first"]
    #: Opt-in branching (docs/branching.md), a ``BranchOptions``.
    branch: BranchOptions | None


#: ``noisescope.init`` arguments a callback reads itself: it names the run, with defaults of
#: its framework's for those not given.
RUN_KEYS = ("project", "task", "name", "tags", "units")
#: The callbacks' own keys, never passed on to ``noisescope.init``.
PROBE_KEYS = tuple(
    key for key in CallbackOptions.__annotations__ if key not in InitOptions.__annotations__
)


def check_options(callback: str, options: Mapping[str, Any]) -> None:
    """A ``TypeError`` for a keyword neither the callback nor ``noisescope.init`` takes, when
    the callback is made: passed on, it would stop the measurement only at the first training
    step."""
    refuse_branch_keywords(callback, options)
    unknown = sorted(set(options) - CallbackOptions.__optional_keys__)
    if unknown:
        hints = [
            f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)
            for key in unknown
            for close in [difflib.get_close_matches(key, CallbackOptions.__optional_keys__, 1)]
        ]
        raise TypeError(
            f"{callback} got unknown keyword argument(s) {', '.join(hints)}: it takes the keys "
            "of noisescope.integrations.CallbackOptions (noisescope.init's arguments, and "
            f"{', '.join(PROBE_KEYS)})"
        )
