"""The reproduction tasks: data, model and one measured training step each.

Every task trains with batches drawn i.i.d. *with replacement*, so a mean-reduced batch gradient
has covariance Σ/B exactly (docs/science.md eq. 1; sampling without replacement would add the
(N−B)/(N−1) factor). Each step splits its batch into micro-batches (``experiments._step``).

The supervised tasks defined here:

- ``digits``: a one-hidden-layer MLP on scikit-learn's bundled 8x8 digits, plain SGD; the loss is
  the full training-set loss (the objective being optimised), evaluated exactly.
- ``lsq``: noisy linear least squares with Gaussian inputs, plain SGD, fresh data every step; the
  loss ½(δᵀSδ + σ²) and B_simple, B_noise are known in closed form (docs/science.md eq. 8).
- ``charlm``: a byte-level transformer language model on a fixed list of Python's own stdlib
  sources, Adam; units are tokens; the loss is the loss on a held-out slice of the same files.

and the paper's other domains, in ``experiments.domains``: ``digits_cnn`` (an image classifier),
``digits_vae`` (a generative model) and ``cartpole`` (reinforcement learning).
"""

from __future__ import annotations

import math
import os
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from experiments import domains
from experiments._step import StepResult, measured_step, micro_count
from experiments.domains import DigitsClassifier

__all__ = ["TASKS", "StepResult", "TaskSpec", "Trainer", "make_trainer"]


class Trainer(Protocol):
    def step(self, batch_size: int, lr: float) -> StepResult: ...

    def eval_loss(self) -> float: ...

    def truth(self) -> dict[str, float]:
        """Closed-form quantities at the current parameters, where the task has them."""
        ...


#: The server project of ``python -m experiments``'s runs (``--quick``: with ``QUICK_SUFFIX``).
PROJECT = "noisescope-reproduction"
QUICK_SUFFIX = "-quick"


@dataclass(frozen=True)
class TaskSpec:
    """A task's sweep: batch sizes (in examples/sequences), lr grid, loss targets, budgets.

    ``quick`` holds the overrides used by ``--quick``, which runs one seed unless they say
    otherwise (the reduced sweeps CI runs, tests/experiments/test_domains.py). Loss targets
    are fixed before running and the same analysis is applied to every task.
    """

    name: str
    title: str
    batch_sizes: tuple[int, ...]
    lrs: tuple[float, ...]
    loss_targets: tuple[float, ...]
    max_steps: int
    max_examples: int
    optimizer: str
    description: str
    units: str = "examples"
    tokens_per_example: int = 1
    micro_batches: int = 4
    seeds: int = 1
    quick: dict[str, object] = field(default_factory=dict)
    #: What one example is, on the page ("episodes" for CartPole); the server's ``units``
    #: stay "examples".
    shown_units: str = ""
    #: The server project the sweep's runs are logged to; ``--quick`` logs to a project of its
    #: own (``QUICK_SUFFIX``), so a tiny sweep never mixes with (or archives) the full one's.
    project: str = PROJECT

    @property
    def unit_label(self) -> str:
        return self.shown_units or self.units

    def sized(self, quick: bool) -> TaskSpec:
        if not quick:
            return self
        from dataclasses import replace

        overrides = {"seeds": 1, "project": self.project + QUICK_SUFFIX, **self.quick}
        return replace(self, quick={}, **overrides)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# (a) noisy least squares


class LeastSquares:
    """ℓ = ½(xᵀw − y)², x ~ N(0, S) with S diagonal, y = xᵀw* + ε, ε ~ N(0, σ²).

    Pure numpy: per-micro-batch gradients are Xᵀ(Xw − y)/m in closed form.
    """

    def __init__(self, seed: int, sampler_seed: int, d: int, sigma: float, kappa: float, k: int):
        init = np.random.default_rng(seed)
        self.eigs = np.geomspace(1.0, 1.0 / kappa, d)
        self.w_star = init.standard_normal(d) / np.sqrt(self.eigs) / np.sqrt(d) * 4.0
        self.w = np.zeros(d)
        self.sigma = sigma
        self.k = k
        self.rng = np.random.default_rng(sampler_seed)

    def step(self, batch_size: int, lr: float) -> StepResult:
        k = micro_count(batch_size, self.k)
        m = batch_size // k
        d = self.w.shape[0]
        x = self.rng.standard_normal((batch_size, d)) * np.sqrt(self.eigs)
        y = x @ self.w_star + self.sigma * self.rng.standard_normal(batch_size)
        resid = x @ self.w - y
        per_mb = (x * resid[:, None]).reshape(k, m, d).mean(axis=1)
        g_big = per_mb.mean(axis=0)
        self.w = self.w - lr * g_big
        return StepResult(
            b_small=float(m),
            b_big=float(batch_size),
            g_small_sq=float((per_mb**2).sum(axis=1).mean()),
            g_big_sq=float(g_big @ g_big),
            loss=float(0.5 * np.mean(resid**2)),
        )

    def eval_loss(self) -> float:
        delta = self.w - self.w_star
        return float(0.5 * (delta @ (self.eigs * delta) + self.sigma**2))

    def truth(self) -> dict[str, float]:
        """Isserlis closed forms (docs/science.md, "Ground truth for tests") for diagonal S."""
        s = self.eigs
        delta = self.w - self.w_star
        quad = float(delta @ (s * delta))
        g_sq = float(delta @ (s**2 * delta))
        trace_sigma = (quad + self.sigma**2) * float(s.sum()) + g_sq
        trace_h_sigma = (quad + self.sigma**2) * float((s**2).sum()) + float(delta @ (s**3 * delta))
        return {
            "b_simple_true": trace_sigma / g_sq,
            "b_noise_true": trace_h_sigma / float(delta @ (s**3 * delta)),
        }


# --------------------------------------------------------------------------------------------
# (b) MLP on scikit-learn digits


class DigitsMLP(DigitsClassifier):
    """64-64-10 tanh MLP, plain SGD, trained on 1437 of the 1797 bundled digits."""

    def __init__(self, seed: int, sampler_seed: int, hidden: int, k: int):
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))
        super().__init__(sampler_seed, k)


# --------------------------------------------------------------------------------------------
# (c) byte-level transformer LM on the stdlib's own sources

LM_FILES = (
    "argparse.py",
    "difflib.py",
    "textwrap.py",
    "string.py",
    "json/encoder.py",
    "json/decoder.py",
    "shlex.py",
    "heapq.py",
    "fractions.py",
    "csv.py",
)


def stdlib_text(files: Sequence[str] = LM_FILES) -> tuple[bytes, bytes]:
    """Train/validation bytes: each file split 90/10, so both halves see every file's style."""
    root = sysconfig.get_paths()["stdlib"]
    train, val = [], []
    for name in files:
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        cut = int(0.9 * len(data))
        train.append(data[:cut])
        val.append(data[cut:])
    return b"\n".join(train), b"\n".join(val)


class TransformerBlock(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP, both residual (GPT-2's block)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyGPT(nn.Module):
    def __init__(self, context: int, d: int, heads: int, layers: int):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        self.blocks = nn.Sequential(*[TransformerBlock(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        out: torch.Tensor = self.head(self.ln(self.blocks(x)))
        return out


class CharLM:
    """Byte-level GPT; batch sizes in sequences of ``context`` tokens, reported in tokens."""

    def __init__(
        self,
        seed: int,
        sampler_seed: int,
        context: int,
        d: int,
        heads: int,
        layers: int,
        k: int,
        eval_sequences: int,
    ):
        train, val = stdlib_text()
        self.train = torch.tensor(list(train), dtype=torch.long)
        val_t = torch.tensor(list(val), dtype=torch.long)
        self.context = context
        starts = torch.linspace(0, len(val_t) - context - 2, eval_sequences).long()
        self.val_x = torch.stack([val_t[s : s + context] for s in starts])
        self.val_y = torch.stack([val_t[s + 1 : s + context + 1] for s in starts])
        torch.manual_seed(seed)
        self.model = TinyGPT(context, d, heads, layers)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        self.gen = torch.Generator().manual_seed(sampler_seed)
        self.k = k

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))

    def step(self, batch_size: int, lr: float) -> StepResult:
        k = micro_count(batch_size, self.k)
        m = batch_size // k
        t = self.context
        starts = torch.randint(0, len(self.train) - t - 1, (batch_size,), generator=self.gen)
        offsets = torch.arange(t)
        x = self.train[starts[:, None] + offsets]
        y = self.train[starts[:, None] + offsets + 1]

        def micro(j: int) -> Callable[[], torch.Tensor]:
            sl = slice(j * m, (j + 1) * m)
            return lambda: self._loss(x[sl], y[sl])

        # Units are tokens: the loss is a mean over m·t tokens per micro-batch.
        return measured_step(self.params, self.opt, lr, [micro(j) for j in range(k)], float(m * t))

    def eval_loss(self) -> float:
        with torch.no_grad():
            return float(self._loss(self.val_x, self.val_y))

    def truth(self) -> dict[str, float]:
        return {}


# --------------------------------------------------------------------------------------------

LSQ_D, LSQ_SIGMA, LSQ_KAPPA = 32, 1.0, 100.0

TASKS: dict[str, TaskSpec] = {
    "digits": TaskSpec(
        name="digits",
        title="MLP on scikit-learn digits",
        batch_sizes=(4, 8, 16, 32, 64, 128, 256),
        lrs=(3.2, 1.6, 0.8, 0.4, 0.2, 0.1, 0.05),
        loss_targets=(1.0, 0.5, 0.3, 0.2, 0.15),
        max_steps=6000,
        max_examples=200_000,
        optimizer="SGD",
        seeds=3,
        description="64-64-10 tanh MLP, plain SGD, 1437 training images sampled with "
        "replacement; loss = cross-entropy on the whole training set",
        quick={
            "batch_sizes": (8, 32, 128),
            "lrs": (0.8, 0.2),
            "loss_targets": (1.0, 0.5),
            "max_steps": 1500,
        },
    ),
    "lsq": TaskSpec(
        name="lsq",
        title="Noisy least squares",
        batch_sizes=(4, 8, 16, 32, 64, 128, 256, 512),
        lrs=(3.2, 1.6, 0.8, 0.4, 0.2, 0.1, 0.05, 0.025, 0.0125),
        loss_targets=(1.0, 0.75, 0.6, 0.55),
        max_steps=20_000,
        max_examples=2_000_000,
        optimizer="SGD",
        seeds=3,
        description=f"d={LSQ_D}, S = diag(geomspace(1, 1/{LSQ_KAPPA:g})), σ={LSQ_SIGMA:g}, "
        "fresh Gaussian data every step, plain SGD; loss ½(δᵀSδ+σ²) exact",
        quick={
            "batch_sizes": (8, 32, 128),
            "lrs": (0.8, 0.2, 0.05),
            "loss_targets": (1.0, 0.75),
            "max_steps": 3000,
        },
    ),
    "charlm": TaskSpec(
        name="charlm",
        title="Byte-level transformer LM on Python stdlib source",
        units="tokens",
        tokens_per_example=64,
        batch_sizes=(2, 4, 8, 16, 32, 64),
        lrs=(3.2e-2, 1.6e-2, 8e-3, 4e-3, 2e-3, 1e-3, 5e-4, 2.5e-4),
        loss_targets=(2.5, 2.3, 2.15, 2.0),
        max_steps=5000,
        max_examples=80_000,
        optimizer="Adam",
        description="2 layers, d=64, 4 heads, context 64 bytes, Adam; "
        f"{len(LM_FILES)} stdlib files split 90/10; loss = held-out cross-entropy (nats/byte)",
        quick={
            "batch_sizes": (2, 8, 32),
            "lrs": (4e-3,),
            "loss_targets": (3.0,),
            "max_steps": 400,
        },
    ),
    "digits_cnn": TaskSpec(
        name="digits_cnn",
        title="Conv net on scikit-learn digits",
        batch_sizes=(4, 8, 16, 32, 64, 128, 256),
        lrs=(3.2, 1.6, 0.8, 0.4, 0.2, 0.1, 0.05, 0.025),
        loss_targets=(1.0, 0.5, 0.3, 0.2, 0.1),
        max_steps=6000,
        max_examples=200_000,
        optimizer="SGD",
        seeds=3,
        description="conv 3x3 (16) → ReLU → conv 3x3 stride 2 (32) → ReLU → linear, plain SGD, "
        "the same 1437 training images as the MLP, sampled with replacement; loss = "
        "cross-entropy on the whole training set",
        quick={
            "batch_sizes": (4, 8, 16, 64),
            "lrs": (0.4, 0.2),
            "loss_targets": (0.5,),
            "max_steps": 400,
        },
    ),
    "digits_vae": TaskSpec(
        name="digits_vae",
        title="VAE on scikit-learn digits",
        batch_sizes=(8, 16, 32, 64, 128, 256, 512),
        lrs=(0.064, 0.032, 0.016, 0.008, 0.004, 0.002),
        loss_targets=(30.0, 27.0, 26.0, 25.0),
        max_steps=8000,
        max_examples=400_000,
        optimizer="Adam",
        seeds=2,
        description="64-64-(8+8) encoder, 8-64-64 Bernoulli decoder, Adam, the same 1437 "
        "training images (pixels in [0, 1]) sampled with replacement, one reparameterised draw "
        "per image; loss = negative ELBO (nats per image) on the whole training set with the "
        "evaluation's noise fixed",
        quick={
            "batch_sizes": (8, 32, 128, 512),
            "lrs": (0.032, 0.016, 0.008),
            "loss_targets": (26.0,),
            "max_steps": 400,
        },
    ),
    "cartpole": TaskSpec(
        name="cartpole",
        title="REINFORCE on CartPole (reinforcement learning)",
        shown_units="episodes",
        batch_sizes=(2, 4, 8, 16, 32, 64, 128),
        lrs=(0.64, 0.32, 0.16, 0.08, 0.04, 0.02, 0.01, 0.005, 0.0025),
        loss_targets=(400.0, 250.0, 100.0),
        max_steps=3000,
        max_examples=60_000,
        optimizer="Adam",
        seeds=3,
        description="4-32-2 tanh policy, REINFORCE with a learned state-value baseline, discounted "
        "reward-to-go (γ = 0.99), Adam, gymnasium's CartPole-v1; the batch is episodes (each "
        "update plays B fresh episodes with the current policy; one episode is one example); "
        "loss = 500 − mean return of 32 evaluation episodes with fixed random numbers (the "
        "negative return, shifted by CartPole's maximum return of 500)",
        quick={
            # B_crit is a few episodes: a reduced sweep needs the small batches and 3 seeds
            "batch_sizes": (2, 4, 8, 16, 32),
            "lrs": (0.08, 0.04),
            "loss_targets": (400.0, 250.0),
            "seeds": 3,
            "max_steps": 100,
        },
    ),
}


def make_trainer(spec: TaskSpec, seed: int, sampler_seed: int) -> Trainer:
    """A fresh model at the task's fixed initialisation, with its own batch sampler."""
    torch.set_num_threads(1)
    if spec.name == "lsq":
        return LeastSquares(seed, sampler_seed, LSQ_D, LSQ_SIGMA, LSQ_KAPPA, spec.micro_batches)
    if spec.name == "digits":
        return DigitsMLP(seed, sampler_seed, hidden=64, k=spec.micro_batches)
    if spec.name == "charlm":
        return CharLM(
            seed,
            sampler_seed,
            context=spec.tokens_per_example,
            d=64,
            heads=4,
            layers=2,
            k=spec.micro_batches,
            eval_sequences=48,
        )
    if spec.name == "digits_cnn":
        return domains.DigitsCNN(seed, sampler_seed, k=spec.micro_batches)
    if spec.name == "digits_vae":
        return domains.DigitsVAE(seed, sampler_seed, k=spec.micro_batches)
    if spec.name == "cartpole":
        return domains.CartPoleReinforce(seed, sampler_seed, k=spec.micro_batches)
    raise ValueError(f"unknown task {spec.name!r}; choose from {sorted(TASKS)}")


def is_finite(x: float) -> bool:
    return math.isfinite(x)
