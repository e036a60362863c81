"""Run every benchmark side by side and write the tables to docs/benchmarks.md.

Each module in ``MODULES`` exposes ``run(quick: bool) -> str`` returning a markdown section.
The machine is shared and noisy, so every module compares its candidates within one run and
reports ratios; single timings are context, not claims.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from benchmarks._venv import competitor_python
from noisescope._progress import Progress, on_terminal

MODULES = [
    ("log_overhead", "Client: log() cost on the training thread"),
    ("client_cpu", "Client: CPU per sample through the sender"),
    ("client_versions", "Client: this version beside the previous one"),
    ("probe_overhead", "Probes: training-step overhead"),
    ("probe_gpt", "Probes: per-example norms on a GPT (all parameters, norm layers)"),
    ("ingest", "Server: ingest throughput"),
    ("series", "Server: series query latency"),
    ("storage", "Server: storage per sample, rows and compacted"),
    ("tasks", "Server: the task list and the Runs page at team size"),
    ("dashboard", "Dashboard: page render time"),
    ("integrations", "Integrations: callback overhead"),
]
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def _stamp(section: str, quick: bool) -> str:
    """Date each section: ``--only`` re-runs leave the other sections from earlier runs."""
    title, _, body = section.partition("\n")
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    return f"{title}\n\n_Measured {when}{' (--quick)' if quick else ''}._\n{body}"


def _merge(previous: str, fresh: list[str]) -> list[str]:
    """Keep the sections of an earlier full run that ``--only`` did not re-measure, in order."""
    by_title = {s.splitlines()[0]: s for s in fresh}
    kept = ["## " + s.strip() + "\n" for s in previous.split("\n## ")[1:]]  # [0] is the header
    merged = [by_title.pop(s.splitlines()[0], s) for s in kept]
    return merged + list(by_title.values())


#: The modules that compare against MLflow and wandb, from the competitors' venv.
NEED_COMPETITORS = {"log_overhead", "ingest"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--only",
        nargs="*",
        help="module names to run (default: all); their sections replace those already in --out",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output file (docs/benchmarks.md)")
    parser.add_argument(
        "--venv-only",
        action="store_true",
        help="create (or reuse) the competitors' venv with its pinned MLflow and wandb, then stop",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [m for m, _ in MODULES if not args.only or m in args.only]
    if args.venv_only or NEED_COMPETITORS & set(names):
        # Made before any measurement, so that pip never runs beside a timed benchmark.
        python, why_not = competitor_python()
        print(f"[benchmarks] competitors' venv: {python or why_not}", file=sys.stderr)
        if args.venv_only:
            return 0 if python else 1

    sections: list[str] = []
    failed = 0
    # Its own lines carry the count and the time left on a terminal: the sections print too.
    progress = Progress(len(names), live=False)
    live = on_terminal()
    for name in names:
        title = dict(MODULES)[name]
        where = f" [{progress.status()}]" if live else ""
        print(f"[benchmarks] {name}: {title} ...{where}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"benchmarks.{name}":
                print(f"[benchmarks] {name}: not present, skipped", file=sys.stderr)
                progress.advance(timed=False)
                continue
            raise
        try:
            section = module.run(quick=args.quick)
        except Exception:
            failed += 1
            section = f"## {title}\n\nFAILED:\n\n```\n{traceback.format_exc()}```\n"
        took = time.perf_counter() - t0
        progress.advance()
        print(f"[benchmarks] {name}: done in {took:.0f} s", file=sys.stderr, flush=True)
        sections.append(_stamp(section.strip(), args.quick) + "\n")

    header = (
        "# Benchmarks\n\n"
        "Written by `python -m benchmarks` (all sections; `--only NAME...` re-runs some, "
        f"each section says when it was measured) on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. "
        "The machine is shared and noisy: compare the ratios within a table (each table "
        "is measured side by side in one run), not timings across tables or runs.\n"
    )
    if args.only and args.out.exists():
        sections = _merge(args.out.read_text(), sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + "\n" + "\n".join(sections))
    print(f"[benchmarks] wrote {args.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
