"""Client CPU per sample through the sender, and the client-driven end-to-end rate.

The sender's thread shares the training process's GIL, so what a sample costs the training
process is its whole CPU per sample: the ``log_sample`` call, the column conversion, the JSON
encoding, compression and the HTTP request. Each figure is a process's CPU time
(``time.process_time``: every thread) over the samples it delivered.

1. *Per stage*, on batches of ``batch_max`` samples in this process: conversion to
   columns, JSON encoding (orjson, and the standard library the client falls back to), gzip at
   level 1 (now) and 5 (before).
2. *Through the client*: a child process logs samples as fast as it can into a real server and
   ``finish()``es (everything acknowledged); its CPU per sample, in three configurations: the
   client as shipped (orjson if installed, no gzip to a loopback server), the standard
   library's encoder, and the configuration before (standard library, gzip level 5 always).
3. *End to end*: 4 such processes into one server, samples/s from start to the last
   acknowledgement, beside the same number of processes POSTing pre-encoded batches of the
   same size (``benchmarks.ingest.http_rate``) into the same server.

    python -m benchmarks.client_cpu [--quick]
"""

from __future__ import annotations

import gzip
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _cli
from noisescope import Settings

#: The client's samples per POST (``batch_max``), for the stage costs and the pre-encoded rate.
BATCH = Settings().batch_max
CONFIGS = {
    "shipped": "as shipped (orjson, no gzip on loopback)",
    "stdlib": "standard-library JSON, no gzip on loopback",
    "before": "standard-library JSON, gzip level 5 always (the encoding before this version)",
}


def _samples(n: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [
        (1.0 + 40.0 / 64 + rng.random(), 1.0 + 40.0 / 256 + 0.2 * rng.random()) for _ in range(n)
    ]


def _cpu_us(fn: Any, samples: int, reps: int) -> float:
    """Least CPU µs per sample of ``reps`` calls of ``fn`` (each handles ``samples``)."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - started) / reps / samples * 1e6)
    return best


def stage_costs() -> dict[str, float]:
    from noisescope import _json, _request

    wire_json: Any = _json  # the benchmark swaps its optional orjson module out and back
    from noisescope._records import new_sample, rows_to_columns

    norms = _samples(BATCH, 1)
    rows = [
        new_sample((i, i, i * 256.0, 64.0, 256.0, g_s, g_b, 2.0 / (1 + 1e-3 * i), 0.1,
                    1.7646e9 + i * 1.234e-3, ""))
        for i, (g_s, g_b) in enumerate(norms)
    ]  # fmt: skip
    columns, _ = rows_to_columns(rows)
    body = _request.encode_columns(columns)
    costs = {"conversion to columns": _cpu_us(lambda: rows_to_columns(rows), BATCH, 200)}
    if wire_json.orjson is not None:
        costs["JSON encoding (orjson)"] = _cpu_us(
            lambda: _request.encode_columns(columns), BATCH, 200
        )
    saved = wire_json.orjson
    wire_json.orjson = None
    try:
        costs["JSON encoding (standard library)"] = _cpu_us(
            lambda: _request.encode_columns(columns), BATCH, 100
        )
    finally:
        wire_json.orjson = saved
    for level in (1, 5):
        costs[f"gzip level {level}"] = _cpu_us(
            lambda lvl=level: gzip.compress(body, lvl), BATCH, 50
        )
    costs["body bytes per sample"] = len(body) / BATCH
    return costs


def _configure(config: str) -> None:
    """Reproduce a configuration in this (child) process."""
    from noisescope import _json, _request
    from noisescope._delivery import _exchange

    if config in ("stdlib", "before"):
        wire_json: Any = _json
        wire_json.orjson = None
    if config == "before":
        _request.GZIP_LEVEL = 5
        _exchange.is_loopback = lambda url: False  # type: ignore[attr-defined]  # gzip always


def _log_child(args: tuple[str, str, int, str, Any, Any]) -> None:
    url, spool, n, config, barrier, results = args
    import noisescope

    _configure(config)
    norms = _samples(n, 7)
    run = noisescope.init(
        url=url, project="bench", task="client-cpu", dir=spool, quiet=True, flush_timeout=600.0
    )
    if barrier is not None:
        barrier.wait()
    wall = time.perf_counter()
    cpu = time.process_time()
    log_sample = run.log_sample
    for step, (g_small_sq, g_big_sq) in enumerate(norms):
        log_sample(step, 64.0, 256.0, g_small_sq, g_big_sq, loss=2.0 / (1 + 1e-3 * step))
    status = run.finish()
    results.put(
        {
            "cpu_us": (time.process_time() - cpu) / n * 1e6,
            "wall_s": time.perf_counter() - wall,
            "sent": status.sent,
            "dropped": status.dropped,
        }
    )


def _children(url: str, n: int, config: str, clients: int) -> tuple[list[dict[str, Any]], float]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    results = ctx.Queue()
    spool = tempfile.mkdtemp(prefix="ns-cpu-spool-")
    procs = [
        ctx.Process(target=_log_child, args=((url, spool, n, config, barrier, results),))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    started = time.perf_counter()
    answers = [results.get(timeout=900) for _ in procs]
    took = time.perf_counter() - started
    for p in procs:
        p.join(60)
    if any(a["sent"] != n or a["dropped"] for a in answers):
        raise RuntimeError(f"a client did not deliver everything: {answers}")
    return answers, took


def measure(quick: bool) -> dict[str, Any]:
    from benchmarks.ingest import http_rate
    from harness import ServerProcess

    n = 20_000 if quick else 100_000
    clients = 4
    out: dict[str, Any] = {"stages": stage_costs(), "n": n, "clients": clients}
    with tempfile.TemporaryDirectory(prefix="ns-cpu-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'cpu.db'}"
        with ServerProcess(database_url=db) as server:
            cpu: dict[str, list[float]] = {}
            for config in CONFIGS:  # one client at a time: its CPU, not the machine's load
                runs = [_children(server.url, n, config, 1)[0][0] for _ in range(3)]
                cpu[config] = [r["cpu_us"] for r in runs]
            out["cpu"] = cpu
            answers, took = _children(server.url, n, "shipped", clients)
            out["e2e_rate"] = clients * n / took
            out["e2e_cpu_us"] = statistics.median(a["cpu_us"] for a in answers)
            out["pre_encoded_rate"] = http_rate(server, clients * n, BATCH, clients)
    return out


TITLE = "Client: CPU per sample through the sender"


def render(result: dict[str, Any], quick: bool) -> str:
    stages = result["stages"]
    lines = [
        f"## {TITLE}",
        "",
        f"`python -m benchmarks.client_cpu{' --quick' if quick else ''}`. "
        "Client CPU per sample (`time.process_time` of the process, every thread: the call, "
        "conversion, encoding, compression, HTTP), the cost the training process pays:",
        "",
        f"| stage, on batches of {BATCH} samples (`batch_max`) | CPU µs/sample |",
        "|---|---:|",
    ]
    for name, value in stages.items():
        if name != "body bytes per sample":
            lines.append(f"| {name} | {value:.2f} |")
    lines.append(f"| (body: {stages['body bytes per sample']:.0f} bytes/sample) | |")
    lines += [
        "",
        f"| through the client: one process logs {result['n']:,} samples as fast as it can "
        "into a local server, finish() waits for every acknowledgement | CPU µs/sample "
        "(median of 3, range) |",
        "|---|---:|",
    ]
    for config, label in CONFIGS.items():
        values = result["cpu"][config]
        lines.append(
            f"| {label} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) |"
        )
    shipped = statistics.median(result["cpu"]["shipped"])
    stdlib = statistics.median(result["cpu"]["stdlib"])
    lines += [
        "",
        f"Client CPU per sample as shipped: {shipped:.2f} µs; {stdlib:.2f} µs without orjson. "
        "Its target is judged beside the previous version, in one run "
        '("Client: this version beside the previous one").',
        "",
        f"| {result['clients']} processes into one server (SQLite, 1 worker), batches of "
        f"{BATCH} | samples/s |",
        "|---|---:|",
        f"| through the client (`log_sample` ... `finish()`), as shipped; client CPU "
        f"{result['e2e_cpu_us']:.2f} µs/sample | {result['e2e_rate']:,.0f} |",
        f"| pre-encoded JSON batches POSTed directly (`benchmarks.ingest.http_rate`) "
        f"| {result['pre_encoded_rate']:,.0f} |",
        "",
        "All processes share this machine's 2 cores with the server, so the end-to-end rate is "
        "the server's and the clients' CPU together; the CPU figures are the client's alone. "
        "A client logging faster than the server takes samples spills them to its spool and "
        "replays them (the crash-loss bound): that path is inside the figures above.",
    ]
    return "\n".join(lines) + "\n"


def run(quick: bool) -> str:
    return render(measure(quick), quick)


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.client_cpu", __doc__, run))
