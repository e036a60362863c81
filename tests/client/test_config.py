"""``_config.resolve``: arguments, then the ``NOISESCOPE_*`` variables, then the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from noisescope._config import DEFAULT_URL, ENVIRONMENT, Settings, resolve


def test_an_argument_wins_over_its_variable_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOISESCOPE_URL", "http://env-host:1")
    monkeypatch.setenv("NOISESCOPE_FLUSH_TIMEOUT", "7.5")
    settings = resolve(url="http://arg-host:2/", flush_timeout=None)
    assert settings.url == "http://arg-host:2"
    assert settings.flush_timeout == 7.5
    monkeypatch.delenv("NOISESCOPE_URL")
    assert resolve().url == DEFAULT_URL


def test_none_or_empty_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOISESCOPE_MODE", "Offline ")
    assert resolve(mode="").mode == "offline"
    assert resolve(batch_max=None).batch_max == Settings.batch_max


@pytest.mark.parametrize(("text", "expected"), [("1", True), ("yes", True), ("0", False)])
def test_a_flag_variable_reads_as_a_flag(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: bool
) -> None:
    monkeypatch.setenv("NOISESCOPE_ALL_RANKS", text)
    assert resolve().all_ranks is expected


def test_the_spool_folder_expands_the_home_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOISESCOPE_DIR")
    assert resolve(dir="~/spool").dir == Path.home() / "spool"


def test_bad_text_names_the_variable_and_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOISESCOPE_FLUSH_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"^NOISESCOPE_FLUSH_TIMEOUT='soon' is not a number$"):
        resolve()
    monkeypatch.setenv("NOISESCOPE_MODE", "sometimes")
    with pytest.raises(ValueError, match="NOISESCOPE_MODE"):
        resolve(flush_timeout=1.0)
    with pytest.raises(TypeError, match="batch_maxx"):
        resolve(batch_maxx=1)


def test_every_variable_sets_a_setting() -> None:
    assert set(ENVIRONMENT) <= set(Settings.__dataclass_fields__)
    variables = [variable for variable, _ in ENVIRONMENT.values()]
    assert len(set(variables)) == len(variables)


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("ftp://127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("http//127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("http:/127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("https//example.org", "https://example.org"),
        ("127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("ada:hunter22@127.0.0.1:8765", "http://ada:***@127.0.0.1:8765"),
    ],
)
def test_a_url_that_is_not_http_gets_the_url_it_was_meant_to_be(given: str, meant: str) -> None:
    """The suggestion is an http(s) URL, never the bad one again nor ``http://http//...``,
    and shows no password."""
    from noisescope._config import check_url

    with pytest.raises(ValueError, match="is not an http") as refused:
        check_url(given)
    assert f"use e.g. {meant!r}" in str(refused.value) and "hunter22" not in str(refused.value)
