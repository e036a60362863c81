"""``python -m reliability [--quick]``: load, faults, bad input, isolation and browser safety,
measured against real server processes on SQLite and PostgreSQL; writes docs/reliability.md.

Full size (the default): 32 runs x 100 000 samples per backend, PostgreSQL restarted during a
load (the cluster is always restarted/started again in a ``finally``). ``--quick`` runs small
sizes in a few minutes and never restarts PostgreSQL. Sections are written to the report as
they finish, so an interrupted run still leaves what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from functools import partial
from pathlib import Path

from noisescope._progress import Progress
from reliability._infra import REPO, ensure_postgres_running, postgres_available
from reliability._report import Report, Section, Sizes, run_section
from reliability._sections import (
    auth_section,
    bad_input_section,
    browser_section,
    client_section,
    disconnects_section,
    disk_section,
    edges_section,
    fault_section,
    load_section,
    outage_section,
    paced_section,
    properties_section,
    read_client_section,
    reads_section,
    round3_section,
    round4_section,
    round4_server_section,
    spool_damage_section,
    stored_section,
)

OUT = REPO / "docs" / "reliability.md"


def _present(module: str) -> bool:
    """Whether an optional section's module is there (being written by someone else); if not,
    its section is left out, and said."""
    if importlib.util.find_spec(module) is not None:
        return True
    print(f"[reliability] {module} is not there: its section is left out", file=sys.stderr)
    return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (minutes)")
    parser.add_argument("--backends", default="sqlite,postgresql", help="%(default)s")
    parser.add_argument(
        "--only",
        default="load,paced,faults,client,bad,stored,edges,disconnects,properties,auth,outage,"
        "browser,readclient,disk,round3,round4server,round4",
        help="comma-separated sections to run (%(default)s); 'bad' is the hostile corpus, raw "
        "sockets, rows stored around the API and crashed runs; 'client' the client's faults "
        "(hostile run ids, a hung server and a killed client, a burst); 'stored' random "
        "accepted writes, then every read; 'edges' numeric edge values on every numeric query "
        "parameter; 'disconnects' broken and vanishing bodies with auth on; 'readclient' "
        "noisescope.Api against a broken server; 'outage' stops a private PostgreSQL cluster "
        "under load; 'disk' the client's spool on a full disk; 'round3' nothing lost without a "
        "count (issue 46), a damaged spool, names, secrets and clocks; 'round4server' token "
        "scopes, deleted runs, changes made on the server and a database newer than the code "
        "(issue 55, the server's items); 'round4' deleted runs, endings during finish(), "
        "refusals and resumed runs (issue 55, the client)",
    )
    parser.add_argument("--runs", type=int, help="load: simulated runs")
    parser.add_argument("--samples", type=int, help="load: samples per run")
    parser.add_argument("--rate", type=float, help="load: samples/s per run (0: unpaced)")
    parser.add_argument("--out", type=Path, default=OUT, help="docs/reliability.md")
    parser.add_argument(
        "--update", action="store_true", help="re-run sections into an existing report"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.runs:
        sizes.runs = args.runs
    if args.samples:
        sizes.samples = args.samples
    if args.rate is not None:
        sizes.rate = args.rate
    only = set(args.only.split(","))
    backends = [b for b in args.backends.split(",") if b]
    if "postgresql" in backends and not postgres_available():
        print("[reliability] PostgreSQL unreachable: running SQLite only", file=sys.stderr)
        backends.remove("postgresql")
    command = "python -m reliability " + " ".join(argv if argv is not None else sys.argv[1:])
    report = Report(command.strip(), sizes, args.out)
    if args.update and args.out.exists():
        report.load()
    todo: list[tuple[str, Section]] = []
    for backend in backends:
        pg = backend == "postgresql" and not args.quick and sizes.pg_restarts > 0
        steps: list[tuple[str, str, Section]] = [
            ("load", "Load", partial(load_section, backend, sizes)),
            ("paced", "Load below saturation", partial(paced_section, backend, sizes)),
            ("faults", "Faults", partial(fault_section, backend, sizes, pg)),
            ("client", "Client faults", partial(client_section, backend, sizes)),
            ("bad", "Bad input", partial(bad_input_section, backend, sizes)),
            ("stored", "Stored, then read", partial(stored_section, backend, sizes)),
            ("edges", "Numeric edge values", partial(edges_section, backend)),
            ("disconnects", "Disconnects with auth on", partial(disconnects_section, backend)),
            ("auth", "Isolation and auth", partial(auth_section, backend)),
            ("round3", "Nothing lost without a count", partial(round3_section, backend, sizes)),
            ("round4server", "Scopes, deleted runs, server-side changes, a newer database",
             partial(round4_server_section, backend)),
        ]  # fmt: skip
        if backend == "postgresql":
            steps.append(("outage", "PostgreSQL outages", outage_section))
        todo += [(f"{title}, {backend}", step) for key, title, step in steps if key in only]
    if "properties" in only:
        todo.append(("Payload validation properties", lambda: properties_section(sizes)))
    if "browser" in only:
        todo.append(("Browser safety (dashboard)", lambda: browser_section(sizes)))
    if "readclient" in only:
        todo.append(("Read client against a broken server", lambda: read_client_section(sizes)))
    if "disk" in only:
        todo.append(("Disk full (the client's spool)", disk_section))
    round3 = "round3" in only and "sqlite" in backends
    if round3 and _present("reliability._spool_damage"):
        todo.append(("A damaged spool, sqlite", spool_damage_section))
    if round3 and _present("reliability._round3_reads"):
        todo.append(("Names, secrets and clocks, sqlite", reads_section))
    if "round4" in only and "sqlite" in backends and _present("reliability._round4"):
        todo.append(("Deleted runs, endings in finish, refusals, resumes, sqlite", round4_section))
    try:
        with Progress(len(todo), "[reliability]") as progress:
            for title, step in todo:
                run_section(report, title, step, progress)
    finally:
        if "postgresql" in backends:
            ensure_postgres_running()
    report.write()
    print(f"[reliability] wrote {args.out}", file=sys.stderr)
    return 0 if all(ok for _, ok in report.verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
