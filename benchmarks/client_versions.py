"""Client: this version beside a previous one, measured in one run, alternating.

Each figure comes from a fresh process that imports one version of ``noisescope`` from its own
checkout (``benchmarks/_client_child.py``) and logs into the same local server (SQLite):

- ``log_sample`` per call (``perf_counter_ns`` around each call, the sender online): p50, p99;
- the client's CPU per sample: the process's CPU time (every thread: the call, the sender
  thread that shares the training process's GIL, the guard) from the first ``log_sample`` to
  the end of ``finish()`` (everything acknowledged), over the samples; and, of it, the training
  thread's own CPU in the loop;
- the share of the samples that went through the spool on the way (a burst faster than the
  server takes spills to disk and replays: that detour is inside the CPU figure).

The previous version is a checkout of an earlier commit, named by ``NOISESCOPE_BENCH_BASELINE``
(e.g. ``git worktree add /tmp/ns-base <commit>``; ``NOISESCOPE_BENCH_BASELINE=/tmp/ns-base``).
Rounds alternate the versions (ABBA), so a drift of the shared machine's load falls on both.

    NOISESCOPE_BENCH_BASELINE=/tmp/ns-base python -m benchmarks.client_versions [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _cli

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_client_child.py"
BASELINE_ENV = "NOISESCOPE_BENCH_BASELINE"
TITLE = "Client: this version beside the previous one"
TARGET_P50_US = 2.0
TARGET_CPU_US = 4.0
#: (key, row label, unit format, target or None); keys are the child's JSON fields.
FIGURES = [
    ("p50_us", "`log_sample` p50 µs per call", "{:.2f}", TARGET_P50_US),
    ("p99_us", "`log_sample` p99 µs per call", "{:.2f}", None),
    ("cpu_us", "client CPU µs per sample, every thread, to the last acknowledgement", "{:.2f}",
     TARGET_CPU_US),
    ("loop_us", "of which the training thread's loop, µs per sample", "{:.2f}", None),
    ("spooled_through", "share of the samples that went through the spool", "{:.0%}", None),
]  # fmt: skip
#: The figures each kind of child process gives.
KEYS = {"calls": ("p50_us", "p99_us"), "cpu": ("cpu_us", "loop_us", "spooled_through")}


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--", "client/noisescope"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def _child(client: Path, mode: str, url: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ns-versions-") as spool:
        done = subprocess.run(
            [sys.executable, str(CHILD), str(client), mode, url, str(n), spool],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=spool,
            env={k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")},
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{client} {mode}: exit {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["sent"] != n or result["dropped"]:
        raise RuntimeError(f"{client} {mode}: did not deliver everything: {result}")
    return result


def measure(quick: bool) -> dict[str, Any]:
    from harness import ServerProcess

    baseline = os.environ.get(BASELINE_ENV)
    versions = {"this": ROOT / "client"}
    if baseline:
        versions = {"previous": Path(baseline) / "client", **versions}
        if not (versions["previous"] / "noisescope" / "__init__.py").is_file():
            raise RuntimeError(f"{BASELINE_ENV}={baseline} holds no client/noisescope")
    n = 20_000 if quick else 100_000
    rounds = 2 if quick else 5
    figures: dict[str, dict[str, list[float]]] = {v: {} for v in versions}
    with (
        tempfile.TemporaryDirectory(prefix="ns-versions-db-") as tmp,
        ServerProcess(database_url=f"sqlite:///{Path(tmp) / 'versions.db'}") as server,
    ):
        for index in range(rounds):
            order = list(versions) if index % 2 == 0 else list(reversed(versions))
            for version in order:
                for mode in ("calls", "cpu"):
                    result = _child(versions[version], mode, server.url, n)
                    for key in KEYS[mode]:
                        figures[version].setdefault(key, []).append(float(result[key]))
    return {
        "n": n,
        "rounds": rounds,
        "figures": figures,
        "commits": {v: _commit(path.parent) for v, path in versions.items()},
    }


def _cell(values: list[float], form: str) -> str:
    median = form.format(statistics.median(values))
    return f"{median} ({form.format(min(values))}-{form.format(max(values))})"


def render(result: dict[str, Any], quick: bool) -> str:
    figures = result["figures"]
    commits = result["commits"]
    both = "previous" in figures
    command = f"python -m benchmarks.client_versions{' --quick' if quick else ''}"
    lines = [
        f"## {TITLE}",
        "",
        f"`{command}` with `{BASELINE_ENV}` set to a checkout of the previous version: "
        f"{result['rounds']} rounds, each a fresh process per version and figure, versions "
        f"alternating (ABBA); each process logs {result['n']:,} samples as fast as it can into "
        "one local server (SQLite) and `finish()`es. Medians, with the range over the rounds; "
        "the ratio is this version's median over the previous one's.",
        "",
    ]
    if not both:
        lines += [
            f"No previous version to compare with ({BASELINE_ENV} unset): this version alone.",
            "",
        ]
    header = "| figure | "
    header += f"previous ({commits['previous']}) | " if both else ""
    header += f"this version ({commits['this']}) | "
    header += "this / previous | target |" if both else "target |"
    lines += [header, "|---|" + "---:|" * (header.count("|") - 2)]
    verdicts = []
    for key, label, form, target in FIGURES:
        this = figures["this"].get(key)
        if not this:
            continue
        row = f"| {label} | "
        if both:
            row += f"{_cell(figures['previous'][key], form)} | "
        row += f"{_cell(this, form)} | "
        if both:
            before = statistics.median(figures["previous"][key])
            row += f"{statistics.median(this) / before:.2f}× | " if before else "- | "
        mark = ""
        if target is not None:
            met = statistics.median(this) <= target
            mark = f"<= {target:g} ({'met' if met else 'MISSED'})"
            verdicts.append(f"{label}: {statistics.median(this):.2f} ({mark})")
        lines.append(row + f"{mark} |")
    lines += [
        "",
        "Targets (this version's median): " + "; ".join(verdicts) + ".",
        "",
        "CPU time is the steadier figure on this shared machine; the per-call wall times "
        "move with the neighbours' load, on both versions alike.",
    ]
    return "\n".join(lines) + "\n"


def run(quick: bool) -> str:
    return render(measure(quick), quick)


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.client_versions", __doc__, run))
