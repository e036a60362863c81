"""Two real gloo processes on the CPU, forked from the test: each runs ``work(rank)`` inside an
initialised process group; the parent gets their JSON results, rank by rank."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessContext, start_processes

from harness import free_port

WORLD = 2


def _worker(rank: int, port: int, out_dir: str, work: Callable[[int], dict[str, Any]]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        # torchrun's variables too: DeepSpeed reads them
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # no hostname lookup (slow offline)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(work(rank)))
    finally:
        dist.destroy_process_group()


def on_two_ranks(work: Callable[[int], dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    """fork: the children inherit the parent's imports (import what the wrappers import lazily
    before calling: torch._dynamo takes many seconds per process on a busy 2-core machine).
    Nothing here has started threads that a fork could break: no DataLoader workers, no CUDA."""
    # torch's start_processes has no annotations (with join=False it returns the context)
    context: ProcessContext | None = start_processes(
        _worker,
        args=(free_port(), str(out_dir), work),
        nprocs=WORLD,
        join=False,
        start_method="fork",
    )
    assert context is not None
    try:
        while not context.join():
            pass
    finally:  # a test timeout in the parent must not leave two hung ranks behind
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD)]
