"""What ``noisescope`` shows of itself: public names under ``noisescope``, one spool default."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from pathlib import Path

import pytest

import noisescope
from noisescope._config import Settings, resolve


@pytest.mark.parametrize("name", [n for n in noisescope.__all__ if not n.startswith("__")])
def test_public_names_are_reported_under_noisescope(name: str) -> None:
    obj = getattr(noisescope, name)
    if inspect.ismodule(obj):
        assert obj.__name__ == f"noisescope.{name}"
        return
    assert obj.__module__ == "noisescope", f"{name} says it lives in {obj.__module__}"
    if isinstance(obj, type):
        # Api's decoder and the server's pydantic models read the annotations by name.
        typing.get_type_hints(obj)
        if dataclasses.is_dataclass(obj):
            assert not [f.name for f in dataclasses.fields(obj) if isinstance(f.type, str)]


@pytest.mark.parametrize(
    ("module", "name"),
    [(m, n) for m in (noisescope.estimators, noisescope.sweep) for n in m.__all__],
)
def test_package_names_are_reported_under_the_package(module: types.ModuleType, name: str) -> None:
    """``noisescope.estimators.EMA``, not the private module of the package that defines it."""
    obj = getattr(module, name)
    if isinstance(obj, type) or inspect.isfunction(obj):
        assert obj.__module__ == module.__name__, f"{name} says it lives in {obj.__module__}"
    if isinstance(obj, type):
        typing.get_type_hints(obj)
        if dataclasses.is_dataclass(obj):
            assert not [f.name for f in dataclasses.fields(obj) if isinstance(f.type, str)]


def test_settings_default_spool_is_the_one_resolve_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``Settings()`` built directly and ``resolve()`` spool to the same folder."""
    monkeypatch.delenv("NOISESCOPE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = tmp_path / ".noisescope" / "spool"
    assert resolve().dir == expected
    assert Settings().dir == expected


def test_the_testing_module_is_a_transport_users_can_import() -> None:
    """``noisescope.testing`` (docs/client.md): its names live there, and its transport is a
    ``noisescope.Transport``."""
    import noisescope.testing as testing

    assert testing.__all__ == ["Fault", "MemoryTransport"]
    assert testing.MemoryTransport.__module__ == "noisescope.testing"
    assert isinstance(testing.MemoryTransport(), noisescope.Transport)
