"""One training process that ends the way its case says (issue 46, items 4, 5 and 10):
``python -m reliability._ending CASE URL SPOOL SAMPLES PROGRESS``.

A module, not a script string, so that a spawn-context child can import its target. It prints
the run id first (the harness reads it before anything ends), then logs the deterministic
samples of ``reliability._client.sample_values`` and, after each, writes how many it logged to
``PROGRESS`` (what a signal interrupted is read from there). Cases:

- ``fork`` / ``spawn``: the run is started in a multiprocessing child of that context, which
  logs ``SAMPLES`` and returns without ``finish()``;
- ``signal``: logs until a signal ends the process (the harness sends SIGTERM or SIGHUP);
- ``exception`` / ``interrupt``: logs ``SAMPLES``, then raises RuntimeError / KeyboardInterrupt
  with no ``with run:`` and no ``finish()``;
- ``password``: logs ``SAMPLES`` and finishes, not quiet (the URL carries a password), then
  prints ``last_error`` (the harness looks for the password in everything it said).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import noisescope
from reliability._client import B_BIG, B_SMALL, sample_values

SEED = 46
FINISH_TIMEOUT = 60.0
#: How long an unreachable server is waited for at finish (the password case).
SHORT_FLUSH = 2.0


def _start(url: str, spool: str, case: str, quiet: bool = True) -> noisescope.Run:
    run = noisescope.init(
        url=url,
        project="endings",
        task=case,
        name=case,
        batch_size=B_BIG,
        dir=spool,
        batch_interval=0.05,
        flush_timeout=SHORT_FLUSH if case == "password" else FINISH_TIMEOUT,
        quiet=quiet,
    )
    print(run.id, flush=True)
    return run


def _log(run: noisescope.Run, samples: int, progress: str, pace: bool = False) -> None:
    """Samples 0..samples-1 (forever when ``samples`` is 0), the count written after each."""
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o644)
    log_sample = run.log_sample
    step = 0
    while samples == 0 or step < samples:
        g_small_sq, g_big_sq, loss = sample_values(SEED, step)
        log_sample(step, B_SMALL, B_BIG, g_small_sq, g_big_sq, loss=loss)
        step += 1
        os.pwrite(fd, b"%012d" % step, 0)
        if pace:
            time.sleep(0.0002)  # a few thousand steps a second, like a small model's loop


def _child(url: str, spool: str, samples: int, progress: str, case: str) -> None:
    run = _start(url, spool, case)
    _log(run, samples, progress)
    # returns without finish(): multiprocessing ends the child through os._exit


def main(argv: list[str]) -> int:
    case, url, spool, progress = argv[0], argv[1], argv[2], argv[4]
    samples = int(argv[3])
    if case in ("fork", "spawn"):
        fork = case == "fork"
        context = (
            multiprocessing.get_context("fork") if fork else multiprocessing.get_context("spawn")
        )
        child = context.Process(target=_child, args=(url, spool, samples, progress, case))
        child.start()
        child.join()
        return child.exitcode or 0
    run = _start(url, spool, case, quiet=case != "password")
    signal_case = case == "signal"  # logs until the signal
    _log(run, 0 if signal_case else samples, progress, pace=signal_case)
    if case == "exception":
        raise RuntimeError("training failed (reliability._ending)")
    if case == "interrupt":
        raise KeyboardInterrupt
    status = run.finish()
    print(f"last_error: {status.last_error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
