"""A zoo case whose model also uses one of its parameters outside that parameter's module
(issue 54): the per-example source must follow the extra use exactly or leave the step
unmeasured, never count it as zero.

``mutated(case, kind)`` wraps the case's model in ``Mutant``, whose forward (the parent's)
runs the model and then, with a per-example input ``z`` made from the example's own output:

- ``"linear"``: ``F.linear(z, W)`` with the model's first 2-D trainable parameter ``W`` (often
  an embedding table: the tied-head pattern);
- ``"read"``: ``(z * p).sum()`` per example, a direct read of the model's last 1-D trainable
  parameter (a bias or a norm's scale; the last parameter if none is 1-D).

The result shifts each example's logits (by a fixed pattern over the classes), so the loss, and
each example's gradient of the parameter, depends on it. The truth is the mutated model's own
(brute force, ``truth.brute_force_grads``): nothing here is approximate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cases import ZooCase
from .truth import trainable

Kind = Literal["linear", "read"]
KINDS: tuple[Kind, ...] = ("linear", "read")
SCALE = {"linear": 0.5, "read": 2.0}  # the extra use's weight: a visible share of the gradient


def mutated_parameter(model: nn.Module, kind: Kind) -> tuple[str, nn.Parameter]:
    """The parameter a mutation of ``kind`` also uses in the parent's forward, with its name."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if kind == "linear":
        return next((n, p) for n, p in named if p.dim() == 2)
    vectors = [(n, p) for n, p in named if p.dim() == 1]
    return (vectors or named)[-1]


class Mutant(nn.Module):
    """``inner``'s forward, plus one functional use of ``inner``'s parameter ``name``."""

    def __init__(self, inner: nn.Module, kind: Kind) -> None:
        super().__init__()
        self.inner = inner
        self.kind = kind
        self.name, param = mutated_parameter(inner, kind)
        gen = torch.Generator().manual_seed(54)
        shape = (param.shape[1],) if kind == "linear" else tuple(param.shape)
        self.register_buffer("direction", torch.randn(shape, generator=gen).to(param.dtype))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        logits: Tensor = out.logits if hasattr(out, "logits") else out
        param = self.inner.get_parameter(self.name)
        b, classes = logits.shape[0], logits.shape[-1]
        s = logits.flatten(1).mean(1)  # (b,): the example's own
        direction = self.get_buffer("direction")
        z = torch.tanh(direction * (1.0 + s.view(b, *[1] * direction.dim())))
        if self.kind == "linear":
            extra = F.linear(z.to(param.dtype), param).sum(1) / param.shape[0] ** 0.5
        else:
            extra = (z * param).flatten(1).sum(1)
        # each class's logit moves by its own amount: a shared shift would leave the loss alone
        spread = torch.cos(1.3 * torch.arange(classes, device=logits.device) + 0.5)
        shift = SCALE[self.kind] * extra.view(b, *[1] * (logits.dim() - 1)) * spread
        if hasattr(out, "logits"):
            out.logits = logits + shift.to(logits.dtype)
            return out
        return logits + shift.to(logits.dtype)


def mutated(case: ZooCase, kind: Kind, n: int | None = None) -> ZooCase:
    """``case`` with its model wrapped in ``Mutant`` (the same parameters, in the same order)
    and, with ``n``, only its first ``n`` examples (a cheaper truth)."""
    model = Mutant(case.model, kind)
    assert trainable(model) == trainable(case.model)
    keep = slice(None) if n is None else slice(0, n)
    return dataclasses.replace(
        case,
        name=f"{case.name}+{kind}",
        model=model,
        data=tuple(d[keep] for d in case.data),
        counts=case.counts[keep],
    )
