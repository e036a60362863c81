"""Resuming a run (``noisescope.init(run_id=..., resume=True)``): a job restarted from its
checkpoint continues its run instead of numbering its samples from 0 again.

Two rules (docs/client.md, "Resuming a run"):

- **Numbering.** A resumed session numbers its samples (and events) from ``first_index``, the
  microseconds since the epoch when it began: after every number an earlier session of the run
  used (the first session numbers from 0; a later one begins later, and no session logs more
  than a sample per microsecond), with no request to the server, so a job restarted while the
  server is down resumes all the same. With ``all_ranks`` each rank keeps its own residue
  (``seq = index * world_size + rank``).
- **Repeated steps keep the first copy.** The steps up to the last one the run holds (on the
  server, from ``GET /api/v1/runs/{id}``'s ``last_step``, or in this host's spool of the run)
  were measured before the restart; the samples and events the job logs again for them are not
  sent, counted (``repeated``) and said once. The first copy is as good a measurement of those
  steps as the second (the model's state at the checkpoint is the same), and keeping it needs
  no write on the server (wandb rewinds instead, deleting what follows the resume step).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from noisescope import _wire
from noisescope._format import plural
from noisescope._redact import redact_text
from noisescope._request import build_request
from noisescope._retry import answer_field
from noisescope._spool import RunSpool
from noisescope._transport import Transport

logger = logging.getLogger("noisescope")

ResumeMode = Literal["allow", "must"]


def resume_mode(resume: object) -> ResumeMode | None:
    """``init``'s ``resume``: False/None (a new run), True or "allow" (continue the run if it
    exists), "must" (it must exist: ValueError otherwise); ValueError for anything else."""
    if resume is None or resume is False:
        return None
    if resume is True or resume == "allow":
        return "allow"
    if resume == "must":
        return "must"
    raise ValueError(f"resume must be True, False, 'allow' or 'must', got {resume!r}")


def session_index() -> int:
    """The first sample index of a resumed session: after every earlier session's."""
    return time.time_ns() // 1000


def server_last_step(run_id: str, transport: Transport) -> tuple[int | None, bool | None, str]:
    """(last step the server holds, whether it holds the run, or None when it did not say;
    what it said, for a message)."""
    request = build_request("GET", _wire.runs_path(run_id), None, compress=False)
    try:
        response = transport.handle_request(request)
    except Exception as exc:  # unreachable, a broken transport: resume all the same
        return None, None, redact_text(f"{type(exc).__name__}: {exc}")
    if response.status in (404, 410):
        return None, False, f"HTTP {response.status}: {response.detail()}"
    if response.status != 200:
        return None, None, f"HTTP {response.status}: {response.detail()}"
    step = answer_field(response, "last_step")
    return (step if type(step) is int else None), True, "HTTP 200"


@dataclass
class Resume:
    """A resumed session: where its numbering begins and which steps are repeats."""

    run_id: str
    #: The last step the run held when this session began (None: none known).
    last_step: int | None
    first_index: int
    #: Samples and events this session logged for steps up to ``last_step``: not sent.
    repeated: int = 0
    repeated_events: int = 0

    @classmethod
    def read(
        cls,
        run_id: str,
        mode: ResumeMode,
        transport: Transport | None,
        spool: RunSpool | None,
        where: str,
    ) -> Resume:
        """What the server (through ``transport``; None offline) and this host's spool of the
        run hold; said in one line. ``must`` and a run neither holds: ValueError."""
        step, found, said = (None, None, "offline")
        if transport is not None:
            step, found, said = server_last_step(run_id, transport)
        local = spool.last_step() if spool is not None else None
        if found is False and local is None and mode == "must":
            raise ValueError(
                f"noisescope.init(resume='must'): {where} has no run {run_id} ({said}); "
                "resume=True starts it when it does not exist"
            )
        held = [s for s in (step, local) if s is not None]
        resume = cls(run_id, max(held) if held else None, session_index())
        if found is None and transport is not None:
            logger.warning(
                "noisescope: resuming run %s: could not read it from %s (%s): the steps it "
                "holds there are not known, so samples of steps this job repeats may be stored "
                "twice%s", run_id, where, said,
                f" (this host's spool holds steps up to {local})" if local is not None else "",
            )  # fmt: skip
        elif resume.last_step is not None:
            logger.info(
                "noisescope: resuming run %s after step %d: what this job logs again for steps "
                "up to %d is not sent (the run keeps the first copy)",
                run_id, resume.last_step, resume.last_step,
            )  # fmt: skip
        return resume

    def repeats(self, step: object) -> bool:
        """Whether ``step`` was measured before the restart (then count and skip a sample)."""
        last = self.last_step
        if last is None or not isinstance(step, int) or step > last:
            return False
        self.repeated += 1
        if self.repeated == 1:
            logger.warning(
                "noisescope: resumed run %s: step %d was measured before the restart (the run "
                "holds steps up to %d); samples and events of repeated steps are not sent, the "
                "run keeps the first copy (counted at finish)", self.run_id, step, last,
            )  # fmt: skip
        return True

    def repeats_event(self, step: int) -> bool:
        """Whether an event at ``step`` is a repeat (counted apart from samples)."""
        if self.last_step is None or step > self.last_step:
            return False
        self.repeated_events += 1
        return True

    def sentence(self) -> str | None:
        """For the finish line: what was not sent as a repeat, if anything."""
        if not (self.repeated or self.repeated_events):
            return None
        what = plural(self.repeated, "sample")
        if self.repeated_events:
            what += f" and {plural(self.repeated_events, 'event')}"
        return (
            f"{what} of steps up to {self.last_step}, repeated after the resume, were not sent "
            "(the run keeps the first copy)"
        )
