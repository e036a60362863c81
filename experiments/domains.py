"""The paper's other domains, sized for a 2-core CPU: an image classifier (a small conv net), a
generative model (a VAE) and reinforcement learning (REINFORCE on CartPole).

McCandlish et al. (2018) show B_simple tracking B_crit on image classification, language
models, Atari and Dota policies and a VAE. These three trainers put one of each family beside
the supervised tasks of ``experiments.tasks``; every one draws its batch i.i.d. (images with
replacement, or fresh episodes from the current policy), so a mean-reduced batch gradient has
covariance Σ/B exactly (docs/science.md eq. 1).

- ``digits_cnn``: a two-layer conv net on the same 1,437 digits images as the MLP, plain SGD;
  the loss is the whole training set's cross-entropy.
- ``digits_vae``: a VAE on the same images (pixels in [0, 1], Bernoulli decoder, 8 latents),
  Adam; the loss is the negative ELBO in nats per image on the whole training set, with the
  reparameterisation noise fixed for evaluation so that the curve is smooth.
- ``cartpole``: REINFORCE with a learned state-value baseline on gymnasium's CartPole-v1 (an
  optional dependency of the experiments only), Adam. The batch is *episodes*: each update
  plays B fresh episodes with the current policy, and one episode's policy-gradient term is one
  example. The loss is 500 − mean return (the negative return, shifted by CartPole's maximum of
  500 so that it stays positive), on 32 evaluation episodes whose random numbers are fixed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from experiments._step import StepResult, measured_step, micro_count

__all__ = [
    "CARTPOLE_MAX_RETURN",
    "CartPoleReinforce",
    "DigitsCNN",
    "DigitsClassifier",
    "DigitsVAE",
    "digits_images",
]


def digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits: the 80 % training split every digits task uses, as
    pixels in [0, 1] (n, 64) and labels (n,)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    idx = order[: int(0.8 * len(order))]
    x = torch.tensor(data.data[idx] / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target[idx], dtype=torch.long)
    return x, y


class _Images:
    """Batches of training images drawn with replacement, split into micro-batches."""

    def __init__(self, sampler_seed: int, k: int) -> None:
        self.x, self.y = digits_images()
        self.gen = torch.Generator().manual_seed(sampler_seed)
        self.k = k

    def micro_slices(self, batch_size: int) -> tuple[list[torch.Tensor], float]:
        k = micro_count(batch_size, self.k)
        m = batch_size // k
        idx = torch.randint(0, len(self.y), (batch_size,), generator=self.gen)
        return [idx[j * m : (j + 1) * m] for j in range(k)], float(m)


class DigitsClassifier(_Images):
    """A classifier of the digits images trained by plain SGD on the cross-entropy; the loss
    is the whole training set's. Subclasses build ``model`` (after seeding torch)."""

    model: nn.Module

    def __init__(self, sampler_seed: int, k: int) -> None:
        super().__init__(sampler_seed, k)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.SGD(self.params, lr=0.1)

    def step(self, batch_size: int, lr: float) -> StepResult:
        slices, m = self.micro_slices(batch_size)

        def micro(sl: torch.Tensor) -> Callable[[], torch.Tensor]:
            return lambda: F.cross_entropy(self.model(self.x[sl]), self.y[sl])

        return measured_step(self.params, self.opt, lr, [micro(sl) for sl in slices], m)

    def eval_loss(self) -> float:
        with torch.no_grad():
            return float(F.cross_entropy(self.model(self.x), self.y))

    def truth(self) -> dict[str, float]:
        return {}


# --------------------------------------------------------------------------------------------
# An image classifier: a small conv net


class DigitsCNN(DigitsClassifier):
    """conv 3x3 (16) → ReLU → conv 3x3 stride 2 (32) → ReLU → linear to 10 classes, plain SGD."""

    def __init__(self, seed: int, sampler_seed: int, k: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 10),
        )
        super().__init__(sampler_seed, k)


# --------------------------------------------------------------------------------------------
# A generative model: a VAE


class _VAE(nn.Module):
    def __init__(self, hidden: int, latents: int) -> None:
        super().__init__()
        self.latents = latents
        self.encoder = nn.Sequential(
            nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 2 * latents)
        )
        self.decoder = nn.Sequential(nn.Linear(latents, hidden), nn.Tanh(), nn.Linear(hidden, 64))

    def negative_elbo(self, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Per image: −E_q[log p(x|z)] + KL(q(z|x) ‖ N(0, I)), one reparameterised draw
        z = μ + σ·ε (Kingma & Welling 2014, eq. 10), Bernoulli likelihood of the pixels."""
        mu, log_var = self.encoder(x).split(self.latents, dim=1)
        z = mu + torch.exp(0.5 * log_var) * eps
        reconstruction = F.binary_cross_entropy_with_logits(
            self.decoder(z), x, reduction="none"
        ).sum(dim=1)
        kl = 0.5 * (mu.pow(2) + log_var.exp() - 1.0 - log_var).sum(dim=1)
        out: torch.Tensor = reconstruction + kl
        return out


class DigitsVAE(_Images):
    """64-64-(8+8) encoder, 8-64-64 Bernoulli decoder, Adam; loss = negative ELBO (nats)."""

    def __init__(self, seed: int, sampler_seed: int, k: int, hidden: int = 64, latents: int = 8):
        super().__init__(sampler_seed, k)
        torch.manual_seed(seed)
        self.model = _VAE(hidden, latents)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.Adam(self.params, lr=1e-3)
        self.noise = torch.Generator().manual_seed(sampler_seed + 1)
        # One fixed draw per training image for evaluation: the curve then moves only with θ.
        self.eval_eps = torch.randn(
            len(self.x), latents, generator=torch.Generator().manual_seed(0)
        )

    def step(self, batch_size: int, lr: float) -> StepResult:
        slices, m = self.micro_slices(batch_size)
        latents = self.model.latents

        def micro(sl: torch.Tensor) -> Callable[[], torch.Tensor]:
            eps = torch.randn(len(sl), latents, generator=self.noise)
            return lambda: self.model.negative_elbo(self.x[sl], eps).mean()

        return measured_step(self.params, self.opt, lr, [micro(sl) for sl in slices], m)

    def eval_loss(self) -> float:
        with torch.no_grad():
            return float(self.model.negative_elbo(self.x, self.eval_eps).mean())

    def truth(self) -> dict[str, float]:
        return {}


# --------------------------------------------------------------------------------------------
# Reinforcement learning: REINFORCE with a baseline on CartPole

CARTPOLE_MAX_RETURN = 500.0
#: Discount of the reward-to-go; the return that defines the loss is undiscounted.
GAMMA = 0.99
#: Scale of the per-episode objective, so learning rates read like the supervised tasks'.
ADVANTAGE_SCALE = 1.0 / 100.0
#: The baseline is a state-value network fitted to earlier updates' episodes only: the episodes
#: of one batch stay independent given the policy and the baseline, so their policy-gradient
#: terms are i.i.d. examples. It is fitted by this many Adam steps per update.
VALUE_STEPS = 5
VALUE_LR = 1e-2


def _require_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as exc:  # an optional dependency of the experiments, never of noisescope
        raise ImportError(
            "the cartpole task needs gymnasium: pip install 'gymnasium>=1.0' "
            "(an optional dependency of python -m experiments, not of noisescope)"
        ) from exc
    return gymnasium


class CartPoleReinforce:
    """A 4-32-2 tanh policy trained by REINFORCE with a learned baseline (Williams 1992;
    Sutton & Barto 2018, sec. 13.4).

    One episode i contributes ℓ_i = −c Σ_t log π(a_t|s_t) (G_t − v(s_t)), G_t the discounted
    reward to go and v a 4-32-1 state-value network fitted to the earlier updates' returns; the
    step's loss is the mean over the batch's episodes, split into micro-batches of episodes for
    the two-batch estimate, as the supervised tasks split images. Only the policy's parameters
    are measured and stepped at the sweep's learning rate; v has its own fixed one.
    """

    def __init__(
        self, seed: int, sampler_seed: int, k: int, hidden: int = 32, eval_episodes: int = 32
    ):
        self.gym = _require_gymnasium()
        torch.manual_seed(seed)
        self.policy = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        self.params = list(self.policy.parameters())
        self.opt = torch.optim.Adam(self.params, lr=1e-2)
        self.value = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=VALUE_LR)
        self.gen = torch.Generator().manual_seed(sampler_seed)
        self.env_seeds = np.random.default_rng(sampler_seed)
        self.k = k
        self.eval_episodes = eval_episodes

    def _play(
        self, episodes: int, env_seed: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
        """``episodes`` episodes in lockstep with the current policy: observations (T, n, 4),
        actions (T, n), alive mask (T, n) and each episode's length (= its return)."""
        envs = self.gym.make_vec(
            "CartPole-v1", num_envs=episodes, vectorization_mode="vector_entry_point"
        )
        try:
            obs, _ = envs.reset(seed=env_seed)
            alive = np.ones(episodes, dtype=bool)
            lengths = np.zeros(episodes)
            seen: list[np.ndarray] = []
            taken: list[torch.Tensor] = []
            masks: list[np.ndarray] = []
            with torch.no_grad():
                for _ in range(int(CARTPOLE_MAX_RETURN)):
                    state = np.asarray(obs, dtype=np.float32)
                    probs = F.softmax(self.policy(torch.from_numpy(state)), dim=1)
                    action = torch.multinomial(probs, 1, generator=gen).squeeze(1)
                    seen.append(state)
                    taken.append(action)
                    masks.append(alive.copy())
                    obs, _, terminated, truncated, _ = envs.step(action.numpy())
                    lengths += alive
                    alive &= ~(np.asarray(terminated) | np.asarray(truncated))
                    if not alive.any():
                        break
        finally:
            envs.close()
        return (
            torch.from_numpy(np.stack(seen)),
            torch.stack(taken),
            torch.from_numpy(np.stack(masks)),
            lengths,
        )

    def step(self, batch_size: int, lr: float) -> StepResult:
        k = micro_count(batch_size, self.k)
        m = batch_size // k
        env_seed = int(self.env_seeds.integers(2**31))
        states, actions, alive, lengths = self._play(batch_size, env_seed, self.gen)
        horizon = states.shape[0]
        # Reward to go from step t of an episode of length L: Σ_{u=t}^{L-1} γ^{u-t}.
        t = torch.arange(horizon, dtype=torch.float32)[:, None]
        left = torch.from_numpy(lengths).float()[None, :] - t
        to_go = torch.where(left > 0, (1 - GAMMA ** left.clamp(min=0)) / (1 - GAMMA), 0.0)
        mask = alive.float()
        with torch.no_grad():
            baseline = self.value(states).squeeze(2) / ADVANTAGE_SCALE
        advantage = (to_go - baseline) * mask * ADVANTAGE_SCALE

        def micro(j: int) -> Callable[[], torch.Tensor]:
            sl = slice(j * m, (j + 1) * m)

            def loss() -> torch.Tensor:
                log_probs = F.log_softmax(self.policy(states[:, sl]), dim=2)
                chosen = log_probs.gather(2, actions[:, sl, None]).squeeze(2)
                per_episode: torch.Tensor = -(chosen * advantage[:, sl]).sum(dim=0)
                return per_episode.mean()

            return loss

        result = measured_step(self.params, self.opt, lr, [micro(j) for j in range(k)], float(m))
        self._fit_value(states, to_go * ADVANTAGE_SCALE, mask)
        # The step's loss as the sweep reads it: the return short of the maximum.
        return dataclasses.replace(result, loss=CARTPOLE_MAX_RETURN - float(lengths.mean()))

    def _fit_value(self, states: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> None:
        """A few regression steps of v towards this batch's (scaled) rewards to go; used from
        the next update on."""
        for _ in range(VALUE_STEPS):
            error = (self.value(states).squeeze(2) - target) * mask
            loss = error.pow(2).sum() / mask.sum()
            self.value_opt.zero_grad()
            loss.backward()
            self.value_opt.step()

    def eval_loss(self) -> float:
        """500 − the mean return of ``eval_episodes`` episodes with fixed seeds and fixed
        random actions' numbers (common random numbers: the curve moves with θ, not luck)."""
        _, _, _, lengths = self._play(
            self.eval_episodes, env_seed=0, gen=torch.Generator().manual_seed(0)
        )
        return CARTPOLE_MAX_RETURN - float(lengths.mean())

    def truth(self) -> dict[str, float]:
        return {}
