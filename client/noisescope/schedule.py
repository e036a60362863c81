"""A batch-size schedule driven by the measured gradient noise scale.

The noise scale B_simple grows as the loss falls (docs/science.md, "Ground truth" and "Findings"),
so the batch that wastes neither steps nor examples grows during a run. ``BatchSizeScheduler``
keeps the micro-batch fixed (memory stays fixed) and raises the number of gradient-accumulation
micro-batches so that the effective batch follows ``target_ratio · B_simple``, the
critical-batch point at which a step costs 2x the minimum steps and 2x the minimum examples
(docs/science.md, S = S_min(1 + B_crit/B), E = E_min(1 + B/B_crit)); Gray et al. (2024) and
AdaptDL/Pollux act on the same signal.

What it buys, measured (docs/adaptive_batch.md: least squares, an MLP and a byte-level LM,
three seeds, four loss targets each): with these defaults, no win over the best fixed batch
with a tuned constant learning rate on any task. In the model a batch in proportion to
B_simple lies on the fixed-batch hyperbola, not inside it (``policy="sqrt"``, B ∝ √B_simple,
can lie inside), and on runs of a few hundred steps the limits below keep the batch several
times below B_simple. With plain SGD, ``lr_rule="noise"`` (ε_max/(1 + B_simple/B), the best
step in the same model) beats the tuned fixed batches at 3 of 4 targets on both SGD tasks,
mostly through the learning rate it lowers as B_simple grows; with Adam it lost to the linear
rule.

Why it does not oscillate (a Schmitt trigger):
- the noise scale is the run's current B_simple by the one rule every page uses
  (``estimators.current_noise_scale``: a ratio of sums over a trailing window that keeps to the
  present regime), never a single step's ratio; where that window only gives a lower bound,
  the bound is the target (B_simple is at least that);
- nothing changes before ``warmup_steps`` measured steps;
- a change needs the target to leave a band: above ``batch · (1 + hysteresis)`` to grow, below
  ``batch / (1 + hysteresis)²`` to shrink (shrinking is off by default; the wider band because
  the noise scale is expected to rise, and an early overshoot should not be undone by noise);
  after a change the batch sits near the target, so the next change needs the target to move
  by that factor again;
- one change moves the batch by at most ``max_step_factor``, so a spike of the estimate (large
  while the batch is far below B_simple, when the two-batch estimates are noisiest) cannot jump
  to the maximum;
- at least ``cooldown_steps`` steps pass between changes.

Pure Python and torch-free: it reads the numbers a probe returns (``ProbeSample``) or any
``(b_small, b_big, g_small_sq, g_big_sq)``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from noisescope import _wire
from noisescope.estimators import (
    NoiseSamples,
    adaptive_batch_target,
    noise_scaled_lr,
    scaled_lr,
    two_batch_estimates,
)

__all__ = [
    "BatchDecision",
    "BatchSizeScheduler",
    "LRRule",
    "NormsSample",
    "Policy",
    "scaled_lr",
]

logger = logging.getLogger("noisescope")

LRRule = Literal["noise", "linear", "sqrt", "none"]
_LR_RULES = ("noise", "linear", "sqrt", "none")
Policy = Literal["sqrt", "critical"]
_POLICIES = ("sqrt", "critical")

#: The event kind batch-size changes are logged under (the dashboard marks these on charts):
#: ``noisescope.protocol.BATCH_SIZE_EVENT_KIND``, named here too for the scheduler's users.
EVENT_KIND = _wire.BATCH_SIZE_EVENT_KIND


class NormsSample(Protocol):
    """What a probe step returns (``noisescope.torch.ProbeSample`` has these fields)."""

    @property
    def step(self) -> int: ...
    @property
    def b_small(self) -> float: ...
    @property
    def b_big(self) -> float: ...
    @property
    def g_small_sq(self) -> float: ...
    @property
    def g_big_sq(self) -> float: ...


class EventSink(Protocol):
    """``noisescope.Run`` provides ``log_event``; anything with it will do."""

    def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None: ...


@dataclass(frozen=True)
class BatchDecision:
    """One batch-size change: returned by the scheduler and logged as a ``batch_size`` event."""

    step: int
    batch_size: int
    old_batch_size: int
    accum_steps: int
    micro_batch_size: int
    lr: float | None
    old_lr: float | None
    #: The smoothed B_simple that triggered the change, and the batch it asked for.
    noise_scale: float
    target_batch_size: float
    direction: Literal["grow", "shrink"]

    def payload(self) -> dict[str, Any]:
        """JSON-safe event payload (the server stores it as the event's ``payload``)."""
        return asdict(self)


class BatchSizeScheduler:
    """Grows the effective batch (micro-batch × accumulation steps) with the noise scale.

    Loop (``probe`` from ``noisescope.torch``, source "micro" or "auto")::

        sched = BatchSizeScheduler(micro_batch_size=32, max_batch_size=1024,
                                   base_lr=0.1, lr_rule="linear", run=run)
        for step in range(n_steps):
            for _ in range(sched.accum_steps):
                x, y = next(batches)                      # micro-batches of 32
                (loss_fn(model(x), y) / sched.accum_steps).backward()
                probe.micro_step(batch_size=len(x))
            sample = probe.step(loss=..., lr=sched.lr)
            sched.apply_lr(optimizer)
            optimizer.step(); optimizer.zero_grad()
            sched.observe(sample)                         # may change accum_steps and lr

    Args:
        micro_batch_size: examples (or tokens) per backward; fixed, so memory is fixed.
        min_batch_size: smallest effective batch and the starting one; defaults to two
            micro-batches, so the "micro" probe source always has two batch sizes to compare.
        max_batch_size: largest effective batch (rounded down to whole micro-batches).
        base_lr: learning rate tuned at ``base_batch_size`` (default: the starting batch);
            None leaves the learning rate to the user (``lr`` stays None) unless the rule is
            "noise".
        lr_rule: how the learning rate follows the batch. "linear" (default), "sqrt" (Adam
            family) or "none": ``base_lr`` scaled by B, B^½ or 1, capped at ``max_lr``.
            "noise" (plain SGD; needs ``max_lr``): ε_max/(1 + B_simple/B) with ε_max =
            ``max_lr``, the best SGD step at batch B in docs/science.md's model
            (``estimators.noise_scaled_lr``), which also lowers the learning rate as the noise
            scale grows at a fixed batch; until the first measurement, ``base_lr`` scaled
            linearly (or ``max_lr``/2 without one). docs/adaptive_batch.md measures both.
        max_lr: the largest learning rate: ε_max of the "noise" rule, the cap of the others
            (large batches hit a stability limit); the best learning rate of a large batch.
        policy: "critical" (default): the batch follows ``target_ratio · B_simple``; "sqrt":
            ``target_ratio · √(B_simple · reference_batch_size)``, the batch that minimises
            steps + examples/B_ref (``estimators.adaptive_batch_target``).
        reference_batch_size: B_ref of the "sqrt" policy, the examples one step is worth;
            default √(min_batch_size · max_batch_size).
        target_ratio: aim for ``target_ratio · B_simple`` (1.0: the critical-batch point).
        hysteresis: relative band the target must leave before the batch changes.
        max_step_factor: largest factor one change may grow (or shrink) the batch by; the
            schedule approaches a far target geometrically, so one noisy spike of the estimate
            (large while the batch is much smaller than B_simple) cannot jump to the maximum.
        cooldown_steps: minimum steps between two changes.
        warmup_steps: measured steps before the first change (early in training B_simple is
            small and noisy, see docs/adaptive_batch.md).
        allow_shrink: also shrink the batch when the noise scale falls (off: the noise scale
            rising with falling loss is the expected course, and dips are usually noise).
        run: where to log each change as an event (``noisescope.Run``); optional.
    """

    def __init__(
        self,
        micro_batch_size: int,
        *,
        min_batch_size: int | None = None,
        max_batch_size: int,
        base_lr: float | None = None,
        lr_rule: LRRule = "linear",
        base_batch_size: float | None = None,
        max_lr: float | None = None,
        policy: Policy = "critical",
        reference_batch_size: float | None = None,
        target_ratio: float = 1.0,
        hysteresis: float = 0.5,
        max_step_factor: float = 2.0,
        cooldown_steps: int = 50,
        warmup_steps: int = 50,
        allow_shrink: bool = False,
        run: EventSink | None = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if min_batch_size is None:
            min_batch_size = 2 * micro_batch_size
        if min_batch_size < micro_batch_size:
            raise ValueError(
                f"min_batch_size ({min_batch_size}) must be at least micro_batch_size "
                f"({micro_batch_size})"
            )
        self.min_accum = math.ceil(min_batch_size / micro_batch_size)
        self.max_accum = max_batch_size // micro_batch_size
        if self.max_accum < self.min_accum:
            raise ValueError(
                f"max_batch_size ({max_batch_size}) must hold at least min_batch_size "
                f"({min_batch_size}) in whole micro-batches of {micro_batch_size}"
            )
        if lr_rule not in _LR_RULES:
            raise ValueError(
                f"lr_rule must be 'noise', 'linear', 'sqrt' or 'none', got {lr_rule!r}"
            )
        if lr_rule == "noise" and max_lr is None:
            raise ValueError("lr_rule='noise' needs max_lr (best lr of a large batch)")
        if policy not in _POLICIES:
            raise ValueError(f"policy must be 'sqrt' or 'critical', got {policy!r}")
        if reference_batch_size is not None and not reference_batch_size > 0:
            raise ValueError(f"reference_batch_size must be positive, got {reference_batch_size}")
        if not target_ratio > 0:
            raise ValueError(f"target_ratio must be positive, got {target_ratio}")
        if not hysteresis >= 0:
            raise ValueError(f"hysteresis must be >= 0, got {hysteresis}")
        if not max_step_factor > 1.0 + hysteresis:
            raise ValueError(
                f"max_step_factor ({max_step_factor}) must exceed 1 + hysteresis "
                f"({1.0 + hysteresis}), or no change could leave the band"
            )
        if cooldown_steps < 0 or warmup_steps < 0:
            raise ValueError("cooldown_steps and warmup_steps must be >= 0")
        if base_lr is not None and not base_lr > 0:
            raise ValueError(f"base_lr must be positive, got {base_lr}")
        self.micro_batch_size = micro_batch_size
        self.accum_steps = self.min_accum
        self.base_lr = base_lr
        self.lr_rule: LRRule = lr_rule
        self.base_batch_size = float(base_batch_size or self.batch_size)
        self.max_lr = max_lr
        self.policy: Policy = policy
        self.reference_batch_size = float(
            reference_batch_size or math.sqrt(self.min_batch_size * self.max_batch_size)
        )
        self.target_ratio = target_ratio
        self.hysteresis = hysteresis
        self.max_step_factor = max_step_factor
        self.cooldown_steps = cooldown_steps
        self.warmup_steps = warmup_steps
        self.allow_shrink = allow_shrink
        self.run = run
        self.samples = NoiseSamples()
        self._noise_scale: float | None = None
        self._evaluated_at = 0
        self.decisions: list[BatchDecision] = []
        self._last_change_step: int | None = None
        self._observed = 0
        self._warned = False

    # -- state ------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """The effective batch: micro-batch × accumulation steps."""
        return self.micro_batch_size * self.accum_steps

    @property
    def min_batch_size(self) -> int:
        return self.micro_batch_size * self.min_accum

    @property
    def max_batch_size(self) -> int:
        return self.micro_batch_size * self.max_accum

    @property
    def lr(self) -> float | None:
        """The learning rate for the current batch (None when ``base_lr`` is None)."""
        return self._lr_for(self.batch_size)

    @property
    def noise_scale(self) -> float | None:
        """The current B_simple, or its lower bound while only that is known (None until
        either is), as of the last evaluation of the window."""
        return self._noise_scale

    def _current_noise_scale(self) -> float | None:
        """The current rule on the samples so far, re-evaluated once they have grown by 1%
        (the window is at least 10% of them, so it moves by at most a tenth between
        evaluations) and so costing the training loop O(1) per step on average."""
        n = len(self.samples)
        if n - self._evaluated_at >= max(1, n // 100):
            self._noise_scale = self.samples.current().point
            self._evaluated_at = n
        return self._noise_scale

    def _lr_for(self, batch_size: int) -> float | None:
        rule: str = self.lr_rule
        if rule == "noise" and self.max_lr is not None:
            if self._noise_scale is not None:
                return noise_scaled_lr(self.max_lr, batch_size, self._noise_scale)
            if self.base_lr is None:
                return self.max_lr / 2.0  # no measurement yet: take the batch to be at B_noise
            rule = "linear"  # no measurement yet: the tuned base lr, linear in B up to the cap
        if self.base_lr is None:
            return None
        lr = scaled_lr(self.base_lr, batch_size, self.base_batch_size, rule)
        return min(lr, self.max_lr) if self.max_lr is not None else lr

    def apply_lr(self, optimizer: Any) -> None:
        """Set every param group's ``lr`` of a torch optimizer to ``self.lr`` (if managed)."""
        lr = self.lr
        if lr is None:
            return
        for group in optimizer.param_groups:
            group["lr"] = lr

    # -- feeding measurements ---------------------------------------------------------------
    def observe(self, sample: NormsSample | None, step: int | None = None) -> BatchDecision | None:
        """Feed one probe step's result (None, for unmeasured steps, is ignored)."""
        if sample is None:
            return None
        return self.observe_norms(
            sample.step if step is None else step,
            sample.b_small,
            sample.b_big,
            sample.g_small_sq,
            sample.g_big_sq,
        )

    def observe_norms(
        self, step: int, b_small: float, b_big: float, g_small_sq: float, g_big_sq: float
    ) -> BatchDecision | None:
        """Feed one step's |G_small|² at b_small and |G_big|² at b_big (docs/science.md eq. 3-4)."""
        if not (math.isfinite(g_small_sq) and math.isfinite(g_big_sq)):
            return None  # docs/science.md, Pitfalls: skip non-finite gradients
        try:
            g_sq, trace_sigma = two_batch_estimates(b_small, b_big, g_small_sq, g_big_sq)
        except ValueError as exc:  # one batch size only: nothing to learn from this step
            if not self._warned:
                self._warned = True
                logger.warning("noisescope: scheduler skips a step: %s", exc)
            return None
        self.samples.add(float(step), g_sq, trace_sigma)
        return self._decide(step, self._current_noise_scale())

    def update(self, step: int, noise_scale: float | None) -> BatchDecision | None:
        """Decide from an already smoothed noise scale (e.g. from the server or a tracker); the
        "noise" learning-rate rule reads it too."""
        return self._decide(step, noise_scale)

    # -- the decision -----------------------------------------------------------------------
    def target_for(self, noise_scale: float) -> float:
        """The batch the policy asks for at this noise scale (before ``target_ratio``)."""
        if self.policy == "sqrt":
            return adaptive_batch_target(noise_scale, self.reference_batch_size)
        return noise_scale

    def _decide(self, step: int, noise_scale: float | None) -> BatchDecision | None:
        self._observed += 1
        if noise_scale is None or not math.isfinite(noise_scale) or noise_scale < 0:
            return None  # not yet measurable: keep the batch
        self._noise_scale = noise_scale  # what the "noise" learning-rate rule reads
        if self._observed <= self.warmup_steps:
            return None
        if (
            self._last_change_step is not None
            and step - self._last_change_step < self.cooldown_steps
        ):
            return None
        current = self.batch_size
        target = self.target_ratio * self.target_for(noise_scale)
        band = 1.0 + self.hysteresis
        if target >= current * band:
            wanted = min(target, current * self.max_step_factor)
            accum = min(self.max_accum, max(self.min_accum, round(wanted / self.micro_batch_size)))
            direction: Literal["grow", "shrink"] = "grow"
            if accum <= self.accum_steps:
                return None
        elif self.allow_shrink and target * band * band <= current:
            wanted = max(target, current / self.max_step_factor)
            accum = min(self.max_accum, max(self.min_accum, round(wanted / self.micro_batch_size)))
            direction = "shrink"
            if accum >= self.accum_steps:
                return None
        else:
            return None
        old_lr = self.lr
        self.accum_steps = accum
        decision = BatchDecision(
            step=step,
            batch_size=self.batch_size,
            old_batch_size=current,
            accum_steps=accum,
            micro_batch_size=self.micro_batch_size,
            lr=self.lr,
            old_lr=old_lr,
            noise_scale=noise_scale,
            target_batch_size=target,
            direction=direction,
        )
        self._last_change_step = step
        self.decisions.append(decision)
        self._log(decision)
        return decision

    def _log(self, decision: BatchDecision) -> None:
        """Log the change as an event; a monitoring failure never reaches the training loop."""
        run = self.run
        if run is None:
            return
        try:
            run.log_event(decision.step, EVENT_KIND, decision.payload())
        except Exception as exc:
            logger.warning("noisescope: could not log the batch-size event: %r", exc)

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a resumed job needs to continue the schedule exactly (JSON-safe)."""
        return {
            "accum_steps": self.accum_steps,
            "last_change_step": self._last_change_step,
            "observed": self._observed,
            "samples": self.samples.state(),
            "evaluated_at": self._evaluated_at,
            "noise_scale": self._noise_scale,
            "decisions": [d.payload() for d in self.decisions],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accum_steps = int(state["accum_steps"])
        self._last_change_step = state["last_change_step"]
        self._observed = int(state["observed"])
        # a checkpoint from before the current rule holds an EMA instead: it starts afresh
        self.samples = (
            NoiseSamples.from_state(state["samples"]) if "samples" in state else NoiseSamples()
        )
        self._evaluated_at = int(state.get("evaluated_at", 0))
        noise_scale = state.get("noise_scale")
        self._noise_scale = None if noise_scale is None else float(noise_scale)
        self.decisions = [BatchDecision(**d) for d in state["decisions"]]
