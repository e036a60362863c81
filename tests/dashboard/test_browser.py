"""The dashboard in a real browser: ``noisescope up`` on a fresh database loaded by the bundled
example, every page driven in headless Debian Chromium through Playwright, a PNG per page.

Screenshots land in the test's temporary folder (printed at the end; keep them with
``--basetemp``). Without Chromium the test skips, except under CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.browser import CHROMIUM_ARGS
from tests.support.servers import free_port

from ._synth import default_runs, insert_runs

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
#: Steps of the example run (torch on a shared CPU: keep it short, one thread).
EXAMPLE_STEPS = 120


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is required in CI (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium) and CI is not set")
    return path


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"noisescope up exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``noisescope up`` on a fresh NOISESCOPE_HOME loaded by the example: (dashboard, home)."""
    _chromium()  # skip (or fail under CI) before paying for the start-up
    home = tmp_path_factory.mktemp("noisescope_home")
    port, dash_port = free_port(), free_port()
    env = {**os.environ, "NOISESCOPE_HOME": str(home)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    log = (home / "up.log").open("wb")
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "noisescope.cli",
            "up",
            "--port",
            str(port),
            "--dashboard-port",
            str(dash_port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait(f"http://127.0.0.1:{port}/api/v1/health", up)
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "digits.py"),
                "--url",
                f"http://127.0.0.1:{port}",
                "--steps",
                str(EXAMPLE_STEPS),
                "--name",
                "example-b64",
            ],
            env={**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            check=True,
            timeout=600,
            capture_output=True,
        )
        # A batch-size sweep with known B_crit beside it (through the server's write path),
        # so the Critical batch size and What-if pages have a fit to show.
        insert_runs(f"sqlite:///{home / 'noisescope.db'}", default_runs())
        _wait(f"http://127.0.0.1:{dash_port}/_stcore/health", up)
        yield f"http://127.0.0.1:{dash_port}", home
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()


def test_every_page_in_chromium(stack: tuple[str, Path], tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    executable = _chromium()
    base, _home = stack
    sweep = quote("vision/digits", safe="")
    pages = [
        ("runs", "/runs", ["Runs", "8 of 8 runs", "Select a row to open the run."]),
        ("run", "/run", ["example-b64", "Batch in use", "B_simple (latest window)"]),
        ("compare_runs", "/compare-runs", ["Compare runs", "Per task"]),
        ("compare_tasks", "/compare-tasks", ["Summary per task", "digits-mlp"]),
        (
            "critical_batch",
            f"/critical-batch?task={sweep}",
            ["6 runs at 6 batch sizes", "Model (science.md"],
        ),
        ("what_if", f"/what-if?task={sweep}&b=512", ["Steps / minimum", "halving it would save"]),
    ]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        # Streamlit scrolls inside its own container: a tall viewport shows the whole page.
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        try:
            for name, path, expected in pages:
                page.goto(base + path, wait_until="domcontentloaded")
                page.wait_for_selector(
                    "[data-testid='stApp'][data-test-script-state='notRunning']", timeout=60_000
                )
                for text in expected:
                    expect(page.get_by_text(text, exact=False).first).to_be_visible(timeout=30_000)
                assert page.locator("[data-testid='stException']").count() == 0, name
                if name not in ("runs",):
                    # Altair charts are drawn by vega-embed into canvas/svg
                    expect(page.locator("[data-testid='stVegaLiteChart']").first).to_be_visible(
                        timeout=30_000
                    )
                page.wait_for_timeout(800)  # let Vega finish drawing before the screenshot
                page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            # the Run page keeps its state in the URL: a shared link restores it
            page.goto(
                base + "/run?x=time&smooth=ema&run=" + "lm" + "0" * 30,
                wait_until="domcontentloaded",
            )
            page.wait_for_selector(
                "[data-testid='stApp'][data-test-script-state='notRunning']", timeout=60_000
            )
            expect(page.get_by_text("Per layer").first).to_be_visible(timeout=30_000)
            expect(page.get_by_text("<b>lm</b> **run**").first).to_be_visible(timeout=30_000)
            page.screenshot(path=str(tmp_path / "run_shared_link.png"), full_page=True)
        finally:
            browser.close()
    shots = sorted(tmp_path.glob("*.png"))
    assert [s.stem for s in shots] == sorted([*(n for n, _, _ in pages), "run_shared_link"])
    assert all(s.stat().st_size > 10_000 for s in shots)
    print(f"screenshots: {tmp_path}")
