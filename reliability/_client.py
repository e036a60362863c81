"""One simulated training run, in its own OS process: ``python -m reliability._client SPEC``.

It logs ``samples`` deterministic two-batch measurements through the real client
(``noisescope.init`` / ``run.log_sample`` / ``run.finish``) at ``rate`` samples per second and
writes a JSON result: the client's ``status()``, the latency of every samples POST (timed by a
wrapping transport, so it is what the training job's sender sees), the longest ``log_sample``
call on the training thread, and (``ack_log``) the seq numbers the server acknowledged, appended
as they arrive so that a SIGKILL mid-run still leaves the record of what was acknowledged.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

B_SMALL = 8.0
B_BIG = 32.0


def sample_values(seed: int, i: int) -> tuple[float, float, float]:
    """Deterministic (g_small_sq, g_big_sq, loss) of sample ``i``: the harness recomputes them
    to check that what is stored is what was sent (docs/science.md eq. 1: E|G_B|^2 = |G|^2 +
    tr(Sigma)/B with |G|^2 = 1, tr(Sigma) = 40, plus bounded noise)."""
    g_small_sq = 1.0 + 40.0 / B_SMALL + ((i * 7919 + seed * 31) % 1000) / 1000.0
    g_big_sq = 1.0 + 40.0 / B_BIG + ((i * 104_729 + seed * 17) % 1000) / 4000.0
    loss = 2.0 / (1.0 + 0.001 * i)
    return g_small_sq, g_big_sq, loss


@dataclass
class ClientSpec:
    url: str
    run_id: str
    project: str
    task: str
    samples: int
    spool_dir: str
    out: str
    rate: float = 0.0
    seed: int = 0
    token: str | None = None
    flush_timeout: float = 120.0
    batch_max: int = 1000
    ack_log: str | None = None
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: If set, the index of the sample being logged is written here after each call (the
    #: harness reads how far a SIGKILLed client got: samples before it were committed).
    progress: str | None = None


class TimingTransport:
    """Wraps the client's real ``HTTPTransport``: times each request, logs acknowledged seqs."""

    def __init__(self, inner: Any, ack_log: str | None) -> None:
        self.inner = inner
        self.latencies: list[float] = []
        self.statuses: dict[str, int] = {}
        self.errors = 0
        self._ack_fd = (
            os.open(ack_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if ack_log else None
        )

    def handle_request(self, request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            response = self.inner.handle_request(request)
        except Exception:
            self.errors += 1
            raise
        took = time.perf_counter() - t0
        key = str(response.status)
        self.statuses[key] = self.statuses.get(key, 0) + 1
        is_samples = request.method == "POST" and request.path.endswith("/samples")
        if is_samples and 200 <= response.status < 300:
            self.latencies.append(took)
            if self._ack_fd is not None:
                self._log_ack(request)
        return response

    def _log_ack(self, request: Any) -> None:
        body = request.body or b""
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        seqs = json.loads(body)["columns"]["seq"]
        assert self._ack_fd is not None
        os.write(self._ack_fd, (json.dumps(seqs) + "\n").encode())

    def close(self) -> None:
        self.inner.close()


def main(spec: ClientSpec) -> dict[str, Any]:
    import noisescope

    inner = noisescope.HTTPTransport(spec.url, spec.token, 10.0)
    transport = TimingTransport(inner, spec.ack_log)
    t_start = time.time()
    run = noisescope.init(
        url=spec.url,
        token=spec.token,
        project=spec.project,
        task=spec.task,
        name=spec.name or spec.run_id[:8],
        run_id=spec.run_id,
        batch_size=B_BIG,
        dir=spec.spool_dir,
        flush_timeout=spec.flush_timeout,
        quiet=False,
        transport=transport,
        batch_max=spec.batch_max,
        **spec.extra,
    )
    max_log = 0.0
    clock = time.perf_counter
    progress = os.open(spec.progress, os.O_WRONLY | os.O_CREAT, 0o644) if spec.progress else None
    t0 = clock()
    for i in range(spec.samples):
        g_small_sq, g_big_sq, loss = sample_values(spec.seed, i)
        c0 = clock()
        run.log_sample(i, B_SMALL, B_BIG, g_small_sq, g_big_sq, loss=loss)
        took = clock() - c0
        if took > max_log:
            max_log = took
        if progress is not None:
            os.pwrite(progress, b"%012d" % i, 0)
        if spec.rate > 0 and i % 50 == 49:
            ahead = (i + 1) / spec.rate - (clock() - t0)
            if ahead > 0:
                time.sleep(ahead)
    t_logged = time.time()
    status = run.finish()
    return {
        "run_id": spec.run_id,
        "logged": spec.samples,
        "sent": status.sent,
        "spooled": status.spooled,
        "dropped": status.dropped,
        "queued": status.queued,
        "last_error": status.last_error,
        "latencies": transport.latencies,
        "statuses": transport.statuses,
        "transport_errors": transport.errors,
        "max_log_call_s": max_log,
        "t_start": t_start,
        "t_logged": t_logged,
        "t_end": time.time(),
    }


if __name__ == "__main__":
    spec = ClientSpec(**json.loads(sys.argv[1]))
    result = main(spec)
    tmp = spec.out + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, spec.out)
