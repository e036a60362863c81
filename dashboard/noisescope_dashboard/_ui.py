"""Streamlit pieces every page shares: the database guard, empty states, charts with downloads.

User-supplied text (run names, tags, config values) goes through ``md_text`` or a dataframe,
never ``unsafe_allow_html``: a run called ``<script>`` or ``**x**`` is shown literally.
"""

from __future__ import annotations

import io
import re
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from ._data import DATABASE_URL_ENV, database_url, list_runs

__all__ = [
    "QUICKSTART",
    "chart_with_downloads",
    "md_text",
    "require_runs",
    "run_label",
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

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def md_text(value: Any) -> str:
    """Escape text for Streamlit markdown so names and tags render literally, never as markup."""
    return _MD_SPECIAL.sub(r"\\\1", str(value))


def run_label(row: Any) -> str:
    """A run as people recognise it: project / task / name (short id)."""
    return f"{row['project']} / {row['task']} / {row['name']} ({str(row['uid'])[:8]})"


def require_runs() -> tuple[str, pd.DataFrame]:
    """The database URL and its runs, or an empty state telling the user what to do, and stop."""
    url = database_url()
    if url is None:
        st.warning(
            f"No database configured. Start everything with `noisescope up`, or set "
            f"`{DATABASE_URL_ENV}` to the server's database URL "
            "(e.g. `sqlite:////path/to/noisescope.db`) and restart the dashboard."
        )
        st.stop()
    try:
        runs = list_runs(url)
    except Exception as exc:  # a missing table, an unreachable server: say which, do not crash
        st.error(
            f"Could not read the noisescope database at `{md_text(_safe_url(url))}`: "
            f"{md_text(type(exc).__name__)}: {md_text(_first_line(exc))}. "
            "Run `noisescope db upgrade` (or `noisescope up`) "
            "to create it, then reload."
        )
        st.stop()
    if runs.empty:
        st.info(
            "No runs yet. Add these lines to a training loop (or run the bundled example, "
            "`python examples/digits.py`), and the run appears here live:"
        )
        st.code(QUICKSTART, language="python")
        st.stop()
    return url, runs


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else ""


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def _png(chart: alt.Chart | alt.LayerChart) -> bytes:
    import vl_convert as vlc

    # Outside a Streamlit render Altair's 5000-row guard is back on; our data is already
    # bucketed (<= 2000 points per series), so lift it for the export.
    with alt.data_transformers.disable_max_rows():
        spec = chart.to_dict()
    png: bytes = vlc.vegalite_to_png(spec, scale=2)
    return png


def _csv(frame: pd.DataFrame) -> str:
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def chart_with_downloads(
    chart: alt.Chart | alt.LayerChart, frame: pd.DataFrame, *, name: str, key: str
) -> None:
    """Draw a chart with PNG (rendered offline by vl-convert, on click) and CSV downloads."""
    st.altair_chart(chart, width="stretch", key=f"chart_{key}")
    left, right, _ = st.columns([1, 1, 6])
    left.download_button(
        "PNG",
        data=lambda: _png(chart),
        file_name=f"{name}.png",
        mime="image/png",
        key=f"png_{key}",
        on_click="ignore",
        icon=":material/image:",
    )
    right.download_button(
        "CSV",
        data=_csv(frame),
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"csv_{key}",
        on_click="ignore",
        icon=":material/download:",
    )
