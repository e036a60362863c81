"""Browser safety: runs, tasks, projects, tags and series named with HTML/JS are shown as text
by the dashboard, checked in headless Chromium (Playwright driving the system browser)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness import CHROMIUM_ARGS
from reliability._hostile import good_columns
from reliability._infra import Server, port

#: Each payload sets ``window.__ns_xss`` (or opens a dialog) if it ever runs.
PAYLOADS = [
    '<img src=x onerror="window.__ns_xss=1">',
    "<script>window.__ns_xss=2</script>",
    '<svg onload="window.__ns_xss=3"></svg>',
    "[click](javascript:window.__ns_xss=4)",
    "**bold** <b>b</b>",
]


@dataclass
class BrowserResult:
    pages: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    shown_as_text: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.shown_as_text > 0


def seed_runs(server: Server) -> list[str]:
    """One run per payload (name, task, tags and a layer series carry it)."""
    uids = []
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as client:
        for i, payload in enumerate(PAYLOADS):
            uid = uuid.uuid4().hex
            body = {
                "project": "xss",
                "task": f"task {payload}"[:200],
                "name": payload,
                "tags": [payload],
                "config": {"note": payload},
                "batch_size": 32,
            }
            client.put(f"/runs/{uid}", json=body).raise_for_status()
            cols = good_columns(200, 0)
            client.post(f"/runs/{uid}/samples", json={"columns": cols}).raise_for_status()
            cols = good_columns(200, 1000 + i)
            cols["series"] = [f"layer {payload}"[:200]] * 200
            client.post(f"/runs/{uid}/samples", json={"columns": cols}).raise_for_status()
            uids.append(uid)
    return uids


def _wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def check_dashboard(
    server_url: str, uids: list[str], workdir: Path, *, overview_pages: bool = True
) -> BrowserResult:
    """Open the dashboard (a client of the server at ``server_url``) on the hostile runs."""
    from playwright.sync_api import sync_playwright

    from noisescope_server.cli import dashboard_command, dashboard_env

    result = BrowserResult()
    chromium = shutil.which("chromium")
    if chromium is None:
        result.problems.append("no chromium on PATH")
        return result
    dash_port = port()
    log = open(workdir / "dashboard.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        dashboard_command(dash_port),
        env=dashboard_env(server_url),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{dash_port}"
    try:
        if not _wait_http(f"{base}/_stcore/health", 120):
            result.problems.append("dashboard did not start")
            return result
        pages = [(f"run {i}", f"/run?run={uid}") for i, uid in enumerate(uids)]
        if overview_pages:
            pages = [("runs", "/runs"), *pages]
            # ?all=true: the hostile runs are short, which Compare runs leaves out by default
            pages += [
                ("compare runs", "/compare-runs?all=true"),
                ("compare tasks", "/compare-tasks"),
            ]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page()
            dialogs: list[str] = []

            def _on_dialog(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", _on_dialog)
            for label, path in pages:
                page.goto(base + path, wait_until="domcontentloaded")
                page.wait_for_selector(
                    "[data-testid='stApp'][data-test-script-state='notRunning']", timeout=90_000
                )
                page.wait_for_timeout(500)
                fired = page.evaluate("window.__ns_xss")
                injected = page.evaluate(
                    "document.querySelectorAll("
                    '\'img[src="x"], svg[onload], a[href^="javascript"]\').length'
                )
                body = page.inner_text("body")
                literal = sum(p in body for p in PAYLOADS)
                result.shown_as_text += literal
                errors = page.locator("[data-testid='stException']").count()
                result.pages[label] = (
                    f"script ran: {fired is not None}, injected elements: {injected}, "
                    f"payloads shown as text: {literal}, exceptions: {errors}"
                )
                if fired is not None or injected or dialogs:
                    result.problems.append(f"{label}: injected HTML/JS took effect")
                if errors:
                    result.problems.append(f"{label}: the page raised an exception")
            browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return result
