"""Parsed JSON as the read API's answer types (``Api._get``): dataclasses by their field types,
refused with where and how when the JSON is not of the shape its type says. ``decoder`` is the
fast form for long answers, ``decode`` the one that explains a refusal."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, get_type_hints


class Shape(Exception):
    """The answer is JSON, but not of the shape its type says: where in it, and how."""


def _kind(value: Any) -> str:
    """A JSON value for a message: null, an object, a list, or the scalar itself (shortened)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value)[:40]


def decode(tp: Any, value: Any, where: str = "the answer") -> Any:
    """``value`` (parsed JSON) as an instance of the type ``tp``: dataclasses by field types,
    lists, tuples, dicts, optionals, datetimes (ISO 8601) and numbers; ``Shape`` naming the
    place when it is not one. A float may be null (the server writes a non-finite float as
    null), which stays None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return decode(options[0], value, where) if len(options) == 1 else value
    if tp is Any:
        return value
    if value is None and tp is not float:
        raise Shape(f"{where}: expected {_expected(tp)}, got null")
    if origin is list or origin is tuple:
        if not isinstance(value, list):
            raise Shape(f"{where}: expected a list, got {_kind(value)}")
        (item, *_) = typing.get_args(tp)
        items = [decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise Shape(f"{where}: expected an object, got {_kind(value)}")
        return dict(value)
    if origin is Literal:
        kinds = {type(a) for a in typing.get_args(tp)}
        if type(value) not in kinds:
            raise Shape(f"{where}: expected one of {typing.get_args(tp)}, got {_kind(value)}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise Shape(f"{where}: expected an object, got {_kind(value)}")
        hints = _hints(tp)
        fields = dataclasses.fields(tp)
        missing = [f.name for f in fields if f.name not in value and _required(f)]
        if missing:
            raise Shape(f"{where}: missing {', '.join(missing[:5])}")
        kwargs = {
            f.name: decode(hints[f.name], value[f.name], f"{where}.{f.name}")
            for f in fields
            if f.name in value
        }
        return tp(**kwargs)
    if tp is datetime:
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        raise Shape(f"{where}: expected an ISO 8601 time, got {_kind(value)}")
    if tp is float:
        if value is None:
            return None
        if type(value) in (int, float):
            return float(value)
    elif tp in (int, str, bool) and type(value) is tp:
        return value
    raise Shape(f"{where}: expected {_expected(tp)}, got {_kind(value)}")


#: ``decoder``'s answers: one decoding function per type, built once.
_DECODERS: dict[Any, Callable[[Any], Any]] = {}
_FAST_SCALARS = {int, str, bool}


def decoder(tp: Any) -> Callable[[Any], Any]:
    """``decode(tp, value)`` as a function of ``value`` built once per type, for the answers
    that are read often and long (a run list of 10,000 runs is 450,000 values): the same
    values, the same rules, but ``Shape`` without the message, which ``decode`` then gives
    (it decides the type's case once, not per value, and builds no place names)."""
    found = _DECODERS.get(tp)
    if found is None:
        found = _DECODERS[tp] = _builddecoder(tp)
    return found


def _builddecoder(tp: Any) -> Callable[[Any], Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) != 1:
            return lambda value: value
        inner = decoder(options[0])
        return lambda value: None if value is None else inner(value)
    if tp is Any:
        return lambda value: value
    if origin is list or origin is tuple:
        item = decoder(typing.get_args(tp)[0])
        make: Callable[[list[Any]], Any] = list if origin is list else tuple

        def sequence(value: Any) -> Any:
            if not isinstance(value, list):
                raise Shape
            return make([item(v) for v in value])

        return sequence
    if origin is dict:

        def mapping(value: Any) -> Any:
            if not isinstance(value, dict):
                raise Shape
            return dict(value)

        return mapping
    if origin is Literal:
        kinds = {type(a) for a in typing.get_args(tp)}

        def literal(value: Any) -> Any:
            if value is None or type(value) not in kinds:
                raise Shape
            return value

        return literal
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclassdecoder(tp)
    if tp is datetime:

        def when(value: Any) -> Any:
            if not isinstance(value, str):
                raise Shape
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                raise Shape from None

        return when
    if tp is float:

        def number(value: Any) -> Any:
            if value is None:
                return None
            if type(value) in (int, float):
                return float(value)
            raise Shape

        return number
    if tp in _FAST_SCALARS:

        def scalar(value: Any) -> Any:
            if type(value) is not tp:
                raise Shape
            return value

        return scalar

    def never(value: Any) -> Any:
        raise Shape

    return never


def _dataclassdecoder(tp: type) -> Callable[[Any], Any]:
    hints = _hints(tp)
    fields = [(f.name, hints[f.name]) for f in dataclasses.fields(tp)]
    required = [f.name for f in dataclasses.fields(tp) if _required(f)]
    # the fields' decoders are built at the first value (a dataclass may name itself), whole
    # before they are kept (two threads may build them at once)
    built: list[list[tuple[str, Callable[[Any], Any]]]] = []

    def instance(value: Any) -> Any:
        if not isinstance(value, dict):
            raise Shape
        if not built:
            built[:] = [[(name, decoder(hint)) for name, hint in fields]]
        for name in required:
            if name not in value:
                raise Shape
        return tp(**{name: f(value[name]) for name, f in built[0] if name in value})

    return instance


def _expected(tp: Any) -> str:
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    names = {float: "a number", int: "an integer", str: "a string", bool: "a boolean"}
    return names.get(tp, "an object")


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(tp: type) -> dict[str, Any]:
    hints = _HINTS.get(tp)
    if hints is None:
        hints = _HINTS[tp] = get_type_hints(tp)
    return hints
