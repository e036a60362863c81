"""What the per-example hooks record of each call of a measured module (a *use*), and where its
rows come from: batch-first, batch-less (one value for every example), or routed (rows picked
out of the batch, each row's example known from the autograd graph)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ._factors import Factor


class Unsupported(Exception):
    """This step's per-example norms cannot be computed exactly (the message says why).
    ``retry``: the next steps can be (the layer moved to torch.func), only this one is lost."""

    def __init__(self, reason: str, retry: bool = False) -> None:
        super().__init__(reason)
        self.retry = retry


def tensor_at(module: nn.Module, name: str) -> Tensor:
    """A module's tensor by its dotted name below it (``weight``, ``out_proj.weight``,
    ``parametrizations.weight.original0``)."""
    *path, last = name.split(".")
    for part in path:
        module = getattr(module, part)
    t = getattr(module, last)
    assert isinstance(t, Tensor)
    return t


class Entry:
    """One hooked module: the parameters its uses account for and the rule that gives their
    per-example norms (``_layers.RULES``, or ``func``: torch.func over the module)."""

    def __init__(self, module: nn.Module, label: str, params: list[tuple[str, int]], kind: str):
        self.module = module
        self.label = label
        self.params = params  # (dotted name below the module, global parameter index)
        self.kind = kind
        self.names = dict(params)
        self.loop = False  # torch.func: vmap failed on this module, one example at a time
        self.checked = False  # affine_norm: its output checked to be weight * x_hat + bias
        self.formula: tuple[bool, float] | None = None  # affine_norm: (centred, eps) of x_hat
        self.norm_dim = -1  # affine_norm: the normalized dimension the weight scales
        self.host_checks = 3  # batch-less uses: steps left to check on the host (_broadcast)

    def checking(self) -> bool:
        """Whether this use of a batch-less output is checked on the host (the first few)."""
        self.host_checks -= 1
        return self.host_checks >= 0

    def add(self, name: str, idx: int) -> None:
        self.params.append((name, idx))
        self.names[name] = idx

    def drop(self, idx: int) -> None:
        self.params = [(n, i) for n, i in self.params if i != idx]
        self.names = dict(self.params)


class Use:
    """One call of a hooked module in a forward pass."""

    def __init__(
        self, serial: int, entry: Entry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.serial = serial
        self.entry = entry
        self.args = args
        self.kwargs = kwargs
        self.batch_less = False  # the input has no batch dimension (positions, buffers)
        self.ids: Tensor | None = None  # an embedding's (B, T) ids, known at the forward
        self.rows: Tensor | None = None  # routed: the example of each input row
        self.factors: dict[int, Factor] = {}  # parameter index -> its gradient, once done
        self.done = False
        self.swap = False  # ``W @ x``: activations and output gradients transposed


def in_backward() -> bool:
    """Inside a backward pass (a forward recomputed by gradient checkpointing); never while
    traced by torch.compile, where the call would break the graph."""
    if torch.compiler.is_compiling():
        return False
    return bool(torch._C._current_graph_task_id() != -1)


def first_tensor(args: Sequence[Any], kwargs: dict[str, Any]) -> Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor) and a.dim() > 0:
            return a
    return None


def first_output(output: Any) -> Any:
    """A module's main output: itself, the first of a tuple, or the first value of a mapping
    (Hugging Face's ``ModelOutput``: ``last_hidden_state``)."""
    if isinstance(output, (tuple, list)):
        return output[0] if output else None
    if isinstance(output, Mapping):
        return next(iter(output.values()), None)
    return output


def from_parameters(t: Tensor, steps: int = 8) -> bool:
    """Whether ``t`` is computed from parameters alone (DeBERTa's relative-position table, read
    as ``self.rel_embeddings.weight``): no batch behind it. A tensor that did come from the
    batch and is taken for batch-less here fails ``_broadcast``'s checks, never a wrong
    number: its examples' gradients would not add up to its own."""
    if isinstance(t, nn.Parameter):
        return True
    frontier = [t.grad_fn] if t.grad_fn is not None else []
    if not frontier:
        return False
    for _ in range(steps):
        later = []
        for fn in frontier:
            if type(fn).__name__ == "AccumulateGrad":
                continue
            if type(fn).__name__.startswith("Embedding"):
                return False  # rows looked up by ids: the ids may be the batch's
            later += [nxt for nxt, _ in fn.next_functions if nxt is not None]
        if not later:
            return True
        frontier = later
    return False


def routed_rows(x: Tensor, batch: int) -> Tensor | None:
    """The example of each row of ``x`` when its rows were picked out of a batch-first tensor
    (``h[mask]``, ``h[b_idx, t_idx]``: an expert's tokens) or flattened out of it
    (``h.reshape(-1, d)``: OPT's tokens), found in the autograd graph: the nearest such indexing
    or view of a (batch, ...) tensor giving exactly ``x``'s number of rows, behind at most a few
    row-wise ops. None when there is none: then the rows are not known."""
    n = int(x.shape[0]) if x.dim() else -1
    frontier = [x.grad_fn] if x.grad_fn is not None else []
    for _ in range(6):
        later = []
        for fn in frontier:
            kind = type(fn).__name__
            if kind in ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"):
                # (B, T, ..., d) -> (B T ..., d): OPT's norms and MLP on flattened tokens
                sizes = tuple(getattr(fn, "_saved_self_sym_sizes", ()))
                leading = [math.prod(sizes[:k]) for k in range(2, len(sizes))]
                if sizes and sizes[0] == batch and n in leading:
                    return torch.arange(n, device=x.device) // (n // batch)
            if kind == "IndexBackward0":
                # the saved inputs of torch's IndexBackward0 node (not in its type stubs)
                sizes = tuple(getattr(fn, "_saved_self_sym_sizes", ()))
                indices = getattr(fn, "_saved_indices", ())
                first = indices[0] if indices else None
                if sizes and sizes[0] == batch and isinstance(first, Tensor):
                    if first.dtype == torch.bool and tuple(first.shape) == sizes[: first.dim()]:
                        rows = first.nonzero()[:, 0]
                    elif not first.is_floating_point() and first.dim() == 1:
                        rows = first
                    else:
                        rows = None
                    if rows is not None and int(rows.shape[0]) == n:
                        return rows
            later += [nxt for nxt, _ in fn.next_functions if nxt is not None]
        frontier = later
    return None


def by_example(
    rows: Tensor, batch: int, args: tuple[Any, ...], kwargs: dict[str, Any], delta: Tensor
) -> tuple[tuple[Any, ...], dict[str, Any], Tensor]:
    """Rows of a routed layer regrouped per example: (B, most rows of an example, ...), zero
    rows padding the rest (a zero row adds nothing to a row-wise layer's gradient)."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=batch)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(rows)
    slot[order] = torch.arange(rows.shape[0], device=rows.device) - starts[rows[order]]
    width = int(counts.max()) if rows.numel() else 1

    def place(t: Tensor) -> Tensor:
        out = t.new_zeros(batch, width, *t.shape[1:])
        out[rows, slot] = t
        return out

    n = int(rows.shape[0])

    def maybe(a: Any) -> Any:
        return place(a) if isinstance(a, Tensor) and a.dim() and a.shape[0] == n else a

    return tuple(maybe(a) for a in args), {k: maybe(v) for k, v in kwargs.items()}, place(delta)


def head(t: Any, keep: int | None, batch: int) -> Any:
    """``t`` detached, cut to its first ``keep`` examples if it is batch-first."""
    if not isinstance(t, Tensor):
        return t
    t = t.detach()
    return t[:keep] if keep is not None and t.dim() and t.shape[0] == batch else t
