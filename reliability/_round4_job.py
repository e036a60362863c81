"""One training process of issue 55's client cases: ``python -m reliability._round4_job CASE URL
SPOOL RUN_ID FIRST LAST``. It prints the run id once it has logged steps FIRST..LAST-1, then:

- ``finishing``: calls ``finish()`` (the harness ends the process during its wait: item 5);
- ``killed``: flushes, prints "flushed" and waits to be killed, as a preempted job (item 7);
- ``resumed``: the run was started with ``resume=True`` and finishes (item 7).

Not quiet: the finish line is what the harness reads of what the client said.
"""

from __future__ import annotations

import sys
import time

import noisescope

#: How long ``finish()`` waits for a server that does not answer (the harness ends it sooner).
FINISH_WAIT_S = 60.0


def main(argv: list[str]) -> int:
    case, url, spool, run_id, first, last = argv
    run = noisescope.init(
        url=url, project="round4", task=case, dir=spool, run_id=run_id or None,
        resume=case == "resumed", batch_interval=0.05 if case != "finishing" else 0.5,
        request_timeout=120.0, flush_timeout=FINISH_WAIT_S, resume_orphans=False, quiet=False,
    )  # fmt: skip
    for step in range(int(first), int(last)):
        run.log_sample(step, 8.0, 64.0, 2.0, 1.0, loss=1.0 / (step + 1))
        if step % 100 == 0:
            run.log(step, eval_loss=1.0 / (step + 1))
    print(run.id, flush=True)
    if case == "killed":
        run.flush(timeout=FINISH_WAIT_S)
        print("flushed", flush=True)
        time.sleep(600)
    run.finish()
    print("finish returned", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
