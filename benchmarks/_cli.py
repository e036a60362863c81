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
