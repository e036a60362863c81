"""Public names shown where users import them (``noisescope.Run``, ``estimators.EMA``)."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Collection


def report_as_public(obj: object, module: str) -> None:
    """Show ``obj`` as ``<module>.X`` (reprs, tracebacks, docs), as httpx does.

    ``typing.get_type_hints`` (``Api``'s decoder) and pydantic (the server's response models,
    from dataclass fields' ``type``) resolve a class's string annotations in the module named by
    ``__module__``, so they are resolved first, in the module that wrote them; functions resolve
    theirs through ``__globals__`` and need nothing.
    """
    if isinstance(obj, type):
        own = inspect.get_annotations(obj)
        if own:
            hints = typing.get_type_hints(obj, include_extras=True)
            obj.__annotations__ = {name: hints[name] for name in own}
            for field in dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ():
                field.type = hints[field.name]
        obj.__module__ = module
    elif inspect.isfunction(obj):
        obj.__module__ = module


def report_all_as_public(module: str, lazy: Collection[str] = ()) -> None:
    """``report_as_public`` for every name in ``module``'s ``__all__`` (called at its end) but
    the ``lazy`` ones, which the module's ``__getattr__`` reports when it loads them."""
    namespace = vars(sys.modules[module])
    for name in namespace["__all__"]:
        if name not in lazy:
            report_as_public(namespace[name], module)
