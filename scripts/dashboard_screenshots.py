"""Regenerate the dashboard screenshots in docs/figures/dashboard_<page>.png.

    python scripts/dashboard_screenshots.py [--out docs/figures] [--server URL] [--only PAGE ...]
        [--prefix dashboard_]

Starts a noisescope server on a fresh synthetic database (``harness/dashboard_runs.py``: a
vision sweep at 6 batch sizes x 3 learning rates with known B_crit, a token sweep, a live run
with layers and a batch-size change, a run that measured nothing; for the last page, runs of two
model sizes with branch runs, ``harness/model_sizes.py``) unless ``--server`` names a
running one, runs the dashboard against it (``streamlit run``, NOISESCOPE_URL only), opens every
page in headless Debian Chromium through Playwright and saves a full-page PNG of each. Every
request the pages make is checked to stay on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import dashboard_stack as _stack  # noqa: E402
from harness.dashboard_runs import DIGITS64, LM  # noqa: E402
from harness.model_sizes import SIZES, post_model_sizes  # noqa: E402
from harness.model_sizes import run_id as sizes_run_id  # noqa: E402

#: name -> (path, whether the page draws charts)
PAGES = {
    "runs": ("/runs", False),
    "run": (f"/run?run={DIGITS64}", True),
    "run_tokens": (f"/run?run={LM}&x=examples", True),
    "compare_runs": (
        "/compare-runs?runs=" + "&runs=".join([DIGITS64, "digits0512" + "0" * 22, LM]),
        True,
    ),
    "compare_tasks": ("/compare-tasks", True),
    # the paper's figure: every task on one chart, each in its own units
    "compare_tasks_paper": ("/compare-tasks?together=true", True),
    "critical_batch": (f"/critical-batch?task={quote('vision/digits', safe='')}", True),
    "what_if": (f"/what-if?task={quote('vision/digits', safe='')}&b=512&step_time=0.3", True),
    # last: its runs (``harness.model_sizes``) are posted just before it, so no other page
    # shows them
    "compare_sizes": (
        "/compare-runs?runs=" + "&runs=".join(sizes_run_id(n) for n in SIZES),
        True,
    ),
}


def shoot(
    base: str,
    out: Path,
    executable: str,
    only: list[str] | None = None,
    server: str | None = None,
    workdir: Path | None = None,
    prefix: str = "dashboard_",
) -> list[str]:
    """Screenshot every page; returns the requests that left the machine (should be none).
    ``server`` and ``workdir``: the synthetic server, to post the model-size runs to before
    their page (without them that page is skipped)."""
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    with sync_playwright() as p:
        browser = _stack.browser(p, executable)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: None if _stack.local_only(r.url) else outside.append(r.url))
        try:
            for name, (path, charts) in PAGES.items():
                if only and name not in only:
                    continue
                if name == "compare_sizes":
                    if server is None or workdir is None:
                        print("skipped compare_sizes: it needs the synthetic server")
                        continue
                    post_model_sizes(server, workdir)
                page.set_viewport_size({"width": 1400, "height": 1000})
                _stack.open_page(page, base + path, charts=charts)
                _stack.fit_height(page)
                target = out / f"{prefix}{name}.png"
                page.screenshot(path=str(target), full_page=True)
                print(
                    f"wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}"
                )
        finally:
            browser.close()
    return outside


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--server", help="a running server to read instead of synthetic data")
    parser.add_argument("--only", nargs="*", choices=list(PAGES), help="just these pages")
    parser.add_argument(
        "--prefix",
        default="dashboard_",
        help="file name prefix (docs/reproduction.md's figure: --prefix reproduction_)",
    )
    args = parser.parse_args(argv)
    executable = _stack.chromium()
    if executable is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        server: str | None = None
        workdir: Path | None = None
        if args.server:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dash-")))
            base = stack.enter_context(_stack.dashboard(args.server, work / "dashboard.log"))
        else:
            synthetic = stack.enter_context(_stack.stack())
            base, server, workdir = synthetic.base, synthetic.server.url, synthetic.workdir
        outside = shoot(base, args.out, executable, args.only, server, workdir, args.prefix)
    if outside:
        print("requests that left the machine:", *outside, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
