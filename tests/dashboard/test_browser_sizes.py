"""The Compare runs page's model-size chart in a real browser: a server holding runs of two
model sizes with branch runs (``harness.model_sizes``), ``streamlit run`` reading it, headless
Debian Chromium through Playwright (as ``test_browser``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import ServerProcess
from harness import dashboard_stack as _stack
from harness.model_sizes import SIZES, post_model_sizes
from noisescope import Api
from noisescope_dashboard import _sizes

from .test_browser import _chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    _chromium()
    tmp: Path = tmp_path_factory.mktemp("sizes_stack")
    with ServerProcess() as server:
        ids = post_model_sizes(server.url, tmp)
        with _stack.dashboard(server.url, tmp / "dashboard.log") as base:
            yield base, ids | {"server": server.url}


def test_model_sizes_chart_draws_and_its_tooltip_names_the_size(
    sized: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    base, ids = sized
    runs = [ids[name] for name in SIZES]
    outside: list[str] = []
    with sync_playwright() as p:
        browser = _stack.browser(p, _chromium())
        page: Any = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.on("request", lambda r: None if _stack.local_only(r.url) else outside.append(r.url))
        try:
            _stack.open_page(page, base + "/compare-runs?runs=" + "&runs=".join(runs))
            heading = page.get_by_role("heading", name=_sizes.TITLE)
            heading.wait_for(timeout=30_000)
            assert page.locator("[data-testid='stException']").count() == 0
            chart = page.locator("[data-testid='stVegaLiteChart']").last
            chart.scroll_into_view_if_needed()
            chart.locator("canvas, svg").first.wait_for(timeout=30_000)
            box = chart.bounding_box()
            assert box is not None and box["height"] > 200
            page.screenshot(path=str(tmp_path / "compare_sizes.png"), full_page=True)
            # sweep the chart for a branch point's tooltip: it names the model size
            tip = page.locator("#vg-tooltip-element")
            with Api(ids["server"]) as api:
                steps = {p.step for name in SIZES for p in api.branches(ids[name]).points}
            found = ""
            for fy in range(2, 98, 3):
                for fx in range(2, 98, 2):
                    page.mouse.move(
                        box["x"] + box["width"] * fx / 100, box["y"] + box["height"] * fy / 100
                    )
                    text = tip.inner_text() if tip.count() and tip.is_visible() else ""
                    if "local B_crit" in text:
                        found = text
                        break
                if found:
                    break
            assert found, "no branch point's tooltip found on the chart"
            assert "params" in found and "model size" in found
            assert any(f"{s:,}" in found or str(s) in found for s in steps)
            assert not outside, f"requests left the machine: {outside}"
        finally:
            browser.close()
