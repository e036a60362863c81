"""Streamlit pieces every page shares: the connection guard, API errors, empty states, charts
with their downloads.

A page is a function of the server it reads (``_data.Source``), run by ``run_page``: with no
server configured, an unreachable one or a refused token, the page says what to do instead of
showing a traceback. User text goes through ``_text.md`` (or a dataframe), never
``unsafe_allow_html``.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from noisescope import AnswerError, ApiError, NotFoundError, TaskSummary, protocol

from . import _data, _state, _text
from ._text import md

__all__ = [
    "QUICKSTART",
    "chart_with_downloads",
    "connect",
    "explain_api_error",
    "fit_columns",
    "not_found",
    "run_page",
    "show_warnings",
    "table",
    "warnings_summary",
]

#: What a user adds to a training loop; shown wherever there is nothing to display yet.
QUICKSTART = """\
import noisescope
from noisescope.torch import GradientNoiseProbe

run = noisescope.init(project="demo", task="digits", batch_size=64)   # 1
probe = GradientNoiseProbe(model, run)                                # 2
for x, y in loader:                # your loop; with k micro-batches per step:
    ...                            #   loss.backward(); probe.micro_step(batch_size=len(x))
    probe.step(loss=loss.item())   # 3: after the backward(s), before clipping
    optimizer.step()
run.finish()
"""


def connect() -> _data.Source:
    """The server to read, after checking it answers; otherwise say what to do, and stop."""
    src = _data.source()
    if src is None:
        st.warning(
            f"No noisescope server configured. Start everything with `noisescope up`, or run "
            f"`noisescope dashboard --url URL` (it sets `{_data.URL_ENV}`), or set "
            f"`{_data.URL_ENV}` to the server's address (e.g. `http://127.0.0.1:8765`) before "
            "starting the dashboard."
        )
        st.stop()
    try:
        projects = _data.projects(src)
    except ApiError as exc:
        explain_api_error(exc, src)
        st.stop()
    if not projects:
        st.info(
            "No runs yet. Add these lines to a training loop (or run the bundled example, "
            "`python examples/digits.py`), and the run appears here live:"
        )
        st.code(QUICKSTART, language="python")
        st.stop()
    return src


#: In ``noisescope.Api``'s words for a web page where an answer should be (the dashboard's
#: own URL given as the server's), which already name the server's URL to use.
_NOT_THE_SERVER = "is not a noisescope server"


def explain_api_error(exc: ApiError, src: _data.Source) -> None:
    """An API error in words, with what to do about it."""
    where = md(protocol.redact_url(src.url))  # a password in NOISESCOPE_URL stays off the page
    if exc.status == 0:
        st.error(
            f"Cannot reach the noisescope server at {where}. Start it with `noisescope up` "
            f"(or `noisescope server`), or point the dashboard at the right one with "
            f"`noisescope dashboard --url URL` or `{_data.URL_ENV}`, then reload. "
            f"({md(exc.detail)})"
        )
    elif isinstance(exc, AnswerError) and _NOT_THE_SERVER in exc.detail:  # a web page
        st.error(
            f"The dashboard reads from {where}, which is not the noisescope server: "
            f"{md(exc.detail)}. Point it at the server with `noisescope dashboard --url URL` "
            f"or `{_data.URL_ENV}`, then reload."
        )
    elif isinstance(exc, AnswerError):
        st.error(
            f"The server at {where} sent an answer the dashboard cannot read: "
            f"{md(exc.detail)}. Is it a noisescope server of this version?"
        )
    elif exc.status in (401, 403):
        st.error(
            f"The server at {where} refused the token (HTTP {exc.status}: {md(exc.detail)}). "
            f"Set `{_data.TOKEN_ENV}` (or `noisescope dashboard --token`) to a token of the "
            "project you want to see, or leave it unset on a server with auth off."
        )
    else:
        st.error(f"The server at {where} answered HTTP {exc.status}: {md(exc.detail)}")


#: After "not found": what to do. The navigation is the bar at the top (``app.py``), and the
#: Runs page lists every run and task.
_PICK_ANOTHER = "Check the link, or start again from Runs in the bar at the top."


def not_found(what: str, detail: str = "") -> None:
    """A page opened on something that does not exist: say so, name it, and stop."""
    st.error(f"{what} not found" + (f": {md(detail)}" if detail else "") + f". {_PICK_ANOTHER}")
    st.stop()


def pick_task(tasks: Sequence[TaskSummary], *, container: Any = None) -> TaskSummary:
    """The task in ``?task=project/task``, else the picker's (first in ``tasks``' order); a URL
    naming no task, or a server with none, stops the page saying so."""
    by_key = {_text.task_key(t.project, t.task): t for t in tasks}
    wanted = st.query_params.get("task")
    if wanted and wanted not in by_key:
        not_found(f"Task {md(wanted)}", "no task of that name on this server")
    key = _state.select(
        "Task (project/task)", list(by_key), key="task", keep=True, container=container
    )
    if key is None:
        st.info("No task yet: tasks appear once training runs post samples.")
        st.stop()
    return by_key[str(key)]


def run_page(main: Callable[[_data.Source], None]) -> None:
    """Run a page against the configured server, turning API errors into messages."""
    src = connect()
    try:
        main(src)
    except NotFoundError as exc:
        st.error(f"Not found: {md(exc.detail)}. {_PICK_ANOTHER}")
    except ApiError as exc:
        explain_api_error(exc, src)


#: Streamlit's named column widths, in pixels.
NAMED_WIDTHS = {"small": 75, "medium": 200, "large": 400}
#: A table cell's text: at most this many pixels a character in the grid's font (14 px Source
#: Sans; its widest common letters, W and M, are about 12), its padding, and a header's room
#: for the sort and help icons. tests/dashboard/test_browser.py measures the real font.
CHAR_PX, CELL_PADDING_PX, HEADER_ICONS_PX = 8.5, 18, 24


def text_px(text: str) -> int:
    """Pixels a column needs to show ``text`` whole."""
    return int(len(text) * CHAR_PX) + CELL_PADDING_PX


def fit_columns(
    frame: pd.DataFrame, columns: Mapping[str, Any], names: Sequence[str]
) -> dict[str, Any]:
    """``columns`` with each of ``names`` at least as wide as its header and every cell of
    ``frame`` in it: a cut task name or reason reads as another one. A column not in
    ``columns`` gets a text column headed by its name."""
    fitted = dict(columns)
    for name in names:
        config = dict(fitted.get(name) or st.column_config.TextColumn(name))
        label = str(config.get("label") or name)
        given = config.get("width")
        cells = [str(v) for v in frame[name]] if name in frame else []
        config["width"] = max(
            NAMED_WIDTHS.get(given, 0) if isinstance(given, str) else int(given or 0),
            text_px(label) + HEADER_ICONS_PX,
            *map(text_px, cells),
        )
        fitted[name] = config
    return fitted


def described(helps: Mapping[str, str]) -> dict[str, Any]:
    """Text columns shown under their own names, each with its tooltip (column to text)."""
    return {name: st.column_config.TextColumn(name, help=text) for name, text in helps.items()}


#: The runs table's columns (``_frames.runs_table``) in the order shown, with their headers and
#: tooltips: the Runs page shows them all, Compare runs some (the frame has more: ``uid`` and
#: the raw numbers sorted on).
RUN_COLUMNS = {
    "name": st.column_config.TextColumn("Run", width=200),
    "task": st.column_config.TextColumn("Task", width="small"),
    "status": st.column_config.TextColumn("Status", width="small"),
    "b_simple": st.column_config.TextColumn("B_simple now", help=_text.CURRENT_RULE, width=100),
    "interval": st.column_config.TextColumn("90% interval", width=120),
    # the answer first: at 1400 px the batch, its ratio (what "Sort by" may sort on), loss,
    # step and tags are in view before the long reason sentences (issue 56); a run without a
    # number has an empty ratio, and its reason comes next, whole
    "batch": st.column_config.TextColumn(
        "Batch in use",
        help="The latest batch-size change, else the batch at init",
        width=95,
    ),
    "ratio": st.column_config.TextColumn(
        "B / B_simple", help="Below 1: a bigger batch would cut steps", width=95
    ),
    "loss": st.column_config.TextColumn("Loss", help="The latest training loss", width="small"),
    "step": st.column_config.TextColumn("Step", help="The latest step", width="small"),
    "tags": st.column_config.TextColumn("Tags", width="small"),
    "why": st.column_config.TextColumn("No B_simple because", help="Why the run has no B_simple"),
    "project": st.column_config.TextColumn("Project", width="small"),
    "units": st.column_config.TextColumn("Units", width="small"),
    "started_at": st.column_config.DatetimeColumn("Started", format="YYYY-MM-DD HH:mm", width=130),
}
#: Its columns of names and sentences, shown as wide as their longest text (``fit_columns``).
RUN_FIT = ("name", "project", "task", "status", "tags", "why")


def table(
    data: Any,
    columns: Mapping[str, Any] | None = None,
    *,
    fit: Sequence[str] = (),
    **kwargs: Any,
) -> Any:
    """A full-width table without the row index. ``columns`` (a table's ``COLUMNS``: name to
    column config) says which columns show and in what order; the columns named in ``fit``
    are widened to show their text whole (``fit_columns``); ``kwargs`` go to
    ``st.dataframe``."""
    if fit:
        fitted = fit_columns(pd.DataFrame(data), columns or {}, fit)
        kwargs["column_config"] = {**kwargs.get("column_config", {}), **fitted}
    if columns is not None:
        kwargs["column_order"] = list(columns)
        kwargs["column_config"] = {**columns, **kwargs.get("column_config", {})}
    return st.dataframe(data, hide_index=True, width="stretch", **kwargs)


#: A warning block longer than this many lines (at ``LINE_CHARS`` characters a line) folds
#: behind a one-line summary with a count.
MAX_LINES, LINE_CHARS = 2, 160
#: The summary's length before it is cut with "…".
SUMMARY_CHARS = 110


def _lines(text: str) -> int:
    """Lines ``text`` takes on the page, about (``LINE_CHARS`` a line)."""
    return max(1, -(-len(text) // LINE_CHARS))


def warnings_summary(warnings: list[str]) -> str:
    """One line for a folded block of warnings: their count, then the start of each."""
    heads = [w.split(":")[0].split(";")[0].strip() for w in warnings]
    text = "; ".join(dict.fromkeys(h for h in heads if h))
    if len(text) > SUMMARY_CHARS:
        text = text[: SUMMARY_CHARS - 1].rstrip() + "…"
    return f"{_text.plural(len(warnings), 'warning')}: {text}"


def show_warnings(warnings: list[str]) -> None:
    """The page's warnings (Markdown, already escaped): in view while they fit in
    ``MAX_LINES`` lines, else folded behind a one-line summary with their count."""
    if not warnings:
        return
    if sum(_lines(w) for w in warnings) <= MAX_LINES:
        for w in warnings:
            st.warning(w)
        return
    with st.expander(":warning: " + warnings_summary(warnings), expanded=False):
        for w in warnings:
            st.warning(w)


def _png(chart: alt.TopLevelMixin, title: str) -> bytes:
    import vl_convert as vlc

    # Outside a Streamlit render Altair's 5000-row guard is back on; the data is already
    # bucketed by the server (<= 2000 points per series), so lift it for the export.
    with alt.data_transformers.disable_max_rows():
        spec = chart.properties(title=title, width=800).to_dict()
    png: bytes = vlc.vegalite_to_png(spec, scale=2)
    return png


def _csv(frame: pd.DataFrame) -> str:
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def chart_with_downloads(
    chart: Any,
    frame: pd.DataFrame,
    *,
    name: str,
    caption: str | None = None,
    stretch: bool = True,
    user_text: bool = False,
) -> None:
    """A titled chart with PNG (rendered offline by vl-convert, on click) and CSV downloads of
    the data drawn, as ``name.png`` and ``name.csv``; ``name`` (unique on its page) also keys
    the widgets. The title is the chart's own ``description`` (every ``_charts`` builder sets
    it), shown above the chart, where it wraps instead of being clipped; ``user_text``: the
    title holds names (a task's), shown escaped."""
    title = chart.description
    if not isinstance(title, str):
        raise TypeError("the chart has no description to title it with: build it with _charts")
    # a title holding user text (a task name) is escaped, so it reads as written
    st.subheader(md(title) if user_text else title, anchor=False)
    if caption:
        st.caption(caption)
    st.altair_chart(chart, width="stretch" if stretch else "content", key=f"chart_{name}")
    row = st.container(horizontal=True)
    # label, data (the PNG rendered only when clicked), file extension, MIME type, icon
    downloads: list[tuple[str, Any, str, str, str]] = [
        ("PNG", lambda: _png(chart, title), "png", "image/png", ":material/image:"),
        ("CSV", _csv(frame), "csv", "text/csv", ":material/download:"),
    ]
    for label, data, ext, mime, icon in downloads:
        row.download_button(
            label,
            data=data,
            file_name=f"{name}.{ext}",
            mime=mime,
            key=f"{ext}_{name}",
            on_click="ignore",
            icon=icon,
            width="content",
        )
