"""Client: cost of ``run.log_sample()`` on the training thread, side by side with a bare
``deque.append`` floor, MLflow's ``log_metric`` (synchronous and ``synchronous=False``) and
wandb's offline ``run.log``.

noisescope runs in-process (online: the background sender really posts to a local noisescope
server, or, if the server distribution cannot start, to an in-process transport that decodes
every batch). MLflow and wandb run as subprocesses of a SEPARATE venv at pinned versions, which
``benchmarks/_venv.py`` creates on first use and reuses (``.bench-venv/``, git-ignored), so that
they never enter the project's venv; each prints its figures as JSON
(``benchmarks/_log_competitors.py``).

    python -m benchmarks.log_overhead [--quick]
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import noisescope
from benchmarks import _cli
from benchmarks._log_competitors import percentiles
from benchmarks._venv import PINS, competitor_python
from harness import ServerProcess, free_port
from noisescope import Request, Response

HERE = Path(__file__).resolve().parent
TARGET_P50_US = 5.0
TARGET_P99_US = 50.0
TARGET_RATIO = 10.0


def _wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status < 500:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


class _DecodingTransport:
    """Stand-in server when the real one is unavailable: decodes each body, answers 200."""

    def handle_request(self, request: Request) -> Response:
        body = request.body or b""
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        payload = json.loads(body) if body else {}
        n = len(payload.get("columns", {}).get("seq", []))
        return Response(200, json.dumps({"received": n, "inserted": n}).encode())

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _noisescope_server(workdir: Path) -> Iterator[str | None]:
    """A real local noisescope server (SQLite), or None if it cannot start here."""
    server = ServerProcess(database_url=f"sqlite:///{workdir / 'bench.db'}")
    try:
        server.start()
    except (RuntimeError, TimeoutError):
        yield None
        return
    try:
        yield server.url
    finally:
        server.close()


def measure_floor(n: int) -> dict[str, Any]:
    """``deque.append`` of the same five values inside a Python function: the floor."""
    buffer: deque[tuple[Any, ...]] = deque()
    append = buffer.append

    def log_sample(step: int, b_small: float, b_big: float, g_small: float, g_big: float) -> None:
        append((step, b_small, b_big, g_small, g_big))

    clock = time.perf_counter_ns
    times = [0] * n
    for step in range(n):
        started = clock()
        log_sample(step, 8.0, 64.0, 2.0, 1.0)
        times[step] = clock() - started
    return {"name": "bare `deque.append` in a function (floor)", **percentiles(times)}


def measure_noisescope(n: int, url: str | None, workdir: Path) -> list[dict[str, Any]]:
    run = noisescope.init(
        url=url or "http://127.0.0.1:9",
        project="bench",
        task="log_overhead",
        dir=workdir / "spool",
        quiet=True,
        transport=None if url else _DecodingTransport(),
        flush_timeout=120.0,
    )
    clock = time.perf_counter_ns
    sample_times = [0] * n
    log_times = [0] * n
    log_sample = run.log_sample
    log = run.log
    for step in range(n):
        started = clock()
        log_sample(step, 8.0, 64.0, 2.0 + step * 1e-6, 1.0)
        middle = clock()
        log(step, loss=0.5)
        sample_times[step] = middle - started
        log_times[step] = clock() - middle
    status = run.finish()
    where = "real server" if url else "in-process decoding transport"
    note = f"sender online ({where}); sent {status.sent}/{n}, dropped {status.dropped}"
    return [
        {"name": "noisescope `run.log_sample()`", "note": note, **percentiles(sample_times)},
        {"name": "noisescope `run.log(step, loss=)`", "note": note, **percentiles(log_times)},
    ]


@contextlib.contextmanager
def _mlflow_server(python: Path, workdir: Path) -> Iterator[str | None]:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    command = [
        str(python), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
        "--default-artifact-root", str(workdir / "mlartifacts"), "--workers", "1",
    ]  # fmt: skip
    log = open(workdir / "mlflow-server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        ok = _wait_http(uri + "/health", 120) and proc.poll() is None
        yield uri if ok else None
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        log.close()


def measure_competitor(
    python: Path, which: str, n: int, workdir: Path, uri: str = ""
) -> dict[str, Any]:
    command = [str(python), str(HERE / "_log_competitors.py"), which, str(n)]
    if uri:
        command += ["--tracking-uri", uri]
    env = dict(os.environ, WANDB_DIR=str(workdir), MLFLOW_TRACKING_URI=uri or "")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=1800, env=env, cwd=workdir
        )
    except subprocess.TimeoutExpired:
        return {"name": which, "error": "timed out after 30 min"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"name": which, "error": f"exit {done.returncode}: {' | '.join(tail)[:300]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def collect(quick: bool) -> list[dict[str, Any]]:
    n_ours = 100_000 if not quick else 20_000
    n_wandb = 50_000 if not quick else 2_000
    n_async = 20_000 if not quick else 2_000
    n_sync = 500 if not quick else 100
    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="ns-log-bench-"))
    try:
        with _noisescope_server(workdir) as url:
            rows.append(measure_floor(n_ours))
            rows.extend(measure_noisescope(n_ours, url, workdir))
        python, why_not = competitor_python()
        if python is None:
            for name in ("wandb offline run.log", "mlflow log_metric"):
                rows.append({"name": name, "error": why_not})
            return rows
        rows.append(measure_competitor(python, "wandb-offline", n_wandb, workdir))
        with _mlflow_server(python, workdir) as uri:
            if uri is None:
                rows.append({"name": "mlflow log_metric", "error": "mlflow server did not start"})
            else:
                rows.append(measure_competitor(python, "mlflow-async", n_async, workdir, uri))
                rows.append(measure_competitor(python, "mlflow-sync", n_sync, workdir, uri))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def run(quick: bool) -> str:
    rows = collect(quick)
    ours = next(r for r in rows if r["name"].startswith("noisescope `run.log_sample"))
    others = [
        r for r in rows if "error" not in r and not r["name"].startswith(("noisescope", "bare"))
    ]
    lines = [
        "## Client: log() cost on the training thread",
        "",
        f"`python -m benchmarks.log_overhead{' --quick' if quick else ''}`: per-call wall time "
        "on the calling thread (`perf_counter_ns` around each call, timer overhead included "
        "in every row alike). Ratios are the other tool's time over noisescope "
        "`log_sample()`'s, from this one run.",
        "",
        "| call | version | calls | p50 µs | p99 µs | mean µs | max ms | calls > 1 ms "
        "| p50 ratio | p99 ratio | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | | | | | {r['error']} |")
            continue
        default_version = noisescope.__version__ if r["name"].startswith("noisescope") else ""
        lines.append(
            f"| {r['name']} | {r.get('version', default_version)} "
            f"| {r['n']:,} | {r['p50_us']:.2f} | {r['p99_us']:.2f} | {r['mean_us']:.2f} "
            f"| {r.get('max_ms', float('nan')):.1f} | {r.get('over_1ms', '')} "
            f"| {r['p50_us'] / ours['p50_us']:.1f}× | {r['p99_us'] / ours['p99_us']:.1f}× "
            f"| {r.get('note', '')} |"
        )
    lines.append("")
    verdicts = [
        f"median {ours['p50_us']:.2f} µs (target < {TARGET_P50_US:g}: "
        f"{'met' if ours['p50_us'] < TARGET_P50_US else 'MISSED'})",
        f"p99 {ours['p99_us']:.2f} µs (target < {TARGET_P99_US:g}: "
        f"{'met' if ours['p99_us'] < TARGET_P99_US else 'MISSED'})",
    ]
    if others:
        fastest = min(others, key=lambda r: r["p50_us"])
        ratio = fastest["p50_us"] / ours["p50_us"]
        verdicts.append(
            f"{ratio:.0f}× faster at the median than the fastest other tool, {fastest['name']} "
            f"(target ≥ {TARGET_RATIO:g}×: {'met' if ratio >= TARGET_RATIO else 'MISSED'})"
        )
    lines.append("noisescope `log_sample()`: " + "; ".join(verdicts) + ".")
    lines.append("")
    lines.append(
        "MLflow's async mode is run with `MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS=1` so its "
        "queue drains in reasonable time; synchronous MLflow gets fewer calls because each "
        "is an HTTP round trip. wandb and MLflow run as subprocesses from their own venv "
        f"({', '.join(f'`{pin}`' for pin in PINS)}; made by `benchmarks/_venv.py`)."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.log_overhead", __doc__, run))
