"""The report ``python -m reliability`` writes (docs/reliability.md): the run's sizes, one
section per check with its verdict, ``--update`` re-runs replacing their own sections, and the
appendix of what this harness found and the product fixed."""

from __future__ import annotations

import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from noisescope._progress import Progress

APPENDIX = "Found by this harness and fixed in the product"
#: Each with its regression test in tests/reliability/ (see `git log -- tests/reliability`).
FIXES = [
    "Client: `status().sent` counted samples twice when a spool replay was interrupted "
    "mid-segment (87 200 sent for 80 000 logged with the server SIGKILLed); replays now "
    "resume after the last acknowledged batch (`test_client_accounting.py`).",
    "Client: the backoff computed `2.0**failures`, which overflows after ~1000 failed "
    "retries (hours of outage at the 30 s cap); the sender then failed on every tick "
    "instead of backing off (`test_client_accounting.py`).",
    "Server: a NUL character in a run/project/task name, tag, event kind or series was a 500 "
    "on PostgreSQL; now a 422 naming the field (`test_bad_input.py`).",
    "Server: run search treated `%`, `_` and (on PostgreSQL) `\\` as LIKE syntax, and on "
    "SQLite never matched names with non-ASCII capitals; it is now a literal substring "
    "search on both backends (`test_bad_input.py`).",
    "Server: errors raised by the database driver inside the bulk insert (which uses the "
    "driver's cursor) bypassed the 503 handler; a driver OperationalError is now a 503.",
    "Server: `DELETE /api/v1/tokens/{id}` with an id beyond int64 was a 500 on SQLite "
    "(found by schemathesis); the id is now validated (`test_bad_input.py`).",
    "Server: a NUL character in a query parameter (e.g. `?series=`) was a 500 on PostgreSQL, "
    "and in the CSV export dropped the connection mid-answer (found by schemathesis); a NUL "
    "anywhere in the URL is now a 422, and values the database cannot use are a 422 saying "
    "why (`test_bad_input.py`).",
    "Client: with the spool directory unwritable, every batch of an outage was dropped at "
    "once although the in-memory bound had room; they now stay in memory (bounded by "
    "`memory_max`) until the server is back, and what is left at exit is counted dropped "
    "(`test_client_accounting.py`).",
    "CLI: `noisescope token create --project P --database-url URL` was rejected (the option "
    "was accepted only before the action); both orders work now (`test_cli_options.py`).",
    "Server: on PostgreSQL, `GET /series` of runs with steps near 2^63 (valid steps) was a 422 "
    "blaming the database ('bigint out of range': the bucket multiplied the step span by "
    "max_points); the bucket is computed in NUMERIC there (`test_write_then_read.py`).",
    "Server: samples with `time` (or `examples`) at ±1.7e308 were accepted, and on PostgreSQL "
    "every series on that axis, the compared series and the task's critical batch then "
    "answered 422 ('value out of range: overflow'); `time` is now a Unix time within years "
    "1-9999 and `examples` within [0, 2^960] (`_wire.SAMPLE_RANGES`, `test_bad_input.py`).",
]


@dataclass
class Sizes:
    runs: int
    samples: int
    rate: float
    fault_runs: int
    fault_samples: int
    fault_rate: float
    kills: int
    kill_every: float
    pg_restarts: int
    hostile_bomb: int
    schemathesis: list[str]
    properties: int
    browser_runs: int
    time_limit: float
    #: The paced load: the same number of runs at a rate the server keeps up with.
    paced_samples: int = 20_000
    paced_rate: float = 250.0
    #: Stored, then read: hypothesis examples (random stories written, then read back).
    write_read: int = 200
    #: The read client's decompression bomb: what it unpacks to (bytes).
    client_bomb: int = 256 << 20
    #: Nothing lost without a count (issue 46): samples per run, evaluations per run.
    round3_samples: int = 20_000
    round3_events: int = 50_000

    @classmethod
    def full(cls) -> Sizes:
        return cls(32, 100_000, 1000.0, 8, 20_000, 1000.0, 3, 5.0, 2, 1 << 30,
                   ["-n", "20"], 300, 5, 5400.0)  # fmt: skip

    @classmethod
    def quick(cls) -> Sizes:
        return cls(4, 3000, 1000.0, 3, 3000, 500.0, 2, 2.0, 0, 64 << 20,
                   ["--phases", "fuzzing", "-n", "5"], 60, 1, 600.0, 1000, 200.0,
                   30, 64 << 20, 5000, 12_000)  # fmt: skip


@dataclass
class Report:
    command: str
    sizes: Sizes
    out: Path
    sections: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, bool]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    #: With ``--update``: the earlier report's preamble, kept; re-runs are listed below it.
    preamble: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def load(self) -> None:
        """Take over an existing report, so ``--update`` re-runs replace only their sections."""
        text = self.out.read_text()
        head, *chunks = text.split("\n## ")
        lines = head.splitlines()
        table = lines.index("| check | held |")
        self.preamble = lines[:table]
        marks = [i for i, ln in enumerate(self.preamble) if ln.startswith("Sections re-run")]
        if marks:  # earlier --update notes: keep them as notes, under one heading
            self.notes = [ln for ln in self.preamble[marks[0] :] if ln.startswith("- ")]
            self.preamble = self.preamble[: marks[0]]
        for line in lines[table + 2 :]:
            if line.startswith("| "):
                title, held = (c.strip() for c in line.strip("|").rsplit("|", 1))
                self.verdicts.append((title, held == "yes"))
        for chunk in chunks:
            if not chunk.startswith(APPENDIX):
                self.sections.append("## " + chunk.rstrip("\n") + "\n")

    def add(self, title: str, ok: bool, body: str) -> None:
        section = f"## {title}\n\n{body.strip()}\n"
        titles = [t for t, _ in self.verdicts]
        if title in titles:  # --update: replace the earlier result, and say so
            i = titles.index(title)
            before = "held" if self.verdicts[i][1] else "did NOT hold"
            self.notes.append(
                f"- {title}: re-run by `{self.command}` on "
                f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (in the run above it {before})"
            )
            self.verdicts[i] = (title, ok)
            self.sections[i] = section
        else:
            if self.preamble:  # --update adding a section the earlier run did not have
                self.notes.append(
                    f"- {title}: added by `{self.command}` on "
                    f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
                )
            self.verdicts.append((title, ok))
            self.sections.append(section)
        self.write()
        print(f"[reliability] {title}: {'ok' if ok else 'FAILED'}", file=sys.stderr, flush=True)

    def write(self) -> None:
        s = self.sizes
        took = time.monotonic() - self.started
        head = self.preamble or [
            "# Reliability and security, measured",
            "",
            f"Written by `{self.command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC "
            f"({platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
            f"{platform.python_version()}; {took / 60:.0f} min). Every figure below comes from "
            "that run; rerun it to reproduce. Client processes, servers and databases are all "
            "on 127.0.0.1. `python -m reliability --quick` runs the same checks at small sizes; "
            "the CI-sized tests are in `tests/reliability/`.",
            "",
            f"Sizes of this run: load {s.runs} runs x {s.samples:,} samples per backend at "
            f"{s.rate:,.0f} samples/s per run; faults {s.fault_runs} runs x "
            f"{s.fault_samples:,} samples at {s.fault_rate:,.0f}/s.",
            "",
        ]
        if self.notes:
            head = [*head, "Sections re-run or added later (`--update`):", "", *self.notes, ""]
        table = [
            "| check | held |",
            "|---|---|",
            *[f"| {t} | {'yes' if ok else '**NO**'} |" for t, ok in self.verdicts],
            "",
        ]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        appendix = f"## {APPENDIX}\n\n" + "\n".join(f"- {fix}" for fix in FIXES) + "\n"
        self.out.write_text(
            "\n".join([*head, *table]) + "\n" + "\n".join([*self.sections, appendix])
        )


def markdown_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]).replace("|", "\\|") for k in keys) + " |" for r in rows]
    return "\n".join(lines)


Section = Callable[[], tuple[bool, str]]


def run_section(report: Report, title: str, fn: Section, progress: Progress) -> None:
    """Run one section under the progress line, and record its verdict even if it raised."""
    progress.show(title, force=True)
    try:
        ok, body = fn()
    except Exception:
        ok, body = False, f"The scenario itself failed:\n\n```\n{traceback.format_exc()}```"
    progress.clear()  # the verdict's line replaces it
    report.add(title, ok, body)
    progress.advance()
