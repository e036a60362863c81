"""The dashboard in a real browser: a server on synthetic runs, the dashboard started as
``noisescope dashboard`` starts it (NOISESCOPE_URL only), every page driven in headless Debian
Chromium through Playwright.

Checks what AppTest cannot: ``/runs`` itself opens the Runs page, names made of Markdown and
HTML render as text (no element, link or script comes of them), unknown runs and tasks say
"not found", no Deploy button shows, and no request leaves the machine (page icon, fonts,
Vega). The server's API docs pages (Swagger UI, ReDoc) render every operation with every
request off the machine refused. Screenshots land in the test's temporary folder (keep them
with ``--basetemp``).
Without Chromium the test skips, except under CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import requests

from harness import dashboard_stack as _stack
from harness.dashboard_runs import DIGITS64, HOSTILE_TASK, LM, NOTICE, NOTICE_MESSAGE, SHORT
from noisescope import Api
from noisescope_dashboard import _text

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _chromium() -> str:
    path = _stack.chromium()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is required in CI (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium) and CI is not set")
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_stack.Stack]:
    _chromium()  # skip (or fail under CI) before paying for the start-up
    with _stack.stack(tmp_path_factory.mktemp("dash_stack")) as running:
        yield running


#: What Streamlit's own frontend logs on every page opened at a path: it probes for its server
#: under the page's path first (``/runs/_stcore/health``) and gets a 404 there.
_STREAMLIT_PROBE = re.compile(r"/_stcore/(health|host-config)$")


@pytest.fixture(scope="module")
def console() -> list[str]:
    """Console errors and warnings of the browser page, and its uncaught errors, except
    Streamlit's own probes (``_STREAMLIT_PROBE``): what the dashboard's code (its charts,
    through Vega) makes the browser complain about. Tests clear it before a page."""
    return []


def _on_console(console: list[str], message: Any) -> None:
    if message.type not in ("error", "warning"):
        return
    where = str(message.location.get("url", ""))
    if message.text.startswith("Failed to load resource") and _STREAMLIT_PROBE.search(where):
        return
    console.append(f"{message.type}: {message.text} ({where})")


@pytest.fixture(scope="module")
def browser_page(
    stack: _stack.Stack, console: list[str]
) -> Iterator[tuple[Any, list[str], list[str]]]:
    """One Chromium page, the requests that left the machine, and any dialogs opened."""
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as p:
        browser = _stack.browser(p, _chromium())
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.on("request", lambda r: None if _stack.local_only(r.url) else outside.append(r.url))
        page.on("console", lambda m: _on_console(console, m))
        page.on("pageerror", lambda e: console.append(f"uncaught: {e}"))

        def on_dialog(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)
        try:
            yield page, outside, dialogs
        finally:
            browser.close()


def _body(page: Any) -> str:
    return str(page.inner_text("body"))


def _no_markup_from_names(page: Any) -> None:
    """No element, link or script came out of a run, tag or task name."""
    assert page.evaluate("window.__ns_xss === undefined")
    injected = page.evaluate(
        "[...document.querySelectorAll('a[href^=\"javascript\"], script')]"
        ".filter(e => !e.src && (e.href || e.textContent).includes('alert')).length"
    )
    assert injected == 0
    bold = page.evaluate(
        "[...document.querySelectorAll('b, strong')].filter(e => e.textContent === 'lm'"
        " || e.textContent === 'run' || e.textContent === 'bold').length"
    )
    assert bold == 0


PAGES = [
    ("runs", "/runs", ["Runs", "27 of 27 runs", "<b>lm</b> **run**", HOSTILE_TASK], False),
    ("home", "/", ["Runs", "Select a row to open the run."], False),
    ("run", f"/run?run={DIGITS64}", ["B_simple now", "the same value as the Runs table"], True),
    ("run_tokens", f"/run?run={LM}", ["<b>lm</b> **run**", "<script>alert(1)</script>"], True),
    ("run_notice", f"/run?run={NOTICE}", [_text.sentence(NOTICE_MESSAGE)], False),
    # too few samples for an interval: an empty band drew "Infinite extent for field x"
    ("run_short", f"/run?run={SHORT}", ["No B_simple now"], True),
    ("compare_runs", "/compare-runs", ["Compare runs", "These runs now"], True),
    ("compare_tasks", "/compare-tasks", ["B_simple against B_crit across tasks"], True),
    (
        "critical_batch",
        f"/critical-batch?task={quote('vision/digits', safe='')}",
        ["Per loss target", "Loss used:"],
        True,
    ),
    (
        "critical_batch_hostile",
        f"/critical-batch?task={quote('vision/' + HOSTILE_TASK, safe='')}",
        [f"vision/{HOSTILE_TASK}", "3 or more batch sizes"],
        False,
    ),
    (
        "what_if",  # the speed-up chart drew "Conflicting legend property" before
        f"/what-if?task={quote('vision/digits', safe='')}&b=512",
        ["Past ", "past the limit"],
        True,
    ),
]


@pytest.mark.parametrize(("name", "path", "expected", "charts"), PAGES, ids=[p[0] for p in PAGES])
def test_page_in_chromium(
    stack: _stack.Stack,
    browser_page: tuple[Any, list[str], list[str]],
    console: list[str],
    tmp_path: Path,
    name: str,
    path: str,
    expected: list[str],
    charts: bool,
) -> None:
    """The page renders what it should, as text, with no request off the machine and no
    console error or warning from the dashboard's code (Vega's included)."""
    page, outside, dialogs = browser_page
    console.clear()
    _stack.open_page(page, stack.base + path, charts=charts)
    for text in expected:  # as text: tables keep theirs in hidden grid cells, selects in inputs
        page.wait_for_function(
            "t => document.body.textContent.includes(t)"
            " || [...document.querySelectorAll('input')].some(i => i.value.includes(t))",
            arg=text,
            timeout=30_000,
        )
    body = _body(page)
    assert "Page not found" not in body and "You have requested page" not in body
    assert page.locator("[data-testid='stException']").count() == 0
    # started as `noisescope dashboard` starts it: no Deploy button, no developer menu
    assert page.locator("[data-testid='stAppDeployButton']").count() == 0
    assert page.get_by_role("button", name="Deploy").count() == 0
    _no_markup_from_names(page)
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert not dialogs
    assert not outside, f"requests left the machine: {outside}"
    assert console == [], console


_MEASURE = """async ([texts]) => {
  const grid = document.querySelector(
    "[data-testid='stDataFrameResizable'] .stDataFrameGlideDataEditor");
  const style = getComputedStyle(grid);
  const font = `${style.getPropertyValue('--gdg-base-font-style').trim()} `
    + style.getPropertyValue('--gdg-font-family').trim();
  await document.fonts.load(font);
  const padding = parseFloat(style.getPropertyValue('--gdg-cell-horizontal-padding'));
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = font;
  return texts.map(t => Math.ceil(ctx.measureText(t).width + 2 * padding));
}"""


@pytest.mark.parametrize(
    ("view", "query", "fitted"),
    [
        ("runs", {}, ["name", "project", "task", "status", "tags", "why"]),
        ("critical_batch", {"task": "vision/digits"}, ["warnings"]),
    ],
)
def test_table_columns_show_their_text_whole(
    stack: _stack.Stack,
    browser_page: tuple[Any, list[str], list[str]],
    monkeypatch: pytest.MonkeyPatch,
    view: str,
    query: dict[str, str],
    fitted: list[str],
) -> None:
    """Issue 30: the Runs table cut the Task and "No B_simple because" columns, the Critical
    batch table its frontier. The widths the page gives its text columns (read from the
    page's own element, AppTest) hold every cell and header as the browser's font draws it."""
    from streamlit.testing.v1 import AppTest

    from noisescope_dashboard._ui import NAMED_WIDTHS

    from .conftest import APP

    monkeypatch.setenv("NOISESCOPE_URL", stack.server.url)
    at = AppTest.from_file(str(APP.parent / "views" / f"{view}.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    element = at.dataframe[0]
    frame = element.value
    columns = json.loads(element.proto.columns)
    page, _, _ = browser_page
    _stack.open_page(
        page, f"{stack.base}/{view.replace('_', '-')}?{urlencode(query)}", charts=False
    )
    cut = []
    for name in fitted:
        config = columns[name]
        width = config["width"]
        width = NAMED_WIDTHS.get(width, width) if isinstance(width, str) else width
        texts = [str(config.get("label") or name), *map(str, frame[name])]
        needed = page.evaluate(_MEASURE, [texts])
        cut += [
            (name, text, need, width)
            for text, need in zip(texts, needed, strict=True)
            if need > width
        ]
    assert not cut, f"cut off (column, text, pixels needed, column width): {cut}"


_GRID = "[data-testid='stDataFrameResizable']"
#: The selection checkbox column the grid draws before the first data column.
_ROW_MARKER_PX = 33


def _column_px(config: dict[str, Any]) -> int:
    from noisescope_dashboard._ui import NAMED_WIDTHS

    width = config.get("width") or NAMED_WIDTHS["medium"]
    return int(NAMED_WIDTHS.get(width, 0) if isinstance(width, str) else width)


def test_every_page_at_1400_by_900_opens_on_the_answer(
    stack: _stack.Stack,
    browser_page: tuple[Any, list[str], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 47's "Done when", at 1400 x 900 after a sweep is loaded: What-if opens on a swept
    task; Compare runs leaves short runs out, one click offers them; the Critical batch size
    page shows its per-target table above its warnings, folded behind one summary line; the
    Runs table shows its numbers in view and every column is reached by scrolling."""
    from streamlit.testing.v1 import AppTest

    from .conftest import APP

    page, outside, _ = browser_page
    page.set_viewport_size({"width": 1400, "height": 900})
    try:
        # What-if from the top bar: a swept task, not the first one by name (nlp/lm)
        _stack.open_page(page, f"{stack.base}/what-if", charts=True)
        task = page.locator("[data-testid='stSelectbox'] input").first.input_value()
        assert task in ("nlp/lm-sweep", "vision/digits"), task
        assert (
            "B_crit at loss"
            in page.locator("[data-testid='stSelectbox'] input").nth(1).input_value()
        )

        # Compare runs: the short run is not offered until the box is ticked
        _stack.open_page(page, f"{stack.base}/compare-runs", charts=True)
        assert "Not offered: 2 runs under 64 samples" in _body(page)
        page.get_by_text("Also offer diverged runs").click()
        page.wait_for_function("() => !document.body.innerText.includes('Not offered:')")

        # Critical batch size: the table above the warnings, which fold behind one line
        targets = quote("1, 0.05, 0.04", safe="")
        path = f"/critical-batch?task={quote('vision/digits', safe='')}&targets={targets}"
        _stack.open_page(page, stack.base + path, charts=True)
        table_y = page.locator(_GRID).first.bounding_box()["y"]
        folded = page.locator("[data-testid='stExpander']").first
        assert "3 warnings:" in folded.inner_text()
        assert folded.bounding_box()["y"] > table_y
        assert folded.bounding_box()["height"] < 80  # one line, closed
        assert page.locator("[data-testid='stAlert']:visible").count() == 0  # all folded

        # Runs: the numbers are in view; the rest is reached by scrolling sideways
        monkeypatch.setenv("NOISESCOPE_URL", stack.server.url)
        at = AppTest.from_file(str(APP.parent / "views" / "runs.py"), default_timeout=120)
        at.run()
        element = at.dataframe[0]
        columns = json.loads(element.proto.columns)
        order = list(element.proto.column_order)
        _stack.open_page(page, f"{stack.base}/runs", charts=False)
        grid = page.locator(_GRID).first
        shown = grid.bounding_box()["width"]
        # issue 56 item 7: the batch, its ratio, loss and step are in view (they came after
        # the reason sentences, out of view); the reason follows them, whole, by scrolling
        to_step = sum(_column_px(columns[c]) for c in order[: order.index("step") + 1])
        assert to_step + _ROW_MARKER_PX < shown, (to_step, shown)
        assert order.index("why") > order.index("step")
        total = sum(_column_px(columns[c]) for c in order)
        scroller = grid.locator(".dvn-scroller").first
        reach = scroller.evaluate("e => e.scrollWidth")
        assert reach >= total, (reach, total)  # every column lies inside the scrolled grid
        scroller.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
        assert scroller.evaluate("e => e.scrollLeft + e.clientWidth >= e.scrollWidth - 2")
        assert not outside
    finally:
        page.set_viewport_size({"width": 1400, "height": 1600})


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/run?run=no-such-run", "no-such-run"),
        (f"/critical-batch?task={quote('vision/nope', safe='')}", "vision/nope"),
        (f"/what-if?task={quote('x/y', safe='')}", "x/y"),
    ],
)
def test_unknown_things_are_not_found(
    stack: _stack.Stack, browser_page: tuple[Any, list[str], list[str]], path: str, named: str
) -> None:
    from playwright.sync_api import expect

    page, outside, _ = browser_page
    _stack.open_page(page, stack.base + path, charts=False)
    error = page.locator("[data-testid='stAlertContentError']").first
    expect(error).to_be_visible(timeout=30_000)
    assert named in error.inner_text() and "not found" in error.inner_text()
    assert page.locator("[data-testid='stVegaLiteChart']").count() == 0
    assert page.locator("[data-testid='stMetric']").count() == 0
    assert not outside


def test_selecting_a_row_opens_that_run_with_the_same_number(
    stack: _stack.Stack, browser_page: tuple[Any, list[str], list[str]]
) -> None:
    from playwright.sync_api import expect

    page, outside, _ = browser_page
    _stack.open_page(page, stack.base + "/runs", charts=False)
    grid = page.locator("[data-testid='stDataFrameResizable']").first
    box = grid.bounding_box()
    assert box is not None
    row_px = 35  # Streamlit's row height; the third row is the live token run
    page.mouse.click(box["x"] + 15, box["y"] + row_px * 3 + row_px / 2)
    link = page.locator("[data-testid='stPageLink-NavLink']").first
    expect(link).to_be_visible(timeout=30_000)
    assert "<b>lm</b> **run**" in link.inner_text()
    link.click()
    page.wait_for_url("**/run?run=" + LM, timeout=30_000)
    page.wait_for_selector(_stack.READY, timeout=90_000)
    with Api(stack.server.url) as api:
        expected = _text.count(api.run(LM).b_simple)
    metric = page.locator("[data-testid='stMetricValue']").first
    expect(metric).to_have_text(expected, timeout=30_000)  # the Runs table's B_simple now
    assert not outside


def test_chart_tooltips_show_names_as_text(
    stack: _stack.Stack, browser_page: tuple[Any, list[str], list[str]]
) -> None:
    """An event payload with HTML in it (the live run's checkpoint mark) reads literally in
    the chart's tooltip: Vega's tooltip escapes it."""
    page, _, _ = browser_page
    _stack.open_page(page, stack.base + f"/run?run={LM}&x=step", charts=True)
    chart = page.locator("[data-testid='stVegaLiteChart']").first
    box = chart.bounding_box()
    assert box is not None
    tip = page.locator("#vg-tooltip-element")
    text = ""
    for dx in range(int(box["width"])):  # sweep the top of the chart until the mark's tooltip
        page.mouse.move(box["x"] + dx, box["y"] + box["height"] * 0.15)
        text = tip.inner_text() if tip.count() else ""
        if "checkpoint" in text:
            break
    assert "checkpoint: path=<b>ckpt</b>" in text
    assert page.locator("#vg-tooltip-element b").count() == 0


@pytest.mark.parametrize(
    ("path", "operation"),
    [("/api/v1/docs", ".opblock-summary-description"), ("/api/v1/redoc", "[id^='operation/'] h2")],
    ids=["swagger", "redoc"],
)
def test_the_api_docs_render_offline(
    stack: _stack.Stack,
    browser_page: tuple[Any, list[str], list[str]],
    tmp_path: Path,
    path: str,
    operation: str,
) -> None:
    """The page ``noisescope up`` prints renders every operation's summary with requests off
    the machine aborted, none attempted, and no console error."""
    page, _, _ = browser_page
    schema = requests.get(f"{stack.server.url}/api/v1/openapi.json", timeout=10).json()
    summaries = sorted(op["summary"] for ops in schema["paths"].values() for op in ops.values())
    context = page.context.browser.new_context(viewport={"width": 1400, "height": 1600})
    attempted: list[str] = []
    errors: list[str] = []

    def only_local(route: Any) -> None:
        if _stack.local_only(route.request.url):
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    context.route("**/*", only_local)
    docs = context.new_page()
    docs.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    docs.on("pageerror", lambda e: errors.append(str(e)))
    try:
        docs.goto(stack.server.url + path, wait_until="networkidle")
        docs.wait_for_function(
            "([sel, n]) => document.querySelectorAll(sel).length >= n",
            arg=[operation, len(summaries)],
            timeout=30_000,
        )
        shown = sorted(t.strip() for t in docs.locator(operation).all_inner_texts())
        docs.screenshot(path=str(tmp_path / "api_docs.png"))
    finally:
        context.close()
    assert shown == summaries
    assert not attempted, f"requests off the machine: {attempted}"
    # ReDoc's own logo, refused by the page's policy before any request was made
    logo = "https://cdn.redoc.ly/redoc/logo-mini.svg"
    assert [e for e in errors if not (logo in e and "Content Security Policy" in e)] == []


def _log_steps(run: Any, steps: range, loss: float) -> None:
    """Two-batch samples of |G|² = 1, tr(Σ) = 100 (B_simple 100) at a fixed loss."""
    for step in steps:
        run.log_sample(step, 8.0, 32.0, 1.0 + 100.0 / 8.0, 1.0 + 100.0 / 32.0, loss=loss)


def test_the_run_page_follows_a_live_run(
    stack: _stack.Stack, browser_page: tuple[Any, list[str], list[str]], tmp_path: Path
) -> None:
    """While a run is running its page re-reads the server by itself: samples posted after
    the page opened show on it without a reload. (Last in this module: it adds a run.)"""
    from playwright.sync_api import expect

    import noisescope

    page, outside, _ = browser_page
    run = noisescope.init(
        stack.server.url,
        project="live",
        task="follow",
        name="follow-me",
        batch_size=8,
        dir=tmp_path / "spool",
        quiet=True,
    )
    try:
        _log_steps(run, range(1, 101), loss=2.0)
        assert run.flush(30)
        _stack.open_page(page, stack.base + f"/run?run={run.id}", charts=True)
        loss = (
            page.locator("[data-testid='stMetric']")
            .filter(has_text="Loss")
            .locator("[data-testid='stMetricValue']")
        )
        expect(loss).to_have_text(_text.loss(2.0), timeout=30_000)
        loads = page.evaluate("performance.getEntriesByType('navigation').length")
        _log_steps(run, range(101, 201), loss=0.5)
        assert run.flush(30)
        expect(loss).to_have_text(_text.loss(0.5), timeout=60_000)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == loads
    finally:
        run.finish()
    assert not outside
