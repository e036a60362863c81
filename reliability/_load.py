"""Load and fault scenarios: N simulated training runs (separate processes) against a real
server, optionally while the server is SIGKILLed and restarted or PostgreSQL is restarted."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliability._client import ClientSpec
from reliability._infra import (
    MemorySampler,
    Server,
    Worker,
    engine_for,
    start_worker,
    sync_spool,
    wait_workers,
)
from reliability._reconcile import Reconciliation, reconcile


@dataclass
class LoadResult:
    backend: str
    runs: int
    samples: int
    rate: float
    workers: int
    wall_s: float
    acknowledged: int
    spooled_at_finish: int
    dropped: int
    latencies: list[float]
    server_rss_peak: int
    server_rss_last: int
    max_log_call_s: float
    recon: Reconciliation
    sync_output: str = ""
    faults: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: What the clients' requests got: HTTP status -> count, and "no answer" (refused, reset).
    answers: dict[str, int] = field(default_factory=dict)

    def answers_line(self) -> str:
        """e.g. "200: 3,120; 503: 4; no answer: 12" (every request the clients made)."""
        keys = sorted(self.answers, key=lambda k: (not k.isdigit(), k))
        return "; ".join(f"{k}: {self.answers[k]:,}" for k in keys) or "none"

    @property
    def throughput(self) -> float:
        return self.recon.stored / self.wall_s if self.wall_s > 0 else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=1000, method="inclusive")[
            min(998, max(0, round(q * 1000) - 1))
        ]

    @property
    def ok(self) -> bool:
        return self.recon.exact and not self.problems and self.dropped == 0


Injector = Callable[[Server, threading.Event], list[str]]


def run_load(
    server: Server,
    *,
    backend: str,
    workdir: Path,
    runs: int,
    samples: int,
    rate: float,
    project: str = "load",
    token: str | None = None,
    injector: Injector | None = None,
    time_limit: float = 1800.0,
    flush_timeout: float = 120.0,
) -> LoadResult:
    """Start ``runs`` client processes logging ``samples`` each at ``rate``/s (0: unpaced),
    run ``injector`` (faults) beside them, sync what they spooled, and reconcile by SQL."""
    spool = workdir / "spool"
    spool.mkdir(exist_ok=True)
    specs = [
        ClientSpec(
            url=server.url,
            run_id=uuid.uuid4().hex,
            project=project,
            task=f"task{i % 4}",
            samples=samples,
            spool_dir=str(spool),
            out=str(workdir / f"result-{i}.json"),
            rate=rate,
            seed=i,
            token=token,
            flush_timeout=flush_timeout,
        )
        for i in range(runs)
    ]
    faults: list[str] = []
    problems: list[str] = []
    done = threading.Event()
    fault_thread: threading.Thread | None = None
    with MemorySampler(server) as memory:
        t0 = time.monotonic()
        workers: list[Worker] = [start_worker(s, workdir) for s in specs]
        if injector is not None:

            def _inject() -> None:
                try:
                    faults.extend(injector(server, done))
                except Exception as exc:  # report, never hang the harness
                    problems.append(f"fault injector failed: {exc!r}")

            fault_thread = threading.Thread(target=_inject, daemon=True)
            fault_thread.start()
        problems += wait_workers(workers, t0 + time_limit)
        done.set()
        if fault_thread is not None:
            fault_thread.join(300)
        wall = time.monotonic() - t0
    results = [w.result() for w in workers]
    if server.proc is None or server.proc.poll() is not None:
        server.restart()  # a fault may have left it down
    spooled = sum(int(r["spooled"]) for r in results if r)
    sync_output = ""
    if spooled or any(r is None for r in results):
        code, sync_output = sync_spool(spool, server.url, token)
        if code != 0:
            problems.append(f"noisescope sync failed: {sync_output[-400:]}")
    engine = engine_for(server.database_url)
    try:
        recon = reconcile(engine, [(s.run_id, s.seed, s.samples) for s in specs])
    finally:
        engine.dispose()
    latencies = [x for r in results if r for x in r["latencies"]]
    answers: dict[str, int] = {}
    for r in results:
        for key, n in (r or {}).get("statuses", {}).items():
            answers[key] = answers.get(key, 0) + int(n)
        if r and r.get("transport_errors"):
            answers["no answer"] = answers.get("no answer", 0) + int(r["transport_errors"])
    return LoadResult(
        backend=backend,
        runs=runs,
        samples=samples,
        rate=rate,
        workers=server.workers,
        wall_s=wall,
        acknowledged=sum(int(r["sent"]) for r in results if r),
        spooled_at_finish=spooled,
        dropped=sum(int(r["dropped"]) for r in results if r),
        latencies=latencies,
        server_rss_peak=memory.peak_bytes,
        server_rss_last=memory.last_bytes,
        max_log_call_s=max((float(r["max_log_call_s"]) for r in results if r), default=0.0),
        recon=recon,
        sync_output=sync_output,
        faults=faults,
        problems=problems
        + [f"client result missing for {i}" for i, r in enumerate(results) if r is None],
        answers=answers,
    )


def server_kills(times: int, every_s: float, down_s: float) -> Injector:
    """SIGKILL the server ``times`` times, ``every_s`` apart, each down for ``down_s``."""

    def inject(server: Server, done: threading.Event) -> list[str]:
        events: list[str] = []
        for k in range(times):
            if done.wait(every_s):
                break
            t = time.monotonic()
            server.crash_and_restart(down_s)
            events.append(f"server SIGKILL #{k + 1}, back after {time.monotonic() - t:.1f} s")
        return events

    return inject


def postgres_restarts(times: int, every_s: float) -> Injector:
    """Restart the PostgreSQL cluster ``times`` times during the load (full size only)."""

    def inject(server: Server, done: threading.Event) -> list[str]:
        from reliability._infra import restart_postgres

        events: list[str] = []
        for k in range(times):
            if done.wait(every_s):
                break
            took = restart_postgres()
            events.append(f"PostgreSQL restart #{k + 1} ({took:.1f} s)")
        return events

    return inject


def summary_row(r: LoadResult, label: str) -> dict[str, Any]:
    return {
        "scenario": label,
        "backend": r.backend,
        "runs x samples": f"{r.runs} x {r.samples:,}",
        "rate/run": "unpaced" if r.rate <= 0 else f"{r.rate:,.0f}/s",
        "wall s": f"{r.wall_s:.1f}",
        "stored/s": f"{r.throughput:,.0f}",
        "p50 ms": f"{r.pct(0.5) * 1e3:.1f}",
        "p99 ms": f"{r.pct(0.99) * 1e3:.1f}",
        "server RSS peak MiB": f"{r.server_rss_peak / 2**20:.0f}",
        "answers": r.answers_line(),
        "reconciliation": r.recon.line(),
        "held": "yes" if r.ok else "NO",
    }
