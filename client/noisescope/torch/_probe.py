"""GradientNoiseProbe: squared gradient norms at two batch sizes, measured in the training loop.

Every source gives, per optimizer step, |G_small|^2 at B_small and |G_big|^2 at B_big (the inputs
of the two-batch estimator, docs/science.md App. A.1):

- ``micro``: each backward (a micro-batch, on this rank) is one G_small; the gradient the
  optimizer sees (accumulated over micro-batches, reduced over DDP/FSDP ranks) is G_big. Covers
  gradient accumulation, DDP, FSDP2, and combinations. Per-parameter tensor hooks see each
  backward's incoming gradient before it is accumulated into ``.grad`` and before DDP's reducer
  or FSDP's reduce-scatter runs (``_rows``; where the hooks go: ``_wrappers``).
- ``per_example``: each example is one G_small (B_small = 1 in examples, or its real token
  count in tokens); see ``_per_example``.

This module is the orchestration; the normalisation maths is in ``_normalise``, the readout
(one collective, now or deferred) in ``_readout``, the misuse checks in ``_misuse``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from noisescope._sink import Sink
from noisescope._wire import UNITS, units_problem

from . import _normalise, _rows, _torch_api
from ._deepspeed import STEP_ORDER, EngineGrads
from ._instrument import _identity as _not_instrumented
from ._instrument import current as _instrumentation
from ._layers import measured_parameters
from ._misuse import SINGLE_BATCH_SIZE, STALE_GRAPH, GradWatch, notice
from ._normalise import MicroLoss
from ._per_example import PerExampleMethod, PerExampleNorms, Unsupported
from ._readout import N_COUNTS, N_FLAGS, Pending, Readout
from ._source import SourceDecision
from ._sums import Micro, ProbeSample, StepSums
from ._wrappers import UnshardedHooks, detect, may_all_reduce

Source = Literal["auto", "micro", "per_example"]
Scope = Literal["all", "norm_layers"]
Units = Literal["examples", "tokens"]
ReadoutMode = Literal["auto", "immediate", "deferred"]


def _owns(module: nn.Module, param: nn.Parameter) -> bool:
    return any(p is param for p in module.parameters(recurse=False))


class GradientNoiseProbe(SourceDecision):
    """Measures |G_small|^2 and |G_big|^2 each optimizer step and logs them to ``sink``.

    Usage (call ``step`` after the last backward, before unscaling, clipping and the
    optimizer step)::

        probe = GradientNoiseProbe(model, run)
        for micro in micro_batches:
            (loss_fn(model(micro.x), micro.y) / k).backward()
            probe.micro_step(batch_size=len(micro.x))
        probe.step(loss=loss.item(), lr=sched.get_last_lr()[0])
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    Args:
        model: the model, its DDP wrapper, an FSDP2 (``fully_shard``) model, or any of these
            ``torch.compile``d; found out from the model itself.
        sink: anything with ``log_sample(...)``, normally the ``Run`` from ``noisescope.init``.
        source: "micro" (accumulation, DDP, FSDP2), "per_example" (B_small = 1), or "auto":
            per-example while a step has a single backward on a single process, micro-batches
            as soon as there are several (accumulation or several ranks).
        units: "examples" or "tokens"; ``batch_size`` and ``item_counts`` are in these units.
            Default: the sink's ``units`` (what ``noisescope.init(units=...)`` set), else
            "examples".
        micro_loss: how each backward's loss is reduced: "mean/k" (mean over the micro-batch,
            divided by the number of micro-batches: PyTorch/nanoGPT), "mean" (plain mean, not
            divided), "sum/N" (summed, divided by the step's total item count on this rank:
            Hugging Face ``num_items_in_batch``), or "sum" (plain sum).
        layers: also log one series per layer (True: per module owning parameters) or per
            named parameter group (a mapping name -> parameters).
        scaler: a ``torch.amp.GradScaler``; norms are un-scaled by its current scale.
        every: measure every n-th step only (hooks do nothing on the others).
        small_batches: micro source: which backwards of a step give G_small samples: "all"
            (most precise) or "first" (one gradient read per step instead of one per
            micro-batch: cheaper with many micro-batches, noisier tr(Sigma)).
        per_example_max: per-example source: measure at most this many examples of each
            batch (the first ones; batches must be shuffled). Cost scales with the number
            measured; tr(Sigma) gets noisier. Default: all.
        per_example: "auto" (cheap identities, torch.func for other modules), "identities"
            (fail on unsupported modules), "func" (torch.func everywhere).
        scope: "all" (every trainable parameter) or "norm_layers": only the normalization
            layers' parameters (LayerNorm, RMSNorm, GroupNorm and classes named ``*Norm``),
            whose per-example gradients are nearly free (Gray et al. 2024). A proxy for the
            whole model's B_simple, not the same quantity: see docs/sources.md for when it is
            a good one.
        process_group: the ranks that share a step (default: DDP's, FSDP's mesh, the world).
        readout: "immediate" (``step()`` reads the step's values: a device sync off the CPU),
            "deferred" (``step()`` only launches; the values are read, and the sample logged,
            at the next measured step or at ``flush()``/``remove()``), or "auto": deferred off
            the CPU, immediate on it.

    An error inside the probe while it measures (in a gradient hook, or reading the norms)
    does not reach the training loop: the probe warns once, stops measuring and keeps the
    reason in ``error``; under DDP/FSDP every rank stops at the same step. Misuse of the API (a
    bad argument, ``step()`` without a backward) still raises.
    """

    def __init__(
        self,
        model: nn.Module,
        sink: Sink,
        *,
        source: Source = "auto",
        units: Units | None = None,
        micro_loss: MicroLoss = "mean/k",
        layers: bool | Mapping[str, Iterable[nn.Parameter]] = False,
        scaler: Any = None,
        every: int = 1,
        small_batches: Literal["all", "first"] = "all",
        per_example_max: int | None = None,
        per_example: PerExampleMethod = "auto",
        process_group: Any = None,
        readout: ReadoutMode = "auto",
        scope: Scope = "all",
    ) -> None:
        if source not in ("auto", "micro", "per_example"):
            raise ValueError(f"source must be 'auto', 'micro' or 'per_example', got {source!r}")
        if scope not in ("all", "norm_layers"):
            raise ValueError(f"scope must be 'all' or 'norm_layers', got {scope!r}")
        sink_units = getattr(sink, "units", None)
        if units is None:
            units = sink_units if sink_units in UNITS else "examples"
        if problem := units_problem(units):
            raise ValueError(problem)
        if sink_units in UNITS and sink_units != units:
            raise ValueError(
                f"the probe counts {units} but the run was started with units={sink_units!r}: "
                "pass the same units to noisescope.init() and the probe"
            )
        if micro_loss not in ("mean/k", "mean", "sum/N", "sum"):
            raise ValueError(
                f"micro_loss must be 'mean/k', 'mean', 'sum/N' or 'sum', got {micro_loss!r}"
            )
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if small_batches not in ("all", "first"):
            raise ValueError(f"small_batches must be 'all' or 'first', got {small_batches!r}")
        if readout not in ("auto", "immediate", "deferred"):
            raise ValueError(f"readout must be 'auto', 'immediate' or 'deferred', got {readout!r}")
        self.model = model
        self.sink = sink
        self._wrap = _instrumentation()  # profiling (benchmarks): identity otherwise
        if self._wrap is not _not_instrumented:
            for name in ("micro_step", "step", "flush"):
                setattr(self, name, self._wrap(getattr(self, name), False))
        self.units: str = units
        self.micro_loss: MicroLoss = micro_loss
        self.scaler = scaler
        self.every = every
        self._first_only = small_batches == "first"
        self._n_micro = 0  # backwards recorded in the current step
        self.layout = detect(model, process_group)
        #: DeepSpeed: the engine's loss scale, steps and reduced-gradient norm
        self._engine: EngineGrads | None = None
        if self.layout.kind == "deepspeed":
            if layers is not False:
                raise ValueError(
                    "layers= is not supported under DeepSpeed: the probe reads the engine's "
                    "one gradient norm for the whole model"
                )
            if scaler is not None:
                raise ValueError(
                    "scaler= is not used under DeepSpeed: the engine's fp16 loss scale is read "
                    "from the engine itself"
                )
            self._engine = EngineGrads(self.layout.engine)
        self.process_group = self.layout.process_group
        self.distributed = self.layout.distributed
        self.world_size = self.layout.world_size
        module = self.layout.inner
        self.params = measured_parameters(module, scope == "norm_layers")
        self.scope: str = scope
        self._device = self.params[0].device
        self.series_names, series_of_param = _rows.series_slots(module, self.params, layers)
        # one extra slot ("rest") for parameters outside every named group
        self._n_slots = len(self.series_names) + 1
        self._slot = torch.tensor(series_of_param, device=self._device)
        # squared norms -> per-slot sums on the device: one product
        self._slot_matrix = nn.functional.one_hot(self._slot, self._n_slots).to(torch.float32)
        self._rows = _rows.NormRows(self.params, self.layout.sharded)
        deferred = readout == "deferred" or (readout == "auto" and self._device.type != "cpu")
        self.readout: str = "deferred" if deferred else "immediate"
        self._readout = Readout(
            self._device, 2 * self._n_slots + N_COUNTS + N_FLAGS, self.process_group,
            self.distributed, deferred,
        )  # fmt: skip
        self._sums = StepSums(
            self._rows, self._readout, self._slot_matrix, micro_loss, scaler, self.layout.sharded,
            self._engine.reduced_sq if self._engine is not None else None,
        )  # fmt: skip
        self._loss_scale = 1.0  # DeepSpeed fp16: the current step's, read at its first backward

        self.step_count = 0  # optimizer steps seen (measured or not)
        self.measured_steps = 0
        self.skipped_steps = 0  # measured steps dropped for non-finite norms
        self.misused_steps = 0  # measured steps dropped: step() came after unscale/clipping
        self._warned: set[str] = set()
        self.examples_seen = 0.0  # in ``units``, over all ranks
        self._micro: list[Micro] = []
        self._step_items = 0.0
        self.error: str | None = None  # why the probe stopped measuring, if it did
        self._stopped = False  # stopped, and (under DDP/FSDP) every rank knows it

        self._auto = source == "auto"
        #: why the source in use was chosen (said once, at the first measured step)
        self.source_reason = "chosen with source=" + repr(source)
        self.source: str = source
        if source == "auto":
            self.source, self.source_reason = self._auto_source(module)
        self._announced = not self._auto  # a source the user chose needs no explaining
        #: auto, until its first measured step ends: both sources' hooks, the step's backwards
        #: say which one measures (one: per-example, several: micro-batches), before any row
        self._undecided = self._auto and self.source == "per_example"
        self._micro_rows: list[Micro] = []  # undecided: the micro-batch source's rows
        self._undecided_failure: Unsupported | None = None
        self._fallback: str | None = None  # auto: per-example cannot be exact, why
        self._step_dropped = False  # this step's per-example norms could not be computed
        self._handles: list[RemovableHandle] = []
        self._forward_handles: list[RemovableHandle] = []
        self._decided = False  # this step's first backward: hooks or .grad decided
        self._read_grad = False  # the coming backward is read from .grad, without hooks
        self._detached = False
        self._per_example: PerExampleNorms | None = None
        self._unsharded: UnshardedHooks | None = None
        self._watch: GradWatch | None = None
        self._per_example_method = per_example
        self._per_example_max = per_example_max
        self._param_index = {id(p): i for i, p in enumerate(self.params)}
        self._install()

    # --- set-up ---------------------------------------------------------------------------

    def _install(self) -> None:
        self.remove()
        self._detached = False
        inner = self.layout.inner
        # the model's forward, or (when a wrapper calls a submodule directly, as Lightning
        # does) that of the module owning the first parameter: either runs before backward
        owner = next(m for m in inner.modules() if _owns(m, self.params[0]))
        # a compiled model's own forward runs eagerly; hooks inside it would be traced
        entries = [self.layout.compiled] if self.layout.compiled is not None else [inner, owner]
        if self._engine is None:  # DeepSpeed: the engine unscales and clips after the norm
            self._watch = GradWatch(
                entries[-1:], self.params, self._wrap, sharded=self.layout.sharded
            )
            self._watch.armed = self._armed
        if self.source == "micro" or self._undecided:
            self._install_micro(entries)
        if self.source == "per_example":
            if self.layout.compiled is not None:  # the hooks are inside the compiled forward
                _torch_api.guard_module_hooks()
            follow = self.layout.compiled is None and not self.layout.sharded
            self._per_example = PerExampleNorms(
                inner, self._param_index, self._per_example_method, self._per_example_max,
                self._wrap, follow,
            )  # fmt: skip
            self._per_example.armed = self._armed
            self._per_example.on_error = self._fail

    def _install_micro(self, entries: list[nn.Module]) -> None:
        """The micro-batch source's hooks: each backward's gradient norms, per parameter."""
        rows, wrap, fail = self._rows, self._wrap, self._fail
        if self.layout.sharded:  # the forward's unsharded parameters get the hooks
            self._unsharded = UnshardedHooks(
                self.layout.inner,
                self.params,
                lambda i, dtype: wrap(rows.make_hook(i, _rows.norm_into(dtype), fail), True),
                wrap,
            )
        else:
            for i, p in enumerate(self.params):
                hook = wrap(rows.make_hook(i, rows.norm_of[i], fail), True)
                self._handles.append(p.register_hook(hook))
        rows.hook_next(self._armed)
        if rows.per_parameter or self.layout.sharded:
            return  # sharded: .grad never holds one backward's local gradient
        for module in dict.fromkeys(entries):
            handle = module.register_forward_pre_hook(wrap(self._before_forward, False))
            self._forward_handles.append(handle)

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        """First forward of a measured step (off the CPU): can its backward go without hooks?

        If no parameter has a ``.grad`` yet (``zero_grad(set_to_none=True)``, PyTorch's default)
        and nothing will all-reduce into ``.grad`` during this backward (one process, or DDP
        under ``no_sync``), then after the backward each ``.grad`` *is* that backward's
        incoming gradient: micro_step reads all of them with one batched norm instead of one
        hook call per parameter. Otherwise, and for every later backward, the hooks stay.
        """
        if torch.compiler.is_compiling():
            return  # traced (inside a compiled caller): the hooks stay, the graph unbroken
        if self._n_micro or self._decided or not self._armed or not torch.is_grad_enabled():
            return
        self._decided = True
        if may_all_reduce(self.model, self.layout) or any(p.grad is not None for p in self.params):
            return
        self._read_grad = True
        self._rows.hook_next(False)

    def remove(self) -> None:
        """Detach every hook (the model trains on untouched); a deferred sample is logged."""
        self.flush()
        self._detached = True
        self._read_grad = False
        for h in self._handles + self._forward_handles:
            h.remove()
        self._handles.clear()
        self._forward_handles.clear()
        for part in (self._unsharded, self._watch, self._per_example):
            if part is not None:
                part.remove()
        self._unsharded = self._watch = self._per_example = None

    @property
    def _armed(self) -> bool:
        return self.step_count % self.every == 0 and self.error is None

    def _fail(self, exc: BaseException) -> None:
        """An error while measuring must not reach the training loop (raised in a gradient
        hook it would abort the backward half-way, with only some ``.grad`` accumulated): stop
        measuring and say why, once."""
        self._rows.live[0] = False
        if self._per_example is not None:
            self._per_example.armed = False
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"noisescope: the gradient noise probe stopped measuring after an error; "
                f"training goes on without it. {self.error}",
                RuntimeWarning,
                stacklevel=2,
            )
            notice(
                self.sink,
                self.step_count,
                f"the gradient noise probe stopped measuring at step {self.step_count} after "
                f"an error ({self.error}); training went on without it. Check the probe's "
                "arguments (source, micro_loss, layers) against the model, or report the error.",
            )

    # --- the training-loop API ------------------------------------------------------------

    def micro_step(
        self,
        batch_size: float,
        *,
        grad_scale: float | None = None,
        item_counts: Sequence[float] | Tensor | None = None,
    ) -> None:
        """Record the backward that just ran: its micro-batch held ``batch_size`` items.

        ``grad_scale`` overrides ``micro_loss`` for this backward: the factor between the
        gradient it added and the micro-batch's mean gradient. ``item_counts`` (per-example
        source, tokens): each example's real token count, padding excluded.
        """
        if not batch_size > 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        first = self._n_micro == 0
        if self._engine is not None:
            if self._n_micro and self._engine.pending_step():
                raise RuntimeError(f"noisescope: {STEP_ORDER}")
            if first:
                self._loss_scale = self._engine.loss_scale()
        self._step_items += float(batch_size)
        self._n_micro += 1
        read_grad, self._read_grad = self._read_grad, False
        armed = self._armed
        rows = self._rows
        if self.source == "micro" or self._undecided:  # kept short: runs once per backward
            if not armed:
                rows.hook_next(False)
                if not self._undecided:
                    return
            else:
                row = None
                if first or not self._first_only:  # a G_small: this backward's norms fill a row
                    row = rows.n_rows
                    rows.n_rows = row + 1
                    if read_grad:  # .grad holds exactly this backward's gradient
                        try:
                            rows.read_grad_into(row)
                        except Exception as exc:
                            self._fail(exc)
                            return
                # the coming backward adds to .grad: its hooks fill the next row (off: "first")
                rows.hook_next(not self._first_only)
                micro = Micro(row, None, float(batch_size), grad_scale, None)
                if not self._undecided:
                    self._micro.append(micro)
                    return
                self._micro_rows.append(micro)
                if not first:  # auto, first step: a second backward is accumulation
                    self._decide("micro")
                    return
        assert self._per_example is not None
        if not armed:
            self._per_example.reset()
            return
        try:
            small, counts, n_full = self._per_example.per_slot(
                self._slot, self._n_slots, item_counts
            )
        except Unsupported as exc:
            if self._undecided:  # said only if the step turns out to have one backward
                self._undecided_failure = exc
            else:
                self._cannot_per_example(str(exc), exc.retry)
            return
        except RuntimeError as exc:
            if self.layout.compiled is None or self._per_example.captured:
                raise
            raise RuntimeError(STALE_GRAPH) from exc
        self._micro.append(Micro(None, small, float(batch_size), grad_scale, counts, n_full))

    def discard_backward(self) -> None:
        """Forget the per-example norms of the backward that just ran, which is not to be
        measured (a micro-batch without a real item); the micro source has nothing to forget
        before ``micro_step``."""
        if self._per_example is not None:
            self._per_example.reset()

    def step(
        self,
        *,
        batch_size: float | None = None,
        loss: float | None = None,
        lr: float | None = None,
        grad_scale: float | None = None,
        item_counts: Sequence[float] | Tensor | None = None,
    ) -> ProbeSample | None:
        """Close the optimizer step: compute both norms and log them.

        Call after the last backward and before ``scaler.unscale_``, gradient clipping and
        ``optimizer.step()``. ``batch_size`` is a shorthand for a final ``micro_step``. Returns
        the whole-model sample logged in this call: this step's (immediate readout), the
        previous measured step's (deferred), or None.

        Under DeepSpeed: call after ``engine.step()``, on every micro-batch (``micro_step``
        after each ``engine.backward``); it closes a step only when the engine took one.
        """
        if self._engine is not None:
            if batch_size is not None:
                raise ValueError(
                    "under DeepSpeed pass batch_size to probe.micro_step() after each "
                    "engine.backward(), not to probe.step() (which comes after engine.step())"
                )
            if not self._engine.stepped():
                return None  # accumulating: the engine's step is still to come
        if batch_size is not None:
            self.micro_step(batch_size, grad_scale=grad_scale, item_counts=item_counts)
        armed = self.step_count % self.every == 0  # the schedule: the same on every rank
        step = self.step_count
        self.step_count += 1
        if self._undecided and self._micro_rows:  # auto, first step, one backward
            failure = self._undecided_failure
            self._decide("per_example")
            if failure is not None:
                self._cannot_per_example(str(failure), failure.retry)
        micros, self._micro = self._micro, []
        step_items, self._step_items = self._step_items, 0.0
        self._n_micro = 0
        dropped, self._step_dropped = self._step_dropped, False
        # auto decides before it logs: no row from a source it is leaving
        dropped = dropped or self._leaves_per_example(len(micros))
        logged = None
        try:
            if armed and self.error is None and not dropped:
                if not (self._auto and self.source == "per_example" and len(micros) > 1):
                    # (a first step of several backwards switches "auto" to micro-batches
                    # below, which the next step announces: one line, not two)
                    self._announce(step)
                if not micros:
                    raise RuntimeError(
                        "probe.step() saw no backward: call probe.micro_step(batch_size=...) "
                        "after each loss.backward(), or pass batch_size= to probe.step()"
                    )
                misuse = self._watch.check(self.scaler) if self._watch is not None else None
                logged = self.flush()  # deferred: the last measured step, long computed
                if self.error is None:
                    try:
                        values, n_reduced = self._sums.pack(
                            micros, misuse is not None, self._loss_scale
                        )
                    except Exception as exc:
                        self._fail(exc)
                    else:
                        seen = self.examples_seen
                        pending = Pending(
                            step, loss, lr, seen, misuse, None, values, n_reduced, None
                        )
                        self._readout.launch(pending)
                        if not self._readout.deferred:
                            logged = self.flush()
                        return logged
            if armed and not self._stopped and self.error is not None:  # came in this step
                self._agree_to_stop()
            self.examples_seen += step_items * self.world_size
            return logged
        finally:
            if armed:
                self._rows.norms.zero_()
            self._rows.n_rows = 0
            self._maybe_switch(len(micros))  # no-op unless several backwards were measured
            self._rearm()

    def flush(self) -> ProbeSample | None:
        """Read and log the measured step still pending (deferred readout); returns its
        whole-model sample. Called by the next measured ``step()`` and by ``remove()``."""
        read = self._readout.read()
        if read is None:
            return None
        pending, values = read
        return self._finish(pending, values)

    def _rearm(self) -> None:
        """Hooks on or off for the step that comes next."""
        self._decided = False
        if self._detached:
            return
        if self._watch is not None:
            self._watch.armed = self._armed
        if self._per_example is not None:
            self._per_example.armed = self._armed
        if self.source == "micro" or self._undecided:
            self._rows.hook_next(self._armed)

    # --- the step's sums --------------------------------------------------------------------

    def _agree_to_stop(self) -> None:
        """After an error on this rank: every rank stops at this step. The others are in this
        step's all-reduce, waiting for this rank's contribution: it carries the flag."""
        self._stopped = True
        if self.distributed:
            self.flush()
            torch.distributed.all_reduce(self._sums.stopped(), group=self.process_group)

    def _finish(self, pending: Pending, values: list[float]) -> ProbeSample | None:
        """Log a step from its values (summed over ranks): the estimator's inputs."""
        small_l, big_l, (count, inv_b, c_tot, c2b_tot, items, stopped, n_misused) = (
            self._sums.unpack(values)
        )
        step = pending.step
        self.examples_seen += items
        if stopped:
            self._fail(RuntimeError(f"the probe stopped on {stopped:.0f} other rank(s)"))
            self._stopped = True
            return None
        examples = pending.examples_before + items
        self.measured_steps += 1
        if n_misused:  # every rank drops the step
            self.misused_steps += 1
            if pending.misuse is not None:
                self._warn_once(step, pending.misuse)
            return None
        if not all(v == v and abs(v) != float("inf") for v in small_l + big_l):
            self.skipped_steps += 1
            return None
        b_small = _normalise.b_small(count, inv_b)
        b_big = _normalise.b_big(c_tot, c2b_tot)
        if not b_big > b_small * (1.0 + 1e-9):
            self._warn_once(step, SINGLE_BATCH_SIZE)
            return None
        divisor = _normalise.g_big_divisor(c_tot, self.world_size)
        total_small, total_big = sum(small_l) / count, sum(big_l) / divisor
        log = self.sink.log_sample
        log(step, b_small, b_big, total_small, total_big, examples=examples, series="",
            loss=pending.loss, lr=pending.lr)  # fmt: skip
        for name, sm, bg in zip(self.series_names, small_l, big_l, strict=False):
            log(step, b_small, b_big, sm / count, bg / divisor, examples=examples, series=name)
        return ProbeSample(step, b_small, b_big, total_small, total_big, examples)
