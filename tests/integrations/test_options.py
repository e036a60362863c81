"""``CallbackOptions``: one declaration of the framework callbacks' keyword arguments, held to
``noisescope.init`` and ``Settings`` (torch-free)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import noisescope
from noisescope._config import Settings
from noisescope.integrations import CallbackOptions
from noisescope.integrations._options import PROBE_KEYS, RUN_KEYS, InitOptions, check_options


def test_init_options_are_every_argument_noisescope_init_takes() -> None:
    parameters = inspect.signature(noisescope.init).parameters.values()
    named = {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
    settings = {f.name for f in dataclasses.fields(Settings)}  # init's **settings
    assert set(InitOptions.__optional_keys__) == named | settings
    assert not InitOptions.__required_keys__


def test_callback_options_add_only_the_probe_keys() -> None:
    added = CallbackOptions.__optional_keys__ - InitOptions.__optional_keys__
    assert set(PROBE_KEYS) == added == {"layers", "every", "small_batches", "branch"}
    assert set(RUN_KEYS) <= InitOptions.__optional_keys__


def test_a_key_neither_takes_is_refused_with_the_closest_name() -> None:
    check_options("C", {"project": "p", "url": "http://x", "layers": True, "batch_max": 10})
    with pytest.raises(TypeError, match=r"C got unknown keyword argument\(s\) 'projet' \(did "):
        check_options("C", {"projet": "p"})
    with pytest.raises(TypeError, match=r"'zzz'(?! \(did)"):
        check_options("C", {"zzz": 1})
    with pytest.raises(TypeError, match=r"BranchOptions\(every=\.\.\.\) instead of branch_every"):
        check_options("C", {"branch_every": 2})
