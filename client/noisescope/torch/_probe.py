"""GradientNoiseProbe: squared gradient norms at two batch sizes, measured in the training loop.

Every source gives, per optimizer step, |G_small|^2 at B_small and |G_big|^2 at B_big (the inputs
of the two-batch estimator, science.md App. A.1):

- ``micro``: each backward (a micro-batch, on this rank) is one G_small; the gradient the
  optimizer sees (accumulated over micro-batches, all-reduced over DDP ranks) is G_big. Covers
  gradient accumulation, DDP, and both combined. Per-parameter tensor hooks see each backward's
  incoming gradient before it is accumulated into ``.grad`` and before DDP's reducer runs.
- ``per_example``: each example is one G_small (B_small = 1 in examples, or its real token
  count in tokens); see ``_per_example``.

Normalisation (science.md "Pitfalls"): a backward adds ``c_j x`` (mean gradient of micro-batch
j), where ``c_j`` follows from how the user's loss was reduced (``micro_loss``) and the AMP loss
scale. We divide each G_small by ``c_j``; the optimizer's gradient is sum_j c_j g_j (averaged over
ranks), which we divide by sum_j c_j. Its covariance is Sigma * sum_j (c_j^2 / b_j) / (sum_j c_j)^2,
so B_big = (sum c_j)^2 / sum (c_j^2 / b_j) -- the total item count when c_j is proportional to
b_j or the micro-batches are equal. With unequal micro-batches the average of |g_j|^2 has
E = |G|^2 + tr(Sigma) mean(1/b_j) (eq. 1), so B_small is their harmonic mean.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, cast

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from noisescope import _wire
from noisescope._sink import Sink

from . import _torch_api
from ._misuse import GradWatch
from ._per_example import PerExampleMethod, PerExampleNorms
from ._wrappers import UnshardedHooks, detect, local_grad

Source = Literal["auto", "micro", "per_example"]
MicroLoss = Literal["mean/k", "mean", "sum/N", "sum"]
Units = Literal["examples", "tokens"]


@dataclass(frozen=True)
class ProbeSample:
    """What one measured step produced for the whole model (series "")."""

    step: int
    b_small: float
    b_big: float
    g_small_sq: float
    g_big_sq: float
    examples: float


@dataclass
class _Micro:
    row: int | None  # micro source: this backward's row of ``_norms``; None: not a G_small
    per_example: Tensor | None  # per-example source: (n_slots, B) squared norms
    batch_size: float
    grad_scale: float | None
    item_counts: Tensor | None
    n_full: int = 0  # per-example source: examples in the micro-batch (measured or not)


class _Counts(NamedTuple):
    """A rank's counts for one step (summed over ranks under DDP)."""

    small_count: float  # G_small samples
    small_inv_b: float  # sum of 1 / b over them
    sum_c: float  # sum of the backwards' gradient scales c_j
    sum_c2_over_b: float  # sum of c_j^2 / b_j
    n_items: float


def _owns(module: nn.Module, param: nn.Parameter) -> bool:
    return any(p is param for p in module.parameters(recurse=False))


#: Reduced in fp32: their (loss-scaled) squared norms would overflow.
_HALF = (torch.float16, torch.bfloat16)


class NormInto(Protocol):
    def __call__(self, grad: Tensor, /, *, out: Tensor) -> object: ...


def _norm_into(dtype: torch.dtype) -> NormInto:
    """Writes |grad| into an fp32 scalar slot (``out=``). A gradient has its parameter's dtype,
    so this is chosen once per parameter; for fp32, the usual case, it is the torch function
    itself (no Python frame around a call made ~100 times per backward). (A BLAS dot, faster on
    a gradient in cache, was slower here on gradients fresh from the backward.)"""
    if dtype == torch.float32:
        return cast(NormInto, torch.linalg.vector_norm)
    if dtype in _HALF:  # in fp32: a half-precision result would round, its square overflow
        return functools.partial(torch.linalg.vector_norm, dtype=torch.float32)
    return lambda grad, /, *, out: out.copy_(torch.linalg.vector_norm(grad))  # fp64, complex


#: Devices where every gradient norm is its own kernel, each read while the gradient is fresh:
#: a step's first backward in the hooks like the later ones, ``.grad`` at the step one
#: parameter after another. On the CPU a kernel costs no launch and the hook finds the
#: gradient in cache. Elsewhere a kernel launch per parameter costs more than a cold read:
#: ``.grad`` is read with one batched ``_foreach_norm``, after the first backward too when
#: nothing will all-reduce into it (see ``_before_forward``).
_PER_PARAMETER = frozenset({"cpu"})


def _dense(grad: Tensor) -> Tensor:
    """A sparse gradient (``nn.Embedding(sparse=True)``) has the norm of its summed values."""
    return grad.coalesce().values() if grad.is_sparse else grad


class GradientNoiseProbe:
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
        model: the model (or its DDP wrapper; its all-reduced gradient is G_big).
        sink: anything with ``log_sample(...)``, normally the ``Run`` from ``noisescope.init``.
        source: "micro" (accumulation and/or DDP), "per_example" (B_small = 1), or "auto":
            per-example while a step has a single backward on a single process, micro-batches
            as soon as there are several (accumulation or DDP).
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
        process_group: DDP process group (default: the world).

    An error inside the probe while it measures (in a gradient hook, or reading the norms)
    does not reach the training loop: the probe warns once, stops measuring and keeps the
    reason in ``error``; under DDP every rank stops at the same step. Misuse of the API (a bad
    argument, ``step()`` without a backward) still raises.
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
    ) -> None:
        if source not in ("auto", "micro", "per_example"):
            raise ValueError(f"source must be 'auto', 'micro' or 'per_example', got {source!r}")
        sink_units = getattr(sink, "units", None)
        if units is None:
            units = sink_units if sink_units in ("examples", "tokens") else "examples"
        if units not in ("examples", "tokens"):
            raise ValueError(f"units must be 'examples' or 'tokens', got {units!r}")
        if sink_units in ("examples", "tokens") and sink_units != units:
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
        self.model = model
        self.sink = sink
        self.units: str = units
        self.micro_loss = micro_loss
        self.scaler = scaler
        self.every = every
        if small_batches not in ("all", "first"):
            raise ValueError(f"small_batches must be 'all' or 'first', got {small_batches!r}")
        self._first_only = small_batches == "first"
        self._n_micro = 0  # backwards recorded in the current step
        self.layout = detect(model, process_group)
        self.process_group = self.layout.process_group
        self.distributed = self.layout.distributed
        self.world_size = self.layout.world_size
        module = self.layout.inner
        self.params: list[nn.Parameter] = []
        seen: set[int] = set()
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        if not self.params:
            raise ValueError("the model has no parameters that require gradients")
        self._device = self.params[0].device
        self.series_names, series_of_param = self._series(module, layers)
        # one extra slot ("rest") for parameters outside every named group
        self._n_slots = len(self.series_names) + 1
        self._slot = torch.tensor(series_of_param, device=self._device)

        self.step_count = 0  # optimizer steps seen (measured or not)
        self.measured_steps = 0
        self.skipped_steps = 0  # measured steps dropped for non-finite norms
        self.misused_steps = 0  # measured steps dropped: step() came after unscale/clipping
        self._warned_misuse: set[str] = set()
        self.examples_seen = 0.0  # in ``units``, over all ranks
        self._micro: list[_Micro] = []
        # |grad| per parameter: row j for the step's j-th measured backward (micro source), the
        # row after them for the accumulated gradient. fp32 slots made once and reused (the
        # hooks write with ``out=``): results kept alive through the later backwards, allocated
        # between their large gradient buffers, fragment the heap: page faults on every step,
        # on the CPU several times the norms' own time. Zeroed after each measured step, so a
        # parameter with no gradient in a backward adds nothing, with no record of who wrote.
        self._norms = torch.zeros(8, len(self.params), device=self._device)  # grows past 7
        self._norm_slots: list[tuple[Tensor, ...]] = [r.unbind(0) for r in self._norms]
        self._n_rows = 0  # rows filled in the current step
        self._target: list[tuple[Tensor, ...]] = [()]  # the row the coming backward writes to
        # squared norms -> per-slot sums on the device: one product
        self._slot_matrix = nn.functional.one_hot(self._slot, self._n_slots).to(torch.float32)
        self._norm_of = [_norm_into(p.dtype) for p in self.params]  # the hooks' (and CPU's)
        # off the CPU, .grad is read with one _foreach_norm per parameter dtype
        self._by_dtype: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(self.params):
            self._by_dtype.setdefault(p.dtype, []).append(i)
        self._step_items = 0.0
        self._warned_single = False
        self.error: str | None = None  # why the probe stopped measuring, if it did
        self._stopped = False  # stopped, and (under DDP) every rank knows it

        if source == "auto":
            source = "micro" if self.world_size > 1 else "per_example"
            self._auto = True
        else:
            self._auto = False
        self.source: str = source
        self._handles: list[RemovableHandle] = []
        self._hooks_live = [False]  # read by every gradient hook
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

    def _series(
        self, module: nn.Module, layers: bool | Mapping[str, Iterable[nn.Parameter]]
    ) -> tuple[list[str], list[int]]:
        rest = -1
        if layers is False:
            return [], [0] * len(self.params)
        names: list[str] = []
        slot: dict[int, int] = {}
        if layers is True:
            for mod_name, m in module.named_modules():
                for _, p in m.named_parameters(recurse=False):
                    if p.requires_grad and id(p) not in slot:
                        name = mod_name or "(model)"
                        if name not in names:
                            names.append(name)
                        slot[id(p)] = names.index(name)
        else:
            for name, group in layers.items():
                if not name:
                    raise ValueError("layer group names must be non-empty ('' is the total)")
                names.append(name)
                for p in group:
                    slot[id(p)] = len(names) - 1
        rest = len(names)
        return names, [slot.get(id(p), rest) for p in self.params]

    def _install(self) -> None:
        self.remove()
        self._detached = False
        inner = self.layout.inner
        # the model's forward, or (when a wrapper calls a submodule directly, as Lightning
        # does) that of the module owning the first parameter: either runs before backward
        owner = next(m for m in inner.modules() if _owns(m, self.params[0]))
        # a compiled model's own forward runs eagerly; hooks inside it would be traced
        entries = [self.layout.compiled] if self.layout.compiled is not None else [inner, owner]
        self._watch = GradWatch(entries, self.params)
        self._watch.armed = self._armed
        if self.source == "micro":
            if self.layout.sharded:  # the forward's unsharded parameters get the hooks
                self._unsharded = UnshardedHooks(
                    self.layout.inner,
                    self.params,
                    lambda i, dtype: self._make_hook(i, _norm_into(dtype)),
                )
            else:
                for i, p in enumerate(self.params):
                    hook = self._make_hook(i, self._norm_of[i])
                    self._handles.append(p.register_hook(hook))  # type: ignore[no-untyped-call]
            self._hook_grads(self._armed)
            if self._device.type in _PER_PARAMETER or self.layout.sharded:
                return  # sharded: .grad never holds one backward's local gradient
            for module in dict.fromkeys(entries):
                handle = module.register_forward_pre_hook(self._before_forward)
                self._forward_handles.append(handle)
        else:
            self._per_example = PerExampleNorms(
                self.layout.inner,
                self._param_index,
                self._per_example_method,
                self._per_example_max,
            )
            self._per_example.armed = self._armed
            self._per_example.on_error = self._fail

    def _hook_grads(self, on: bool) -> None:
        """Micro source: measure (or not) the incoming gradients of the coming backwards.

        The hooks stay registered and only read a flag when off: unmeasured backwards (steps
        skipped by ``every``, later micro-batches with ``small_batches="first"``, a first
        backward read from ``.grad``) compute nothing, and nothing is re-registered per step.
        """
        self._hooks_live[0] = on
        if on:
            self._target[0] = self._row(self._n_rows)

    def _row(self, j: int) -> tuple[Tensor, ...]:
        """The slots of row j; the rows grow, keeping theirs, for more backwards than ever."""
        if j >= len(self._norm_slots):
            grown = torch.zeros(2 * j, len(self.params), device=self._device)
            grown[: len(self._norms)] = self._norms
            self._norms = grown
            self._norm_slots = [row.unbind(0) for row in grown]
        return self._norm_slots[j]

    def _make_hook(self, i: int, norm: NormInto) -> Callable[[Tensor], None]:
        # One kernel per parameter and backward, no allocation kept, no host sync: the norm
        # stays on the device until step() reads every row at once. Runs ~100 times per
        # backward: keep it short.
        target = self._target
        live = self._hooks_live
        fail = self._fail

        def hook(grad: Tensor) -> None:
            if live[0]:
                try:  # (is_sparse checked here: no call for the usual dense gradient)
                    norm(_dense(grad) if grad.is_sparse else grad, out=target[0][i])
                except Exception as exc:  # never abort the user's backward half-way
                    fail(exc)

        return hook

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        """First forward of a measured step (off the CPU): can its backward go without hooks?

        If no parameter has a ``.grad`` yet (``zero_grad(set_to_none=True)``, PyTorch's default)
        and nothing will all-reduce into ``.grad`` during this backward (one process, or DDP
        under ``no_sync``), then after the backward each ``.grad`` *is* that backward's
        incoming gradient: micro_step reads all of them with one batched norm instead of one
        hook call per parameter. Otherwise, and for every later backward, the hooks stay.
        """
        if self._n_micro or self._decided or not self._armed or not torch.is_grad_enabled():
            return
        self._decided = True
        if self._may_all_reduce() or any(p.grad is not None for p in self.params):
            return
        self._read_grad = True
        self._hook_grads(False)

    def _may_all_reduce(self) -> bool:
        """Could the coming backward overwrite .grad with an all-reduced gradient?"""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return False
        if self.layout.sharded:
            return True
        if self.distributed:  # DDP: all-reduces unless under no_sync or alone in its group
            sync = getattr(self.model, "require_backward_grad_sync", True)
            return bool(sync) and self.world_size > 1
        # a process group with a wrapper we do not know: assume so, unless there is no peer
        # (torchrun with one process): a reduction over one rank leaves .grad as it is
        return bool(torch.distributed.get_world_size() > 1)

    def remove(self) -> None:
        """Detach every hook (the model trains on untouched)."""
        self._detached = True
        self._read_grad = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for h in self._forward_handles:
            h.remove()
        self._forward_handles.clear()
        if self._unsharded is not None:
            self._unsharded.remove()
            self._unsharded = None
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        if self._per_example is not None:
            self._per_example.remove()
            self._per_example = None

    @property
    def _armed(self) -> bool:
        return self.step_count % self.every == 0 and self.error is None

    def _fail(self, exc: BaseException) -> None:
        """An error while measuring must not reach the training loop (raised in a gradient
        hook it would abort the backward half-way, with only some ``.grad`` accumulated): stop
        measuring and say why, once."""
        self._hooks_live[0] = False
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
            self._notice(
                self.step_count,
                f"the gradient noise probe stopped measuring at step {self.step_count} after "
                f"an error ({self.error}); training went on without it. Check the probe's "
                "arguments (source, micro_loss, layers) against the model, or report the error.",
            )

    def _notice(self, step: int, message: str) -> None:
        """Say on the run's page why it has no samples: the warning reaches only the training
        log. A plain ``Sink`` has no events; a failing one must not reach training either."""
        log_event = getattr(self.sink, "log_event", None)
        if log_event is None:
            return
        with contextlib.suppress(Exception):
            log_event(step, _wire.NOTICE_EVENT_KIND, {"message": message})

    def _agree_to_stop(self) -> None:
        """After an error on this rank: every rank stops at this step. The others are in
        ``_measure``'s all-reduce, waiting for this rank's contribution: it carries the flag."""
        self._stopped = True
        if self.distributed:
            n_sums = self._n_slots * (2 if self.layout.sharded else 1)
            self._all_reduce([0.0] * n_sums, [0.0] * len(_Counts._fields), (1.0, 0.0))

    def _all_reduce(
        self, small_l: list[float], local: Sequence[float], flags: tuple[float, float]
    ) -> list[float]:
        """The step's one collective: per-slot G_small sums (FSDP: then the G_big shards'),
        the counts, and (last) how many ranks stopped after an error and how many saw
        ``step()`` come after unscaling or clipping. Every rank sends the same length, failed
        or not."""
        packed = torch.tensor([*small_l, *local, *flags], dtype=torch.float64, device=self._device)
        torch.distributed.all_reduce(packed, group=self.process_group)
        return packed.tolist()

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
        self._step_items += float(batch_size)
        first = self._n_micro == 0
        self._n_micro += 1
        read_grad, self._read_grad = self._read_grad, False
        armed = self._armed
        if self.source == "micro":  # kept short: runs once per backward
            if not armed:
                self._hook_grads(False)
                return
            row = None
            if first or not self._first_only:  # a G_small: this backward's norms fill a row
                row = self._n_rows
                self._n_rows = row + 1
                if read_grad:  # .grad holds exactly this backward's gradient (_before_forward)
                    try:
                        self._read_grad_into(row)
                    except Exception as exc:
                        self._fail(exc)
                        return
            # the coming backward adds to .grad: its hooks fill the next row (off with "first")
            self._hook_grads(not self._first_only)
            self._micro.append(_Micro(row, None, float(batch_size), grad_scale, None))
            return
        assert self._per_example is not None
        if not armed:
            self._per_example.reset()
            return
        counts = None
        if item_counts is not None:
            counts = torch.as_tensor(item_counts, dtype=torch.float32, device=self._device)
        per_param_ex = self._per_example.take(self._device)
        n_full = self._per_example.last_full_batch
        small = torch.zeros(self._n_slots, per_param_ex.shape[1], device=self._device).index_add_(
            0, self._slot, per_param_ex
        )
        if counts is not None:
            if counts.shape[0] != n_full:
                raise ValueError(
                    f"item_counts has {counts.shape[0]} entries but the batch has {n_full} examples"
                )
            counts = counts[: small.shape[1]]
        self._micro.append(_Micro(None, small, float(batch_size), grad_scale, counts, n_full))

    def step(
        self,
        *,
        batch_size: float | None = None,
        loss: float | None = None,
        lr: float | None = None,
        grad_scale: float | None = None,
        item_counts: Sequence[float] | Tensor | None = None,
    ) -> ProbeSample | None:
        """Close the optimizer step: compute both norms and log them (one host sync).

        Call after the last backward and before ``scaler.unscale_``, gradient clipping and
        ``optimizer.step()``. ``batch_size`` is a shorthand for a final ``micro_step``. Returns
        the whole-model sample, or None on unmeasured or skipped steps.
        """
        if batch_size is not None:
            self.micro_step(batch_size, grad_scale=grad_scale, item_counts=item_counts)
        armed = self.step_count % self.every == 0  # the schedule: the same on every rank
        step = self.step_count
        self.step_count += 1
        micros, self._micro = self._micro, []
        step_items, self._step_items = self._step_items, 0.0
        self._n_micro = 0
        try:
            if armed and self.error is None:
                if not micros:
                    raise RuntimeError(
                        "probe.step() saw no backward: call probe.micro_step(batch_size=...) "
                        "after each loss.backward(), or pass batch_size= to probe.step()"
                    )
                misuse = self._watch.check(self.scaler) if self._watch is not None else None
                try:
                    sums = self._local_sums(micros)
                except Exception as exc:
                    self._fail(exc)
                else:
                    return self._measure(step, sums, loss, lr, misuse)
            if armed and not self._stopped:  # the error came in this step
                self._agree_to_stop()
            self.examples_seen += step_items * self.world_size
            return None
        finally:
            if armed:
                self._norms.zero_()
            self._n_rows = 0
            self._maybe_switch(len(micros))  # no-op unless several backwards were measured
            self._rearm()

    def _rearm(self) -> None:
        """Hooks on or off for the step that comes next."""
        self._decided = False
        if self._detached:
            return
        if self._watch is not None:
            self._watch.armed = self._armed
        if self._per_example is not None:
            self._per_example.armed = self._armed
        elif self.source == "micro":
            self._hook_grads(self._armed)

    def _maybe_switch(self, k: int) -> None:
        """Auto source: several backwards per step means accumulation; micro-batches are free."""
        if self._auto and self.source == "per_example" and k > 1:
            self.source = "micro"
            self._install()

    def _grad_scales(self, micros: list[_Micro]) -> list[float]:
        k = len(micros)
        n_local = sum(m.batch_size for m in micros)
        amp = 1.0
        if self.scaler is not None and self.scaler.is_enabled():
            amp = float(self.scaler.get_scale())
        out = []
        for m in micros:
            if m.grad_scale is not None:
                c = m.grad_scale
            elif self.micro_loss == "mean/k":
                c = 1.0 / k
            elif self.micro_loss == "mean":
                c = 1.0
            elif self.micro_loss == "sum/N":
                c = m.batch_size / n_local
            else:
                c = m.batch_size
            out.append(c * amp)
        return out

    def _read_grad_into(self, row: int) -> None:
        """|.grad| of every parameter that has one into row ``row`` of the norms (off the
        CPU, one ``_foreach_norm`` per dtype)."""
        slots = self._row(row)
        params = self.params
        if self._device.type in _PER_PARAMETER:
            if self.layout.sharded:  # this rank's shard; the ranks' squares add up
                for i, p in enumerate(params):
                    if (g := p.grad) is not None:
                        self._norm_of[i](local_grad(g.detach()), out=slots[i])
                return
            for i, p in enumerate(params):
                if (g := p.grad) is not None:
                    self._norm_of[i](_dense(g.detach()), out=slots[i])
            return
        for dtype, index in self._by_dtype.items():
            have = [
                (i, _dense(local_grad(g.detach())))
                for i in index
                if (g := params[i].grad) is not None
            ]
            if not have:
                continue
            grads = [g for _, g in have]
            norms = _torch_api.foreach_norm(grads, torch.float32 if dtype in _HALF else None)
            if len(have) == len(params):  # one dtype, every gradient there: the whole row
                torch.stack(norms, out=self._norms[row])
            else:
                _torch_api.foreach_copy_([slots[i] for i, _ in have], norms)

    def _local_sums(self, micros: list[_Micro]) -> tuple[list[float], list[float], _Counts]:
        """This rank's per-slot sums of |G_small|^2 and |G_big|^2, and its counts."""
        s = self._n_slots
        scales = self._grad_scales(micros)
        small_count = 0.0
        small_inv_b = 0.0
        per_example: Tensor | None = None  # per-example source: per-slot sums, on the device
        small_rows: list[tuple[_Micro, float]] = []  # micro source: rows, weight 1 / c_j^2
        for m, c in zip(micros, scales, strict=True):
            if m.per_example is None:
                if m.row is None:
                    continue  # small_batches="first": only the first backward is a G_small
                # micro-batch j: incoming gradient = c_j g_j  =>  |g_j|^2 = |incoming|^2 / c_j^2
                small_rows.append((m, 1.0 / (c * c)))
                small_count += 1.0
                small_inv_b += 1.0 / m.batch_size
            else:
                # per-example: gamma_i = c n_i g_i / b  =>  |g_i|^2 = |gamma_i|^2 (b / (c n_i))^2
                n_ex = m.per_example.shape[1]  # measured examples (<= n_full)
                if m.item_counts is None:
                    factor = (m.n_full / c) ** 2  # n_i = b / n_full
                    sq_sum = m.per_example.sum(1) * factor
                    small_inv_b += n_ex * m.n_full / m.batch_size
                else:
                    counts = m.item_counts
                    scale = (m.batch_size / c) ** 2 / counts.square()
                    sq_sum = (m.per_example * scale).sum(1)
                    small_inv_b += float((1.0 / counts).sum())
                per_example = sq_sum if per_example is None else per_example + sq_sum
                small_count += float(n_ex)
        n_rows = self._n_rows
        self._read_grad_into(n_rows)  # the optimizer's gradient: the row after the backwards'
        host = self._per_slot_sums(per_example)  # rows beyond n_rows are zero
        small_l = [0.0] * s
        for m, w in small_rows:
            assert m.row is not None
            for j, v in enumerate(host[m.row * s : (m.row + 1) * s]):
                small_l[j] += v * w
        big_l = host[n_rows * s : (n_rows + 1) * s]
        if per_example is not None:
            tail = host[len(self._norms) * s :]
            small_l = [a + b for a, b in zip(small_l, tail, strict=True)]
        sum_c = sum(scales)
        sum_c2_over_b = sum(c * c / m.batch_size for m, c in zip(micros, scales, strict=True))
        n_items = sum(m.batch_size for m in micros)
        return small_l, big_l, _Counts(small_count, small_inv_b, sum_c, sum_c2_over_b, n_items)

    def _per_slot_sums(self, per_example: Tensor | None) -> list[float]:
        """Each row's squared norms summed per slot (row after row), then ``per_example``'s
        sums: everything to the host in one transfer, the one host sync on a single process.
        Right after the backward every small kernel is slow (its code is out of cache): the
        whole model alone (no layers, the default) takes one norm per row."""
        if self._n_slots == 1 and per_example is None:
            return [v * v for v in torch.linalg.vector_norm(self._norms, dim=1).tolist()]
        sums = torch.mm(self._norms.square(), self._slot_matrix).flatten()
        if per_example is not None:
            sums = torch.cat([sums, per_example])
        return list(sums.tolist())

    def _measure(
        self,
        step: int,
        sums: tuple[list[float], list[float], _Counts],
        loss: float | None,
        lr: float | None,
        misuse: str | None,
    ) -> ProbeSample | None:
        small_l, big_l, local = sums
        s = self._n_slots
        misused = misuse is not None
        if self.distributed:  # G_small sums add over ranks; DDP's .grad is already all-reduced
            sharded = self.layout.sharded  # FSDP: .grad is a shard; the squares add over ranks
            reduced = self._all_reduce(
                small_l + big_l if sharded else small_l, local, (0.0, float(misused))
            )
            small_l = reduced[:s]
            if sharded:
                big_l = reduced[s : 2 * s]
                reduced = reduced[s:]
            count, inv_b, c_tot, c2b_tot, items, stopped, n_misused = reduced[s:]
            misused = n_misused > 0  # every rank drops the step
            if stopped:
                self._fail(RuntimeError(f"the probe stopped on {stopped:.0f} other rank(s)"))
                self._stopped = True
                self.examples_seen += items
                return None
        else:
            count, inv_b, c_tot, c2b_tot, items = local
        values = small_l + big_l
        b_small = count / inv_b
        b_big = c_tot * c_tot / c2b_tot
        # averaged over ranks: grad = (1/W) sum_r sum_j c_rj g_rj, so divide by (sum c)/W
        big_norm = (c_tot / self.world_size) ** 2
        self.measured_steps += 1
        self.examples_seen += items
        if misused:
            self.misused_steps += 1
            if misuse is not None and misuse not in self._warned_misuse:
                self._warned_misuse.add(misuse)
                warnings.warn(f"noisescope: {misuse}", stacklevel=3)
                self._notice(step, misuse)
            return None
        if not all(v == v and abs(v) != float("inf") for v in values):
            self.skipped_steps += 1
            return None
        if not b_big > b_small * (1.0 + 1e-9):
            if not self._warned_single:
                single = (
                    "this step has one batch size only (one process, one backward):"
                    " nothing can be measured. Use gradient accumulation (several backward"
                    " passes per optimizer step, e.g. accumulate_grad_batches or"
                    " gradient_accumulation_steps > 1), several data-parallel processes, or"
                    " source='per_example'"
                )
                warnings.warn(f"noisescope: {single}", stacklevel=3)
                self._notice(step, single)
                self._warned_single = True
            return None
        total_small = sum(small_l) / count
        total_big = sum(big_l) / big_norm
        self.sink.log_sample(
            step,
            b_small,
            b_big,
            total_small,
            total_big,
            examples=self.examples_seen,
            series="",
            loss=loss,
            lr=lr,
        )
        for name, sm, bg in zip(self.series_names, small_l, big_l, strict=False):
            self.sink.log_sample(
                step,
                b_small,
                b_big,
                sm / count,
                bg / big_norm,
                examples=self.examples_seen,
                series=name,
            )
        return ProbeSample(step, b_small, b_big, total_small, total_big, self.examples_seen)
