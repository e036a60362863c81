"""Training-step time with each gradient-noise probe vs the same loop untracked.

Two CPU models: an MLP (784-512-512-10, batch 512) and a small decoder-only transformer
(nanoGPT-style: 2 blocks, d=128, 4 heads, 64 tokens, batch 16, Linear/LayerNorm/Embedding only).
Each probe is timed against the same loop untracked: one model and optimizer per case, the probe
attached for its arm and removed after, the arms interleaved round by round in one process (the
first arm alternating) so load changes hit both alike; the table gives the median of the paired
ratios. One intra-op thread (the machine is shared).

- per-example: single process, one backward per step, B_small = 1 (cheap identities); also
  with ``per_example_max`` = a quarter of the batch (only those examples' norms computed).
- accumulation: 4 micro-batches per step (splitting the batch), micro-batch vs accumulated
  gradient; also with micro-batches of 4x the examples (the probe's cost is one read of the
  gradient per micro-batch, the step's grows with the examples), and with
  ``small_batches="first"`` (only the first micro-batch's gradient norm is read).
- compiled: the accumulation and per-example cases on ``torch.compile(model)`` (inductor).
  The per-example hooks cut the graph at each layer; and since dynamo does not guard on
  module hooks, its probed arm is a copy compiled with the probe attached (``_CompiledPerExample``).
- FSDP2 (MLP only): ``fully_shard`` on each Linear and the root, 2 real gloo processes, 2
  micro-batches (the first under ``set_requires_gradient_sync(False)``) for the micro-batch
  source, one backward for the per-example source; rank 0's figures.
- DDP + accumulation: DistributedDataParallel over a 1-process gloo group with 2 micro-batches,
  the first one's forward and backward under ``no_sync`` (DDP decides in the forward whether
  the backward all-reduces): the hook path plus the probe's one small all-reduce. (A real
  multi-rank run adds the same small collective per step. Two processes on this 2-core
  machine were tried: their paired ratios spread too widely to judge a 3% target.)

Beside each probe, the least work a probe of its kind must do, timed in the same kind of steps:
for the micro-batch sources, one norm of each measured backward's gradient (read while it is
fresh, in a post-accumulate hook) and one batched norm of the accumulated gradient at the step
(and, for DDP, the one small all-reduce); for per-example norms, the Linear layers' per-example
products (the Gram matrices). What the probe costs beyond it is its own bookkeeping.

Run: ``python -m benchmarks.probe_overhead [--quick]``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
import torch._dynamo.config
import torch.distributed as dist
from torch import Tensor, nn
from torch.multiprocessing.spawn import start_processes
from torch.nn import functional as F

from benchmarks import _cli
from benchmarks._least_probe import LeastGram, LeastNorm, LeastReads, Probe, ProbeFactory
from benchmarks._meter import Meter, NoiseGauge, metered
from experiments.tasks import TransformerBlock
from noisescope.torch import GradientNoiseProbe
from noisescope.torch._instrument import current as instrumentation


class _Sink:
    """Stands in for ``noisescope.Run``: appends to a list, as the client's buffer does."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def log_sample(self, *args: Any, **kwargs: Any) -> None:
        self.rows.append((args, kwargs))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = 256, d: int = 128, heads: int = 4, layers: int = 2, t: int = 64
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(t, d)
        self.blocks = nn.Sequential(*[TransformerBlock(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        # positions expanded to (batch, T): per-example norms need batch-first inputs
        pos = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        logits: Tensor = self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))
        return logits


def _mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


def _mlp_batch(n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)


def _gpt_batch(n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    ids = torch.randint(0, 256, (n, 65), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class _Case:
    """One model and optimizer, stepped with or without a probe: both arms share the weights,
    the data and the memory layout, so the ratio isolates the probe."""

    def __init__(
        self,
        model: nn.Module,
        batches: list[tuple[Tensor, Tensor]],
        make_probe: ProbeFactory,
        kind: str = "micro",  # "micro", "first" (small_batches="first"), "per_example" or
        # "norm_layers" (per-example, scope="norm_layers")
        ddp: bool = False,
        fsdp: bool = False,
    ) -> None:
        self.model, self.batches, self.make_probe, self.ddp = model, batches, make_probe, ddp
        self.fsdp = fsdp
        self.kind = kind
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(self, probe: Probe | None) -> None:
        """One optimizer step over the micro-batches (loss / k), probe before clipping."""
        model, k = self.model, len(self.batches)
        for j, batch in enumerate(self.batches):
            # DDP: forward and backward under no_sync (DDP decides in the forward whether the
            # backward all-reduces), the last micro-batch synchronised
            local = self.ddp and j < k - 1
            if self.fsdp:  # FSDP2: reduce-scatter on the last micro-batch only
                model.set_requires_gradient_sync(j == k - 1)  # type: ignore[operator]
            with model.no_sync() if local else contextlib.nullcontext():  # type: ignore[operator]
                loss = _loss(model, batch) / k
                loss.backward()
            if probe is not None:
                probe.micro_step(batch_size=batch[0].shape[0])
        if probe is not None:
            probe.step(loss=float(loss.detach()), lr=1e-3)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def time(self, probed: bool, n: int, make: ProbeFactory | None = None) -> float:
        """CPU seconds per step of this process (robust to other jobs on a shared machine)."""
        make = make or self.make_probe
        probe = make(self.model) if probed else None  # set-up is not timed
        gc.collect()
        gc.disable()  # as timeit does: a collection would land in one arm at random
        try:
            t0 = time.process_time()
            for _ in range(n):
                self.step(probe)
            return (time.process_time() - t0) / n
        finally:
            gc.enable()
            if probe is not None:
                probe.remove()


def _compiled(base: nn.Module) -> nn.Module:
    """A compiled copy of ``base`` (``torch.compile`` of a module returns the module's
    ``OptimizedModule``, typed only as a callable)."""
    return cast(nn.Module, torch.compile(copy.deepcopy(base)))


class _CompiledPerExample(_Case):
    """A compiled model with the per-example probe. Dynamo does not guard on module hooks, so
    a probe attached to a model already compiled without it never runs its hooks: the probed
    arm is a copy of the model, compiled with the probe attached before its first forward
    (one per metering context), the untracked arm the original compiled model. No
    least-work reference (its hooks would be attached after compilation)."""

    def __init__(self, base: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> None:
        self.base = base
        super().__init__(_compiled(base), batches, _per_example_probe, "per_example")
        self._probed: dict[Any, tuple[_Case, Probe]] = {}

    def time(self, probed: bool, n: int, make: ProbeFactory | None = None) -> float:
        if not probed or make is not None:
            return super().time(probed and make is None, n, make)
        key = instrumentation()  # one probed copy per metering context
        if key not in self._probed:
            model = _compiled(self.base)
            self._probed[key] = (_Case(model, self.batches, _per_example_probe, "per_example"),
                                 _per_example_probe(model))  # fmt: skip
        case, probe = self._probed[key]
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            for _ in range(n):
                case.step(probe)
            return (time.process_time() - t0) / n
        finally:
            gc.enable()


def _per_example_probe(model: nn.Module) -> Probe:
    return GradientNoiseProbe(model, _Sink(), source="per_example")


def _init_gloo() -> None:
    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=0, world_size=1)


def _cases(
    make_model: Callable[[], nn.Module],
    batch: int,
    sample: Callable[[int, torch.Generator], tuple[Tensor, Tensor]],
) -> dict[str, _Case]:
    """One case per probe source on one model."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    base = make_model()
    full = [sample(batch, g)]
    micro4 = [sample(batch // 4, g) for _ in range(4)]
    micro4_large = [sample(batch, g) for _ in range(4)]
    micro2 = [sample(batch // 2, g) for _ in range(2)]

    def probe(**kwargs: Any) -> ProbeFactory:
        return lambda model: GradientNoiseProbe(model, _Sink(), **kwargs)

    _init_gloo()
    return {
        "per-example": _Case(copy.deepcopy(base), full, probe(source="per_example"), "per_example"),
        "per-example, per_example_max=batch/4": _Case(
            copy.deepcopy(base),
            full,
            probe(source="per_example", per_example_max=batch // 4),
            "per_example",
        ),
        "accumulation (4 micro-batches)": _Case(copy.deepcopy(base), micro4, probe(source="micro")),
        LARGE: _Case(copy.deepcopy(base), micro4_large, probe(source="micro")),
        "accumulation (4 micro-batches), small_batches='first'": _Case(
            copy.deepcopy(base), micro4, probe(source="micro", small_batches="first"), "first"
        ),
        "DDP + accumulation (2 micro-batches)": _Case(
            nn.parallel.DistributedDataParallel(copy.deepcopy(base)),
            micro2,
            probe(source="micro"),
            ddp=True,
        ),
        COMPILED_MICRO: _Case(_compiled(base), micro4, probe(source="micro")),
        COMPILED_PER_EXAMPLE: _CompiledPerExample(base, full),
    }


class Row(NamedTuple):
    model: str
    source: str
    untracked_ms: float
    probed_ms: float
    ratio: float  # median of the paired ratios
    ratio_q1: float
    ratio_q3: float
    in_probe_ms: float  # training-thread CPU inside the probe (methods and hooks) per step
    least_ms: float  # the same, for the least work a probe of this kind must do


def _metered(meter: Meter, run: Callable[[int], object], steps: int, chunks: int) -> float:
    """Median over ``chunks`` runs of ``steps`` steps of the metered CPU seconds per step: a
    slow spell of the shared machine moves one run, not the figure."""
    run(1)  # first-use costs
    per_step = []
    for _ in range(chunks):
        before, calls = meter.total, meter.calls
        run(steps)
        per_step.append(meter.net(meter.total - before, meter.calls - calls) / steps)
    return statistics.median(per_step)


def _in_probe(case: _Case, steps: int, chunks: int) -> float:
    """CPU seconds per step inside the probe: metered steps, apart from the timed rounds."""
    meter = Meter()
    with metered(meter):
        return _metered(meter, lambda n: case.time(True, n), steps, chunks)


def _least(case: _Case, steps: int, chunks: int) -> float:
    """CPU seconds per step of the least work a probe of this kind must do (module doc)."""
    meter = Meter()

    def make(model: nn.Module) -> Probe:
        if case.kind == "per_example":
            return LeastGram(model, meter)
        if case.kind == "norm_layers":
            return LeastNorm(model, meter)
        return LeastReads(model, meter, first_only=case.kind == "first")

    return _metered(meter, lambda n: case.time(True, n, make), steps, chunks)


def _rows(
    model_name: str,
    cases: dict[str, _Case],
    quick: bool,
    gauge: NoiseGauge,
    least: bool = True,
    sizes: tuple[int, int, tuple[int, int]] | None = None,
) -> list[Row]:
    """The timed rounds of ``cases`` (both arms interleaved), then their metered columns;
    ``sizes``: (rounds, steps per arm and round, (metered steps, runs)) instead of this
    module's (for a model whose steps are slower)."""
    rounds, n = (QUICK_ROUNDS, QUICK_STEPS) if quick else (ROUNDS, STEPS)
    metering = (2 * n, 1) if quick else METERED
    if sizes is not None and not quick:
        rounds, n, metering = sizes
    times: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in cases}
    for case in cases.values():  # warm-up: first-use costs (and compilation) out of the timings
        case.time(False, 1)
        case.time(True, 1)
    for r in range(rounds):
        gauge.sample(2)
        for source, case in cases.items():
            # alternate which arm goes first: drift in load hits both alike
            order = (False, True) if r % 2 == 0 else (True, False)
            timed = {probed: case.time(probed, n) for probed in order}
            times[source][0].append(timed[False])
            times[source][1].append(timed[True])
    rows = []
    for source, (t0s, t1s) in times.items():
        ratios = [b / a for a, b in zip(t0s, t1s, strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        rows.append(
            Row(
                model_name,
                source,
                1e3 * statistics.median(t0s),
                1e3 * statistics.median(t1s),
                statistics.median(ratios),
                q1,
                q3,
                1e3 * _in_probe(cases[source], *metering),
                1e3 * _least(cases[source], *metering)
                if least and not isinstance(cases[source], _CompiledPerExample)
                else math.nan,
            )
        )
    return rows


MLP = "MLP 784-512-512-10, batch 512"


def _fsdp_worker(rank: int, port: int, out: str, quick: bool) -> None:
    """One of 2 FSDP2 ranks: the MLP's micro-batch and per-example cases, timed in step."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.fsdp import fully_shard

        g = torch.Generator().manual_seed(rank)
        torch.manual_seed(0)

        def sharded() -> nn.Module:
            model = _mlp()
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
            return model

        def probe(**kwargs: Any) -> ProbeFactory:
            return lambda model: GradientNoiseProbe(model, _Sink(), **kwargs)

        cases = {
            FSDP_MICRO: _Case(
                sharded(),
                [_mlp_batch(256, g) for _ in range(2)],
                probe(source="micro"),
                fsdp=True,
            ),
            FSDP_PER_EXAMPLE: _Case(
                sharded(), [_mlp_batch(512, g)], probe(source="per_example"), "per_example"
            ),
        }
        # least work: its post-accumulate hooks never fire on FSDP's sharded parameters
        rows = _rows(MLP, cases, quick, NoiseGauge(), least=False)
        if rank == 0:
            Path(out).write_text(json.dumps([r._asdict() for r in rows]))
    finally:
        dist.destroy_process_group()


def _fsdp_rows(quick: bool) -> list[Row]:
    """FSDP2 rows from 2 real processes (forked before this process starts its own group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rows.json"))
        start_processes(
            _fsdp_worker, args=(port, out, quick), nprocs=2, join=True, start_method="fork"
        )
        return [Row(**r) for r in json.loads(Path(out).read_text())]


def measure(quick: bool, gauge: NoiseGauge) -> list[Row]:
    """One row per model and probe source."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # several compiled instances of one class: without hook guards the per-example probe's
    # copy would reuse a graph compiled without its hooks (docs/sources.md, "Setups")
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    try:
        fsdp = _fsdp_rows(quick)
        models = {
            MLP: _cases(_mlp, 512, _mlp_batch),
            "transformer 2x128, 64 tokens, batch 16": _cases(TinyGPT, 16, _gpt_batch),
        }
        rows = []
        for model_name, cases in models.items():
            rows += _rows(model_name, cases, quick, gauge)
            if model_name == MLP:
                rows += fsdp
        return rows
    finally:
        torch.set_num_threads(threads)


ROUNDS, STEPS = 81, 3
METERED = (8, 5)  # the metered columns: median over 5 runs of 8 steps
#: The accumulation probe reads each micro-batch's gradient once: its cost is fixed per
#: micro-batch while the step's grows with the examples in it.
LARGE = "accumulation (4 micro-batches of 4x the examples)"
QUICK_ROUNDS, QUICK_STEPS = 3, 2
COMPILED_MICRO = "compiled (inductor): accumulation (4 micro-batches)"
COMPILED_PER_EXAMPLE = "compiled (inductor): per-example (a graph break per layer)"
FSDP_MICRO = "FSDP2, 2 processes: accumulation (2 micro-batches)"
FSDP_PER_EXAMPLE = "FSDP2, 2 processes: per-example"


TARGETS = {
    LARGE: 1.03,
    "per-example": 1.3,
    "per-example, per_example_max=batch/4": 1.3,
    "accumulation (4 micro-batches)": 1.03,
    "accumulation (4 micro-batches), small_batches='first'": 1.03,
    "DDP + accumulation (2 micro-batches)": 1.03,
    COMPILED_MICRO: 1.03,
    COMPILED_PER_EXAMPLE: 1.3,
    FSDP_MICRO: 1.03,
    FSDP_PER_EXAMPLE: 1.3,
}


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}x"


def run(quick: bool = False) -> str:
    gauge = NoiseGauge()
    rows = measure(quick, gauge)
    rounds, steps = (QUICK_ROUNDS, QUICK_STEPS) if quick else (ROUNDS, STEPS)
    chunks = "" if quick else f"the median of {METERED[1]} runs of {METERED[0]} steps; "
    lines = [
        "## Probes: training-step overhead",
        "",
        "CPU time per training step (forward, backward, clipping, SGD step) with the probe vs "
        "the same loop untracked, interleaved round by round in one run "
        "(`python -m benchmarks.probe_overhead" + (" --quick" if quick else "") + "`), "
        f"one intra-op thread; {rounds} rounds of {steps} steps per arm, the same model and "
        "optimizer in both arms (the probe is attached for its arm and removed after), garbage "
        "collection off while timing. *Ratio* is the median of the paired ratios, *q1-q3* their "
        "quartiles (the spread the shared machine adds). *In probe* is the training thread's "
        "CPU time inside the probe's methods and hooks per step, metered in separate steps "
        f"({chunks}the meter's own clock reads, calibrated on a no-op, taken out): a floor on "
        "the cost that the neighbours cannot blur (*1 + in/untracked*). *Least work* is "
        "metered the same way for the least a probe of that kind must do: for the "
        "micro-batch rows, one norm of each measured backward's gradient, read while it is "
        "fresh (a post-accumulate hook), one batched norm of the accumulated gradient at the "
        "step, and for DDP the one small all-reduce; for the per-example rows, the Linear "
        "layers' per-example products (the Gram matrices) alone. The probe's cost beyond it is "
        "its own bookkeeping. FSDP2 rows: 2 real gloo processes on this machine's 2 shared "
        "cores, rank 0's figures (no least-work reference: its hooks never fire on sharded "
        "parameters); compiled rows: inductor, compiled once per case before the timings. "
        "The in-probe time is metered through `noisescope.torch.instrumented`. "
        "Targets: micro-batch sources (accumulation, DDP, FSDP2) <= 1.03x, per-example <= "
        "1.3x, judged on *1 + in/untracked*; a ratio inside the q1-q3 spread is noise. "
        "No GPU was available for this run: the deferred readout (the default off the CPU) is "
        "not timed on one; these CPU rows use the immediate readout. " + gauge.describe(),
        "",
        "| model | source | untracked CPU ms/step | with probe CPU ms/step | ratio | q1-q3 "
        "| in probe ms/step | 1 + in/untracked | least work ms/step | 1 + least/untracked "
        "| target |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        target = TARGETS[row.source]
        mark = "" if row.ratio <= target or math.isnan(row.ratio) else " (over)"
        floor = 1 + row.in_probe_ms / row.untracked_ms
        lines.append(
            f"| {row.model} | {row.source} | {row.untracked_ms:.1f} | {row.probed_ms:.1f} "
            f"| {row.ratio:.3f}x{mark} | {row.ratio_q1:.3f}-{row.ratio_q3:.3f} "
            f"| {row.in_probe_ms:.2f} | {floor:.3f}x | {_ms(row.least_ms)} "
            f"| {_x(1 + row.least_ms / row.untracked_ms)} | <= {target}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.probe_overhead", __doc__, run))
