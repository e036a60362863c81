"""``python -m experiments.norm_proxy [--quick] [--docs DIR]``: is the norm layers' noise scale
a proxy for the whole model's?

``GradientNoiseProbe(..., source="per_example", scope="norm_layers")`` measures B_simple from
the normalization layers' parameters alone (Gray et al., NeurIPS 2024): nearly free, but a
different quantity, tr(Σ_norm)/|G_norm|², from the whole model's tr(Σ)/|G|². This compares the
two on the same batches and weights:

- the zoo's models with normalization layers (``harness/zoo``: nanoGPT as nanoGPT writes
  it, Hugging Face GPT-2, BERT, Llama, T5, a GroupNorm conv net; float64, each with a fixed
  set of N = 64 examples), at initialisation and after two lengths of training (Adam on
  batches drawn with replacement from the set). There the exact values are known (per-example
  gradients over the whole set, docs/science.md "Exact noise scale on a real network"), so
  the table gives the exact ratio beside the probes' estimates;
- the byte-level language model of ``experiments/tasks.py`` (``charlm``: 2 layers, width 64,
  64-byte context, Python stdlib sources), trained with Adam, measured early and later.

At each point the weights are fixed and one list of batches is drawn; the probe with
``scope="all"`` runs over it, then the probe with ``scope="norm_layers"`` over the same
batches (both per-example, B_small = 1). Each gives a window estimate (the per-step unbiased
sums, ratio last); the ratio cheap/full gets a 90% interval from a delete-one-block jackknife
of its logarithm over contiguous blocks of steps (both estimates from the same blocks, so
their correlation is kept). Writes the section "norm-proxy" of ``docs/sources.md``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from experiments import sections
from experiments.tasks import TinyGPT, stdlib_text
from noisescope.estimators import student_t_quantile, two_batch_estimates
from noisescope.torch import GradientNoiseProbe
from noisescope.torch._layers import is_norm_layer

__all__ = ["Point", "main", "render", "run_study"]

SECTION = "norm-proxy"
LEVEL = 0.9
#: contiguous blocks of steps for the jackknife
BLOCKS = 20


@dataclass(frozen=True)
class Point:
    """One model at one point of training: both scopes' B_simple on the same batches."""

    model: str
    stage: str  # "init", "trained N steps"
    loss: float
    full: float | None  # the probe's window estimate, scope="all"
    cheap: float | None  # scope="norm_layers"
    ratio: float | None  # cheap / full
    lo: float | None
    hi: float | None
    exact_full: float | None = None  # the zoo's exact values (finite training set)
    exact_cheap: float | None = None
    norm_share: float = math.nan  # the norm layers' share of the trainable parameters


class _Rows:
    """What a probe logs, kept as (b_small, b_big, g_small_sq, g_big_sq) rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, float]] = []

    def log_sample(
        self, step: int, b_small: float, b_big: float, g_small_sq: float, g_big_sq: float,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if kwargs.get("series", "") == "":
            self.rows.append((b_small, b_big, g_small_sq, g_big_sq))


def _sums(rows: Sequence[tuple[float, float, float, float]]) -> tuple[list[float], list[float]]:
    g, t = [], []
    for row in rows:
        gi, ti = two_batch_estimates(*row)
        g.append(gi)
        t.append(ti)
    return g, t


def ratio_interval(
    full: Sequence[tuple[float, float, float, float]],
    cheap: Sequence[tuple[float, float, float, float]],
    blocks: int = BLOCKS,
    level: float = LEVEL,
) -> tuple[float | None, float | None, float | None, float | None, float | None]:
    """(B_full, B_cheap, ratio, lo, hi): window estimates of both scopes over the same steps,
    and a jackknife interval of log(ratio) over ``blocks`` contiguous blocks of steps. None
    where a |G|² sum is not above zero (not measurable)."""
    gf, tf = _sums(full)
    gc, tc = _sums(cheap)
    n = len(gf)
    b_full = sum(tf) / sum(gf) if sum(gf) > 0 else None
    b_cheap = sum(tc) / sum(gc) if sum(gc) > 0 else None
    if b_full is None or b_cheap is None or b_full <= 0 or b_cheap <= 0:
        return b_full, b_cheap, None, None, None
    ratio = b_cheap / b_full
    edges = [round(i * n / blocks) for i in range(blocks + 1)]
    logs = []
    for i in range(blocks):
        keep = [j for j in range(n) if not edges[i] <= j < edges[i + 1]]
        sgf, stf = sum(gf[j] for j in keep), sum(tf[j] for j in keep)
        sgc, stc = sum(gc[j] for j in keep), sum(tc[j] for j in keep)
        if min(sgf, stf, sgc, stc) <= 0:
            return b_full, b_cheap, ratio, None, None
        logs.append(math.log((stc / sgc) / (stf / sgf)))
    mean = sum(logs) / blocks
    se = math.sqrt((blocks - 1) / blocks * sum((x - mean) ** 2 for x in logs))
    q = student_t_quantile(0.5 + level / 2, blocks - 1)
    centre = math.log(ratio)
    return b_full, b_cheap, ratio, math.exp(centre - q * se), math.exp(centre + q * se)


def _norm_share(model: nn.Module) -> float:
    norm = {id(p) for m in model.modules() if is_norm_layer(m) for p in m.parameters(False)}
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in params if id(p) in norm) / sum(p.numel() for p in params)


def _measure(
    model: nn.Module,
    batches: Sequence[Any],
    step_loss: Callable[[nn.Module, Any], Tensor],
    batch_size: Callable[[Any], float],
    scope: str,
) -> list[tuple[float, float, float, float]]:
    """The probe with ``scope`` over ``batches`` at fixed weights (no optimizer step)."""
    sink = _Rows()
    probe = GradientNoiseProbe(model, sink, source="per_example", scope=scope)  # type: ignore[arg-type]
    try:
        for batch in batches:
            loss = step_loss(model, batch)
            loss.backward()
            probe.step(batch_size=batch_size(batch), loss=float(loss.detach()))
            model.zero_grad(set_to_none=True)
        if probe.error is not None:
            raise RuntimeError(f"the probe (scope={scope!r}) stopped: {probe.error}")
    finally:
        probe.remove()
    return sink.rows


def _point(
    name: str,
    stage: str,
    model: nn.Module,
    batches: Sequence[Any],
    step_loss: Callable[[nn.Module, Any], Tensor],
    batch_size: Callable[[Any], float],
    loss: float,
    exact: tuple[float, float] | None = None,
) -> Point:
    full = _measure(model, batches, step_loss, batch_size, "all")
    cheap = _measure(model, batches, step_loss, batch_size, "norm_layers")
    b_full, b_cheap, ratio, lo, hi = ratio_interval(full, cheap)
    return Point(
        name, stage, loss, b_full, b_cheap, ratio, lo, hi,
        exact[0] if exact else None, exact[1] if exact else None, _norm_share(model),
    )  # fmt: skip


def _loss_on(
    step_loss: Callable[[nn.Module, Any], Tensor], model: nn.Module, draw: Callable[[], Any]
) -> Tensor:
    return step_loss(model, draw())


def _train_until(
    opt: torch.optim.Optimizer, trained: int, at: int, next_loss: Callable[[], Tensor]
) -> int:
    """Optimizer steps on ``next_loss()`` from step ``trained`` to ``at``; gradients cleared."""
    while trained < at:
        loss = next_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        trained += 1
    opt.zero_grad(set_to_none=True)
    return trained


# --- the zoo ---------------------------------------------------------------------------------

#: the zoo's cases with trainable normalization layers (lstm has none, lora's are frozen; the
#: checkpointed and padded variants are the same models)
ZOO = ("nanogpt", "gpt2", "bert", "llama", "t5", "groupnorm_conv", "moe")


def _exact(case: Any) -> tuple[float, float]:
    """Exact B_simple of the whole model and of its norm layers over the case's N examples."""
    from harness.zoo import Truth, brute_force_grads, trainable

    grads = brute_force_grads(case)
    norm = {id(p) for m in case.model.modules() if is_norm_layer(m) for p in m.parameters(False)}
    cols: list[int] = []
    start = 0
    for p in trainable(case.model):
        if id(p) in norm:
            cols += range(start, start + p.numel())
        start += p.numel()
    full = Truth.of(grads, case.counts).b_simple
    cheap = Truth.of(grads[:, cols], case.counts).b_simple
    return full, cheap


def _zoo_points(
    quick: bool, progress: Callable[[str], None]
) -> list[Point]:  # pragma: no cover - the study itself
    from harness.zoo import BUILDERS

    names = ZOO[:2] if quick else ZOO
    checkpoints = (0, 30) if quick else (0, 30, 300)
    steps, batch = (60, 16) if quick else (120, 16)
    points = []
    for name in names:
        case = BUILDERS[name]()
        model = case.model
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(11)
        trained = 0

        def step_loss(m: nn.Module, idx: Tensor, case: Any = case) -> Tensor:
            loss: Tensor = case.losses(m, case.batch(idx)).sum() / case.items(idx)
            return loss

        for at in checkpoints:
            draw = functools.partial(torch.randint, 0, case.n, (batch,), generator=gen)
            trained = _train_until(
                opt, trained, at, functools.partial(_loss_on, step_loss, model, draw)
            )
            with torch.no_grad():
                full_loss = float(step_loss(model, torch.arange(case.n)))
            batches = [torch.randint(0, case.n, (batch,), generator=gen) for _ in range(steps)]
            t0 = time.perf_counter()
            point = _point(
                name, "init" if at == 0 else f"trained {at} steps", model, batches, step_loss,
                lambda idx: float(idx.shape[0]), full_loss, _exact(case),
            )  # fmt: skip
            points.append(point)
            progress(f"[norm_proxy] {_line(point)} ({time.perf_counter() - t0:.0f} s)")
    return points


# --- the byte-level language model ------------------------------------------------------------


def _charlm_points(
    quick: bool, progress: Callable[[str], None]
) -> list[Point]:  # pragma: no cover - the study itself
    """The ``charlm`` task's model (make_trainer's sizes), Adam at 4e-3, batch 16 sequences."""
    context, batch = 64, 16
    train, val = stdlib_text()
    data = torch.tensor(list(train), dtype=torch.long)
    held = torch.tensor(list(val), dtype=torch.long)
    torch.manual_seed(0)
    model = TinyGPT(context, d=64, heads=4, layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    gen = torch.Generator().manual_seed(12)
    offsets = torch.arange(context)

    def draw(source: Tensor, n: int) -> tuple[Tensor, Tensor]:
        starts = torch.randint(0, len(source) - context - 1, (n,), generator=gen)
        return source[starts[:, None] + offsets], source[starts[:, None] + offsets + 1]

    def step_loss(m: nn.Module, xy: tuple[Tensor, Tensor]) -> Tensor:
        logits = m(xy[0])
        return F.cross_entropy(logits.reshape(-1, 256), xy[1].reshape(-1))

    val_batch = draw(held, 256)
    checkpoints = (20, 200) if quick else (50, 500, 1500)
    steps = 60 if quick else 120
    trained, points = 0, []
    for at in checkpoints:
        trained = _train_until(opt, trained, at, lambda: step_loss(model, draw(data, batch)))
        with torch.no_grad():
            held_loss = float(step_loss(model, val_batch))
        batches = [draw(data, batch) for _ in range(steps)]
        t0 = time.perf_counter()
        point = _point(
            "byte LM (charlm)", f"trained {at} steps", copy.deepcopy(model), batches, step_loss,
            lambda xy: float(xy[0].shape[0]), held_loss,
        )  # fmt: skip
        points.append(point)
        progress(f"[norm_proxy] {_line(point)} ({time.perf_counter() - t0:.0f} s)")
    return points


def run_study(
    quick: bool = False, progress: Callable[[str], None] = lambda _: None
) -> list[Point]:  # pragma: no cover - the study itself
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared: one thread is the steadier
    try:
        return _zoo_points(quick, progress) + _charlm_points(quick, progress)
    finally:
        torch.set_num_threads(threads)


# --- the report --------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _ratio(p: Point) -> str:
    if p.ratio is None:
        return "not measurable"
    if p.lo is None or p.hi is None:
        return f"{p.ratio:.2f} (no interval)"
    return f"{p.ratio:.2f} [{p.lo:.2f}, {p.hi:.2f}]"


def _exact_ratio(p: Point) -> str:
    if p.exact_full is None or p.exact_cheap is None:
        return "—"
    return f"{p.exact_cheap / p.exact_full:.2f}"


def _line(p: Point) -> str:
    return (
        f"{p.model}, {p.stage}: loss {p.loss:.3f}, B_simple all {_num(p.full)}, "
        f"norm layers {_num(p.cheap)}, ratio {_ratio(p)}, exact ratio {_exact_ratio(p)}"
    )


def render(points: Sequence[Point], command: str) -> str:
    lines = [
        "### Measured: the norm layers' B_simple against the whole model's",
        "",
        f"Written by `{command}` (`experiments/norm_proxy.py`; its docstring says how). Both "
        "scopes per-example (B_small = 1), on the same batches at the same fixed weights; "
        "*ratio* = norm layers / all parameters, with a 90% jackknife interval over 20 blocks "
        "of steps. For the zoo's models (N = 64 examples each, float64) the *exact* columns "
        "are the true values over the whole set (per-example gradients of every example). "
        "*Norm share*: the normalization layers' share of the trainable parameters. CPU only.",
        "",
        "| model | point | loss | norm share | B_simple, all | B_simple, norm layers "
        "| ratio (90%) | exact all | exact norm layers | exact ratio |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for p in points:
        exact_full = _num(p.exact_full) if p.exact_full is not None else "—"
        exact_cheap = _num(p.exact_cheap) if p.exact_cheap is not None else "—"
        lines.append(
            f"| {p.model} | {p.stage} | {p.loss:.3f} | {100 * p.norm_share:.2f}% "
            f"| {_num(p.full)} | {_num(p.cheap)} | {_ratio(p)} | {exact_full} | {exact_cheap} "
            f"| {_exact_ratio(p)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - the study itself
    p = argparse.ArgumentParser(prog="python -m experiments.norm_proxy", description=__doc__)
    p.add_argument("--quick", action="store_true", help="two zoo models, shorter windows")
    p.add_argument("--docs", type=Path, default=Path("docs"), help="sources.md's folder")
    args = p.parse_args(argv)
    command = "python -m experiments.norm_proxy" + (" --quick" if args.quick else "")
    t0 = time.perf_counter()
    points = run_study(args.quick, progress=lambda t: print(t, file=sys.stderr, flush=True))
    print(f"[norm_proxy] done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    sections.write(args.docs / "sources.md", SECTION, render(points, command))
    print(render(points, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
