"""Page state in the query string, so that a shared URL restores the view it was copied from.

Streamlit's ``bind="query-params"`` stores a select widget's *formatted label* in the URL
(``?run=vision+%2F+digits+%2F+...``), which is long and breaks when a run is renamed. Selects
here store the raw option (a run id, ``step``) instead: read on load, written back after the
widget, and removed when equal to the default to keep URLs short. Numbers and checkboxes
(``number``, ``checkbox``), free text and multiselects of plain names are bound by Streamlit
itself (``bind=BOUND``), whose URL value is the raw one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import streamlit as st

__all__ = ["checkbox", "multiselect", "number", "radio", "select"]

#: Streamlit keeps these widgets' values in the URL itself.
BOUND: Final = "query-params"

T = TypeVar("T")


def _encode(value: Any) -> str:
    return str(value)


def select(
    label: str,
    options: Sequence[T],
    *,
    key: str,
    default: T | None = None,
    format_func: Callable[[T], str] = str,
    widget: str = "selectbox",
    container: Any = None,
    keep: bool = False,
    **kwargs: Any,
) -> T | None:
    """A selectbox (or radio) whose raw value lives in ``?key=``; default when absent/unknown.

    ``keep`` writes the value to the URL even when it is the default: for choices whose
    default moves (the newest run), so that a copied link keeps showing the same thing.
    """
    if not options:
        return None
    encoded = [_encode(o) for o in options]
    fallback = default if default is not None and default in options else options[0]
    raw = st.query_params.get(key)
    index = encoded.index(raw) if raw in encoded else list(options).index(fallback)
    host = container if container is not None else st
    make = host.radio if widget == "radio" else host.selectbox
    value: T | None = make(
        label, list(options), index=index, format_func=format_func, key=f"_qp_{key}", **kwargs
    )
    if value is None or (value == fallback and not keep):
        if key in st.query_params:
            del st.query_params[key]
    elif st.query_params.get(key) != _encode(value):
        st.query_params[key] = _encode(value)
    return value


def multiselect(
    label: str,
    options: Sequence[T],
    *,
    key: str,
    default: Sequence[T] = (),
    format_func: Callable[[T], str] = str,
    container: Any = None,
    **kwargs: Any,
) -> list[T]:
    """A multiselect whose raw values live in ``?key=a&key=b``."""
    encoded = {_encode(o): o for o in options}
    if key in st.query_params:
        initial = [encoded[r] for r in st.query_params.get_all(key) if r in encoded]
    else:
        initial = [d for d in default if d in options]
    host = container if container is not None else st
    value: list[T] = host.multiselect(
        label,
        list(options),
        default=initial,
        format_func=format_func,
        key=f"_qp_{key}",
        **kwargs,
    )
    if list(value) == [d for d in default if d in options]:
        if key in st.query_params:
            del st.query_params[key]
    else:
        st.query_params[key] = [_encode(v) for v in value]
    return list(value)


def radio(label: str, labels: Mapping[str, str], *, key: str, container: Any = None) -> str:
    """A horizontal radio over ``labels`` (raw value: label); the raw value lives in ``?key=``."""
    value = select(
        label,
        list(labels),
        key=key,
        format_func=labels.__getitem__,
        widget="radio",
        horizontal=True,
        container=container,
    )
    return str(value)


def number(
    label: str,
    *,
    key: str,
    value: float,
    min_value: float,
    step: float,
    max_value: float | None = None,
    help: str | None = None,
    container: Any = None,
) -> float:
    """A number input in ``?key=``; ints in, ints out (Streamlit types it by ``value``)."""
    host = container if container is not None else st
    result: float = host.number_input(
        label,
        min_value=min_value,
        max_value=max_value,
        value=value,
        step=step,
        key=key,
        help=help,
        bind=BOUND,
    )
    return result


def checkbox(label: str, *, key: str, value: bool = False) -> bool:
    """A checkbox in ``?key=``."""
    return bool(st.checkbox(label, value=value, key=key, bind=BOUND))
