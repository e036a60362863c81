"""Reading an AppTest run: chart specs by title, the rows each chart ships, the page's text."""

from __future__ import annotations

import json
import re
from typing import Any, cast

import pandas as pd
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Element

__all__ = ["chart_data", "charts", "plain", "texts"]


def charts(at: AppTest) -> dict[str, dict[str, Any]]:
    """Vega-Lite specs of the page's charts by title (each chart's ``description``)."""
    out = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        out[str(spec.get("description"))] = spec
    return out


def chart_data(at: AppTest) -> dict[str, list[pd.DataFrame]]:
    """The data frames each chart ships to the browser (Streamlit sends them as Arrow)."""
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information

    out = {}
    for element in at.get("vega_lite_chart"):
        title = str(json.loads(element.proto.spec).get("description"))
        out[title] = [
            pa.ipc.open_stream(ds.data.data).read_all().to_pandas() for ds in element.proto.datasets
        ]
    return out


def plain(markdown: str) -> str:
    """Markdown source with its backslash escapes removed: the text a reader sees."""
    return re.sub(r"\\(.)", r"\1", markdown)


def texts(at: AppTest) -> str:
    """Every text element's Markdown source, one per line."""
    # cast: at.get(kind) is typed Element | Block for any kind; these kinds are elements
    parts = [
        cast(Element, e).value
        for kind in ("title", "subheader", "markdown", "caption", "info", "warning", "error")
        for e in at.get(kind)
    ]
    return "\n".join(str(p) for p in parts)
