"""The command line every benchmark module shares: ``python -m benchmarks.NAME [--quick]``."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """``python -m prog [--quick]``, described by the module's docstring ``doc``; a module
    with options of its own adds them."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {prog}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    return parser


def main(
    prog: str, doc: str | None, run: Callable[[bool], str], argv: list[str] | None = None
) -> int:
    """Run one benchmark module and print its markdown section (``python -m benchmarks``
    runs them all and writes docs/benchmarks.md)."""
    print(run(parser(prog, doc).parse_args(argv).quick))
    return 0


def main_beside(
    prog: str,
    doc: str | None,
    baseline: str,
    run: Callable[[bool, str], str],
    worker: Callable[[list[str]], int],
    argv: list[str] | None = None,
) -> int:
    """``main`` of a module that runs this checkout beside an earlier revision (``--baseline
    REV``, default ``baseline``), each version in a worker subprocess of its own
    (``--worker ARGS...``, which the module's ``_versions.Worker`` starts)."""
    parser_ = parser(prog, doc)
    parser_.add_argument(
        "--baseline", default=baseline, metavar="REV", help="the earlier revision (%(default)s)"
    )
    parser_.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser_.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)
    print(run(args.quick, args.baseline))
    return 0
