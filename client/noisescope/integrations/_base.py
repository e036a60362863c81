"""What the framework callbacks share: the run they log to, its probe, and how they stop.

A mixin placed before the framework's own callback class in the bases; each callback keeps
what is specific to its framework (where it hooks in, how it counts items and names the run).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn

import noisescope
from noisescope import _wire, branch
from noisescope._run import Run
from noisescope.branch import BranchSweep, Every
from noisescope.torch import GradientNoiseProbe

from ._branching import ModuleBranches, log_to, store_for
from ._options import PROBE_KEYS, RUN_KEYS, BranchOptions, CallbackOptions, check_options

logger = logging.getLogger("noisescope")


class _TrackingCallback:
    """Run and probe bookkeeping for a framework callback."""

    def __init__(self, run: Run | None, options: CallbackOptions) -> None:
        check_options(type(self).__name__, options)
        branch = options.get("branch")
        if branch is not None and not isinstance(branch, BranchOptions):
            raise TypeError(
                f"branch must be a noisescope.integrations.BranchOptions, got {type(branch)}"
            )
        units = options.get("units")
        if units is not None and (problem := _wire.units_problem(units)):
            raise ValueError(problem)
        small_batches = options.get("small_batches", "all")
        if small_batches not in ("all", "first"):
            raise ValueError(f"small_batches must be 'all' or 'first', got {small_batches!r}")
        self.run = run
        self._owns_run = run is None
        self.project = options.get("project")
        self.task = options.get("task")
        self.name = options.get("name")
        self.tags = options.get("tags")
        self.units = units
        self.layers = options.get("layers", False)
        self.every = options.get("every", 1)
        self.small_batches = small_batches
        #: the other ``noisescope.init`` arguments, passed on to the run the callback starts
        self.init_kwargs: dict[str, Any] = {
            key: value
            for key, value in options.items()
            if key not in RUN_KEYS and key not in PROBE_KEYS
        }
        self.probe: GradientNoiseProbe | None = None
        self._loss_sum: Tensor | None = None  # this optimizer step's micro-batch losses
        self._n_micro = 0  # micro-batches recorded in this optimizer step
        self._disabled: str | None = None  # why this run is not measured, if it is not
        self._branch = branch
        self._sweeps: list[BranchSweep] = []
        self._every: Every | None = None
        self._branching = False  # inside a branch sweep: the hooks leave it alone
        self._probe_args: dict[str, Any] = {}
        #: The run of the checkpoint the trainer resumes from (saved with it), if it does.
        self._resume_id: str | None = None

    @property
    def branch_sweeps(self) -> list[branch.BranchSweep]:
        """Every branch point's ``noisescope.branch.BranchSweep`` (``branch=``), in order."""
        return self._sweeps

    def _saved_run(self) -> dict[str, str]:
        """What a checkpoint keeps of the run, for a trainer that resumes from it."""
        return {"run_id": self.run.id} if self.run is not None else {}

    def _resume_from(self, saved: Mapping[str, Any] | None) -> None:
        """A checkpoint's ``_saved_run``: the next run this callback starts continues it."""
        run_id = saved.get("run_id") if isinstance(saved, Mapping) else None
        if isinstance(run_id, str) and _wire.run_id_problem(run_id) is None:
            self._resume_id = run_id

    def _begin_training(self) -> None:
        """A new ``fit()``/``train()``: measure again, in a new run if ours has finished."""
        self._disabled = None
        self._every = None
        if self._owns_run and self.run is not None and self.run.finished:
            self.run = None

    def _init_run(self, **defaults: Any) -> Run:
        """``noisescope.init`` with what the framework knows, overridden by the user's own."""
        kwargs: dict[str, Any] = {"tags": self.tags, **defaults}
        if self._resume_id is not None and "run_id" not in self.init_kwargs:
            # the trainer resumed from a checkpoint of this run: continue it (docs/client.md,
            # "Resuming a run"); a run_id of the user's own decides instead
            kwargs |= {"run_id": self._resume_id, "resume": True}
        self._resume_id = None  # a later fit without a checkpoint starts a new run
        kwargs.update(self.init_kwargs)
        if self.project is not None:
            kwargs["project"] = self.project
        if "config" in defaults and "config" not in self.init_kwargs:
            kwargs["config"] = _within_limits(kwargs["config"])
        self.run = noisescope.init(**kwargs)
        return self.run

    def _attach_probe(
        self,
        model: nn.Module,
        run: Run,
        *,
        units: str,
        micro_loss: str,
        scaler: Any,
        step: int,
        several: bool,
        accumulate: str,
    ) -> None:
        """The probe for this training, its step count matching the framework's (on resume too).

        ``several``: the framework will run several backwards per step (accumulation) or
        several processes: the micro-batch source. Otherwise the probe's "auto" source:
        per-example norms (B_small = 1 example, or each example's tokens) while a step has one
        backward, the micro-batch source from the first step with several (manual
        optimization, an accumulation schedule that grows). ``accumulate``: how to turn on
        accumulation in this framework, for the notice when the model refuses per-example
        norms."""
        self._probe_args = {
            "model": model,
            "sink": run,
            "source": "micro" if several else "auto",
            "units": "tokens" if units == "tokens" else "examples",
            "micro_loss": micro_loss,
            "layers": self.layers,
            "scaler": scaler,
            "every": self.every,
            "small_batches": self.small_batches,
        }
        try:
            self.probe = GradientNoiseProbe(**self._probe_args)
        except Exception as exc:
            if several:
                raise
            # e.g. tied weights: the probe refuses per-example norms for this model
            self._disable(
                f"one process and one backward per step are measured with per-example norms, "
                f"which this model does not allow ({exc!r}); {accumulate} to measure it with "
                "micro-batches"
            )
            return
        self.probe.step_count = step

    def _branch_at(
        self,
        step: int,
        *,
        batch_size: int,
        lr: float | None,
        trainer: Callable[[], ModuleBranches],
        default_root: str,
        units: str = "examples",
    ) -> branch.BranchSweep | None:
        """``branch=BranchOptions(every=N, ...)``: at a branch step, ``noisescope.branch``
        branches from the parent's state (the probe detached meanwhile, so branches are not
        measured as the parent's steps) and puts it back."""
        options = self._branch
        if options is None:
            return None
        if self._every is None:
            run = self.run if self.run is not None and self.run.active else None
            plan_kwargs = {
                **options.plan,
                "units": units,
                "parent_run_id": None if run is None else run.id,
            }
            self._every = branch.Every(
                options.every,
                trainer(),
                store_for(options, default_root, self.run),
                log=log_to(run, self.init_kwargs),
                first=options.first,
                **plan_kwargs,
            )
        if not self._every.due(step):
            return None
        if lr is None or not (lr > 0 and math.isfinite(lr)):
            # e.g. the last step of a decay to 0: a branch would not train
            warnings.warn(f"noisescope: no branches at step {step}: the lr is {lr!r}", stacklevel=2)
            return None
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.remove()
        self._branching = True
        try:
            sweep = self._every(step, batch_size=batch_size, lr=lr)
        finally:
            self._branching = False
            if probe is not None:
                self.probe = probe if probe.error is not None else self._new_probe(probe)
                self.probe.step_count = probe.step_count
        if sweep is not None:
            self._sweeps.append(sweep)
        return sweep

    def _new_probe(self, old: GradientNoiseProbe) -> GradientNoiseProbe:
        """A probe like ``old`` after a branch sweep; an "auto" probe that has switched to
        micro-batches (it saw several backwards in a step) stays on them."""
        args = self._probe_args
        if old.source == "micro":
            args = {**args, "source": "micro"}
        return GradientNoiseProbe(**args)

    def _per_example_now(self) -> bool:
        """Whether the probe measures per-example norms (so wants each example's items)."""
        return self.probe is not None and self.probe.source == "per_example"

    def _discard_backward(self) -> None:
        """A backward the callback does not hand to the probe (no real item in its micro-batch):
        drop the per-example norms it left, which would otherwise add to the next backward's."""
        if self.probe is not None:
            self.probe.discard_backward()

    def _end_training(self, status: str = "finished") -> None:
        """Detach the probe; finish the run if the callback started it (kept, finished, so
        that ``callback.run.id`` stays readable)."""
        if self.probe is not None:
            self.probe.remove()
            self.probe = None
        if self.run is not None and self._owns_run:
            self.run.finish(status)

    @contextlib.contextmanager
    def _or_disable(self, what: str) -> Iterator[None]:
        """A hook's measuring part: an exception in it stops measuring this run (``_disable``,
        saying ``what`` failed and how), never the training."""
        try:
            yield
        except Exception as exc:
            self._disable(f"{what}: {exc!r}")

    def _disable(self, reason: str) -> None:
        """Stop measuring this run, once, and say why (in the log and on the run's page):
        training itself goes on untouched (the probe's hooks are removed)."""
        if self._disabled is None:
            self._disabled = reason
            if self.probe is not None:
                with contextlib.suppress(Exception):
                    self.probe.remove()
            warnings.warn(f"noisescope: not measuring this run: {reason}", stacklevel=2)
            logger.warning("noisescope: not measuring this run: %s", reason)
            if self.run is not None:  # none yet: nothing was created, no page to explain
                step = self.probe.step_count if self.probe is not None else 0
                message = f"not measuring this run: {reason}"
                self.run.log_event(step, _wire.NOTICE_EVENT_KIND, {"message": message})


def _within_limits(config: Any) -> Any:
    """The framework's config, its largest entries left out (named under ``"left_out"``)
    while the server would refuse its size: e.g. a classifier's 20,000 labels in its model
    config must not keep the run from being recorded."""
    if not isinstance(config, dict):
        return config
    config = dict(config)
    left_out: list[str] = []
    while config and _wire.run_fields_problem(
        project="p", task="t", name="", config=config, tags=[]
    ):
        largest = max(config, key=lambda key: len(json.dumps(config[key], default=str)))
        del config[largest]
        left_out.append(str(largest))
    if left_out:
        config["left_out"] = left_out
    return config
