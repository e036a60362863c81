"""``python -m experiments [--quick] [--tasks digits,lsq,...] [--out DIR] [--docs DIR]``.

Runs each task's batch-size sweep (resuming from cached runs), logs every run to a local
``noisescope server``, then writes the analysis, figures and ``reproduction.md``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["main"]

DISCUSSION_FILE = Path(__file__).with_name("discussion.md")
#: Every task, in the order the page shows them (kept beside ``tasks.TASKS`` by a test; the
#: parser is built without importing torch).
TASK_NAMES = ("digits", "digits_cnn", "lsq", "charlm", "digits_vae", "cartpole")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments",
        description="Reproduce McCandlish et al. (2018): B_simple vs the critical batch size.",
    )
    p.add_argument("--quick", action="store_true", help="tiny sweeps (CI smoke; minutes)")
    p.add_argument(
        "--tasks",
        default=None,
        help=f"comma-separated tasks, from {', '.join(TASK_NAMES)} (default: all)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("experiments/runs"),
        help="cache of finished runs, server database, spool (default: experiments/runs)",
    )
    p.add_argument(
        "--docs",
        type=Path,
        default=None,
        help="where reproduction.md and figures/ go (default: docs/ for the full study of "
        "every task, else <out>/report: a part of the study never replaces the repo's page)",
    )
    p.add_argument(
        "--url",
        default=None,
        help="log to this running noisescope server instead of starting one",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="log through the client in offline mode (spooled under <out>/spool); a later "
        "run with a server delivers the spool with noisescope.sync",
    )
    p.add_argument(
        "--no-server",
        action="store_true",
        help="do not log runs anywhere (development only; the docs are made with a server)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import noisescope
    from experiments import analysis, figures, report
    from experiments.runner import (
        OFFLINE,
        Progress,
        archive_stale,
        ensure_logged,
        run_sweep,
    )
    from experiments.tasks import TASKS
    from harness import ServerProcess
    from noisescope._format import plural

    names = [t.strip() for t in (args.tasks or ",".join(TASK_NAMES)).split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        print(f"unknown task(s) {unknown}; choose from {sorted(TASKS)}", file=sys.stderr)
        return 2
    size = "quick" if args.quick else "full"
    out: Path = args.out / size
    whole = not args.quick and set(names) == set(TASKS)
    docs: Path = args.docs or (Path("docs") if whole else out / "report")
    progress = Progress()

    server: ServerProcess | None = None
    url: str | None = args.url
    if args.offline:
        url = OFFLINE
    elif url is None and not args.no_server:
        database = (out / "noisescope.db").resolve()
        database.parent.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(f"sqlite:///{database}", log_path=out / "server.log").start()
        url = server.url
        progress.line(f"noisescope server on {url} (database {out / 'noisescope.db'})")
    try:
        if url not in (None, OFFLINE) and (out / "spool").is_dir():
            synced = noisescope.sync(out / "spool", url=url)
            progress.line(
                f"noisescope sync: {plural(len(synced.synced), 'spooled run')}, "
                f"{plural(synced.samples, 'sample')} "
                f"delivered to {url}" + (f"; failed: {synced.failed}" if synced.failed else "")
            )
        results = []
        summary = []
        resent_total: dict[str, int] = {}
        archived_total: dict[str, int] = {}
        for name in names:
            spec = TASKS[name].sized(args.quick)
            records = run_sweep(spec, out, url, progress)
            if url not in (None, OFFLINE):
                resent = ensure_logged(records, spec, url, out, progress)
                stale = archive_stale(records, spec, noisescope.Api(url), out)
                progress.line(
                    f"{name}: all {len(records)} runs are on the server, project "
                    f"{spec.project}"
                    + (f" ({resent} re-sent from the run cache)" if resent else "")
                    + (
                        f"; archived {plural(stale.archived, 'run')} this run cache logged "
                        "for an earlier version of the task (noisescope runs restore ID brings "
                        "one back)"
                        if stale.archived
                        else ""
                    )
                )
                if stale.foreign:
                    progress.line(
                        f"{name}: {plural(stale.foreign, 'other run')} of {spec.project}/"
                        f"{name} on the server, not logged from this run cache, left as they "
                        "are: the server's critical batch size reads them too (noisescope runs "
                        f"list --project {spec.project} --task {name}; noisescope runs archive "
                        "ID takes one out)"
                    )
                resent_total[name] = resent
                archived_total[name] = stale.archived
            runs = analysis.to_sweep_runs(records)
            crit = analysis.analyse(
                runs, spec.loss_targets, project=spec.project, task=name, units=spec.units
            )
            lowest = crit.targets[-1] if crit.targets else None
            best_ids = {p.run_uids[0] for p in lowest.points} if lowest else set()
            best_runs = sorted((r for r in runs if r.uid in best_ids), key=lambda r: r.batch_size)
            fig = f"figures/reproduction_{name}{'_quick' if args.quick else ''}.png"
            figures.save_png(
                figures.task_chart(spec.title, spec.unit_label, crit, best_runs), docs / fig
            )
            results.append(
                report.TaskResult(
                    spec,
                    crit,
                    runs,
                    records,
                    fig,
                    resent_total.get(name),
                    archived_total.get(name, 0),
                )
            )
            for t in crit.targets:
                point = t.b_simple_vs_b_crit()
                if point is not None:
                    summary.append({"task": name, **point})
                progress.line(
                    f"{name} loss {t.target:g}: B_crit "
                    + (
                        report.b_crit_text(t)
                        if t.determined
                        else f"not determined ({'; '.join(t.warnings)})"
                    )
                    + ", B_simple "
                    + ("-" if t.b_simple is None else f"{t.b_simple:.3g}")
                )
        summary_fig = f"figures/reproduction_summary{'_quick' if args.quick else ''}.png"
        figures.save_png(figures.summary_chart(summary), docs / summary_fig)
        command = "python -m experiments" + (" " + shlex.join(argv) if argv else "")
        if argv is None:
            command = "python -m experiments " + shlex.join(sys.argv[1:])
        discussion = (
            DISCUSSION_FILE.read_text().strip()
            if DISCUSSION_FILE.exists() and whole
            else "(Written for the full study of every task only.)"
        )
        text = report.render(results, summary_fig, command.strip(), discussion)
        docs.mkdir(parents=True, exist_ok=True)
        page = docs / "reproduction.md"
        # Sections other commands write (python -m experiments.branching) are kept as they are.
        from experiments import sections

        text = sections.carry(page.read_text() if page.exists() else "", text)
        page.write_text(text)
        progress.line(f"wrote {docs / 'reproduction.md'}")
    finally:
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
