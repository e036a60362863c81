"""Train a small MLP on scikit-learn's bundled digits and track its gradient noise scale.

Start the server and dashboard first (``noisescope up``), then::

    python examples/digits.py                 # 4 micro-batches of 16 -> B_small=16, B_big=64
    python examples/digits.py --batch-size 256 --accumulation 8 --name big-batch

The data ships inside scikit-learn (1,797 8x8 images), so nothing is downloaded. The
gradient-accumulation micro-batches give the two batch sizes the noise-scale estimator needs
at no extra compute (docs/science.md, "Where the two batch sizes come from").
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from sklearn.datasets import load_digits
from torch import nn

import noisescope
from noisescope.protocol import format_count
from noisescope.torch import GradientNoiseProbe


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_train = 1500
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        default=None,
        help="server URL (default: $NOISESCOPE_URL, else local)",
    )
    parser.add_argument("--project", default="examples")
    parser.add_argument("--task", default="digits-mlp")
    parser.add_argument("--name", default=None)
    parser.add_argument("--batch-size", type=int, default=64, help="examples per optimizer step")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step (watch live)")
    args = parser.parse_args(argv)
    if args.batch_size % args.accumulation:
        parser.error("--batch-size must be a multiple of --accumulation")
    micro = args.batch_size // args.accumulation

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed + 1)

    with noisescope.init(
        url=args.url,
        project=args.project,
        task=args.task,
        name=args.name or f"bs{args.batch_size}-k{args.accumulation}",
        config=vars(args),
        batch_size=args.batch_size,
        units="examples",
    ) as run:
        probe = GradientNoiseProbe(model, run, source="micro", micro_loss="mean/k")
        for step in range(args.steps):
            idx = torch.randint(len(x_train), (args.batch_size,), generator=gen)
            total = 0.0
            for chunk in torch.split(idx, micro):
                loss = loss_fn(model(x_train[chunk]), y_train[chunk]) / args.accumulation
                loss.backward()
                probe.micro_step(batch_size=len(chunk))
                total += loss.item()
            probe.step(loss=total, lr=args.lr)  # before any clipping or optimizer.step()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 25 == 0 or step == args.steps - 1:
                with torch.no_grad():
                    logits = model(x_test)
                    test_loss = loss_fn(logits, y_test).item()
                    acc = (logits.argmax(1) == y_test).float().mean().item()
                # held-out loss: the smooth curve a batch-size sweep's targets are crossed on
                run.log(step, eval_loss=test_loss)
                if step % 100 == 0 or step == args.steps - 1:
                    print(
                        f"step {step:5d}  loss {total:.4f}  test loss {test_loss:.4f}  "
                        f"test accuracy {acc:.3f}",
                        flush=True,
                    )
            if args.sleep:
                time.sleep(args.sleep)
        print(f"run {run.id} finished; its page on the dashboard shows its noise scale")
    print_verdict(run)


def print_verdict(run: noisescope.Run) -> None:
    """The run's current B_simple and the verdict on its batch size, read back from the server:
    the numbers its dashboard page shows, and what they say about the batch."""
    settings = run.settings
    if settings.mode == "offline":
        print("offline run: `noisescope sync` sends it; its page then shows B_simple")
    if settings.mode != "online":
        return
    try:
        with noisescope.Api(settings.url, token=settings.token) as api:
            advice = api.recommendation(run.id).recommendation
    except noisescope.ApiError as exc:  # e.g. the server went away: the spool keeps the run
        print(f"B_simple not read back: {exc}", file=sys.stderr)
        return
    count = format_count
    if advice.b_simple is not None:
        now = count(advice.b_simple)
        if advice.b_simple_lo is not None and advice.b_simple_hi is not None:
            level = f" ({advice.level:.0%} interval)" if advice.level else ""
            now += f" [{count(advice.b_simple_lo)}, {count(advice.b_simple_hi)}]{level}"
    elif advice.b_simple_lower is not None:
        now = f"≥ {count(advice.b_simple_lower)}"
    else:
        now = advice.reason or "not yet measurable"
    print(f"B_simple now: {now}")
    print(f"verdict at batch {count(advice.batch_size)}: {advice.verdict}")


if __name__ == "__main__":
    main()
