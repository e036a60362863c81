"""Per-call cost of MLflow's ``log_metric`` and wandb's ``run.log``, for log_overhead.py.

Runs inside the competitors' venv that ``benchmarks/_venv.py`` makes (``PINS``),
never in the project venv, and prints one JSON object on the last line of stdout:
``{"name", "version", "n", "p50_us", "p99_us", "mean_us", "note"}``.

    python benchmarks/_log_competitors.py wandb-offline 20000
    python benchmarks/_log_competitors.py mlflow-async 20000 --tracking-uri http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    n = len(ordered)
    return {
        "n": n,
        "p50_us": ordered[n // 2] / 1e3,
        "p99_us": ordered[min(n - 1, int(n * 0.99))] / 1e3,
        "mean_us": sum(ordered) / n / 1e3,
        "max_ms": ordered[-1] / 1e6,
        "over_1ms": sum(1 for t in ordered if t > 1_000_000),
    }


def bench_wandb(n: int) -> dict[str, object]:
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("WANDB_DIR", tempfile.mkdtemp(prefix="wandb-bench-"))
    import wandb

    run = wandb.init(project="noisescope-bench", dir=os.environ["WANDB_DIR"])
    clock = time.perf_counter_ns
    times = [0] * n
    log = run.log
    for step in range(n):
        payload = {"b_small": 8.0, "b_big": 64.0, "g_small_sq": 2.0 + step, "g_big_sq": 1.0}
        started = clock()
        log(payload, step=step)
        times[step] = clock() - started
    run.finish()
    return {
        "name": "wandb offline run.log",
        "version": wandb.__version__,
        "note": "one dict of 4 values per call",
        **percentiles(times),
    }


def bench_mlflow(n: int, uri: str, synchronous: bool) -> dict[str, object]:
    # Batch the async queue (default: one request per point, which takes minutes to drain).
    os.environ.setdefault("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("noisescope-bench")
    clock = time.perf_counter_ns
    times = [0] * n
    with mlflow.start_run():
        log_metric = mlflow.log_metric
        for step in range(n):
            started = clock()
            log_metric("g_small_sq", 2.0 + step, step=step, synchronous=synchronous)
            times[step] = clock() - started
    return {
        "name": f"mlflow log_metric ({'synchronous' if synchronous else 'synchronous=False'})",
        "version": mlflow.__version__,
        "note": "one metric per call, local mlflow server (SQLite)",
        **percentiles(times),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["wandb-offline", "mlflow-sync", "mlflow-async"])
    parser.add_argument("n", type=int)
    parser.add_argument("--tracking-uri", default="http://127.0.0.1:5000")
    args = parser.parse_args()
    if args.which == "wandb-offline":
        result = bench_wandb(args.n)
    else:
        result = bench_mlflow(args.n, args.tracking_uri, args.which == "mlflow-sync")
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
