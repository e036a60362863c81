"""One measurement of one client version, in its own process (``benchmarks.client_versions``).

    python benchmarks/_client_child.py CLIENT_DIR MODE URL N SPOOL

``CLIENT_DIR`` is the ``client/`` folder of the checkout to measure: it goes first on
``sys.path``, so this process imports that version of ``noisescope`` and no other. ``MODE``:
``calls`` times each ``log_sample`` call (``perf_counter_ns``); ``cpu`` times nothing inside
the loop and reads the process's CPU (every thread: the call, the sender, the guard) from the
first call to the end of ``finish()``, per sample delivered. Prints one JSON line.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path


def main() -> None:
    client, mode, url, n_text, spool = sys.argv[1:6]
    sys.path.insert(0, client)
    import noisescope
    from noisescope import _spool

    where = Path(noisescope.__file__).resolve()
    if Path(client).resolve() not in where.parents:
        raise SystemExit(f"imported {where}, not the version under {client}")
    spooled = [0]
    append_record = _spool.RunSpool.append_record

    def counted(self: _spool.RunSpool, record: dict[str, object]) -> bool:
        spooled[0] += _spool.batch_size(record)
        return append_record(self, record)

    _spool.RunSpool.append_record = counted  # type: ignore[method-assign]
    n = int(n_text)
    rng = random.Random(7)
    norms = [(1.6 + rng.random(), 1.15 + 0.2 * rng.random()) for _ in range(n)]
    run = noisescope.init(
        url=url, project="bench", task="versions", dir=spool, quiet=True, flush_timeout=600.0
    )
    log_sample = run.log_sample
    out: dict[str, object] = {"module": str(where)}
    if mode == "calls":
        clock = time.perf_counter_ns
        times = [0] * n
        for step, (g_small_sq, g_big_sq) in enumerate(norms):
            started = clock()
            log_sample(step, 64.0, 256.0, g_small_sq, g_big_sq, loss=2.0 / (1 + 1e-3 * step))
            times[step] = clock() - started
        status = run.finish()
        times.sort()
        out["p50_us"] = times[n // 2] / 1e3
        out["p99_us"] = times[int(n * 0.99)] / 1e3
    else:
        cpu = time.process_time()
        thread = time.thread_time()
        for step, (g_small_sq, g_big_sq) in enumerate(norms):
            log_sample(step, 64.0, 256.0, g_small_sq, g_big_sq, loss=2.0 / (1 + 1e-3 * step))
        out["loop_us"] = (time.thread_time() - thread) / n * 1e6
        status = run.finish()
        out["cpu_us"] = (time.process_time() - cpu) / n * 1e6
    out.update(sent=status.sent, dropped=status.dropped, spooled_through=spooled[0] / n)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
