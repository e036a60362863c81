"""Client settings: explicit arguments, then ``NOISESCOPE_*`` environment variables, then defaults.

One resolved, frozen ``Settings`` object is handed to the run, the sender and the spool so that
no component reads the environment on its own (and tests can build one directly).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast
from urllib.parse import urlsplit

from noisescope import _wire
from noisescope._redact import redact_text
from noisescope._request import GZIP_MIN_BYTES

Mode = Literal["online", "offline", "disabled"]
MODES: tuple[Mode, ...] = ("online", "offline", "disabled")

#: Where ``noisescope up`` puts the ingest server and the dashboard.
DEFAULT_PORT = 8765
DEFAULT_DASHBOARD_PORT = 8501
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def default_dir() -> Path:
    """The spool root when neither ``dir=`` nor ``NOISESCOPE_DIR`` is given."""
    return Path.home() / ".noisescope" / "spool"


@dataclass(frozen=True)
class Settings:
    """Everything the run, sender and spool need; every field has a safe default."""

    url: str = DEFAULT_URL
    token: str | None = None
    mode: Mode = "online"
    #: Spool root; each run spools under ``dir / run_id``.
    dir: Path = field(default_factory=default_dir)
    #: Longest ``finish()`` (or interpreter exit) waits for the server before spooling the rest.
    flush_timeout: float = 30.0
    #: Samples per POST (the server accepts up to ``_wire.MAX_SAMPLES_PER_REQUEST``).
    batch_max: int = 4000
    #: A partial batch is sent after this many seconds.
    batch_interval: float = 1.0
    #: Samples held in memory; the sender spills to the spool beyond half of it.
    memory_max: int = 100_000
    #: Per-run spool size limit; past it the oldest data is kept and newer counted as dropped.
    spool_max_bytes: int = 1 << 30
    #: Per-request HTTP timeout (seconds).
    request_timeout: float = 10.0
    #: Exponential backoff: first delay and cap (seconds); jitter is applied on top.
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    #: With nothing else to send for this long, the sender tells the server the run is alive
    #: (a running run silent for the server's ``crash_after`` reads as crashed).
    heartbeat_interval: float = _wire.HEARTBEAT_INTERVAL
    #: Bodies larger than this are gzip-compressed.
    gzip_min_bytes: int = GZIP_MIN_BYTES
    #: Distributed rank of this process and world size.
    rank: int = 0
    world_size: int = 1
    #: If True every rank sends (series tagged ``rank{r}``); else only rank 0 sends.
    all_ranks: bool = False
    #: If True, neither the run's link nor the status/sync line at finish is printed.
    quiet: bool = False
    #: The dashboard's base URL: the run's link is printed at init. Unset, the link comes
    #: from the server's answer to the run's creation, if the server knows its dashboard.
    dashboard_url: str | None = None
    #: If True, an online run also delivers spools that earlier online runs to the same URL
    #: left behind (e.g. a job killed during an outage), once its own data is sent.
    resume_orphans: bool = True

    @property
    def sends(self) -> bool:
        """Whether this process sends anything at all (mode and rank policy)."""
        return self.mode != "disabled" and (self.all_ranks or self.rank == 0)


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def _truthy(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("is not a number") from None


#: The settings an environment variable sets when no argument does, and how its text reads
#: (a reader's ValueError says what is wrong with the text).
ENVIRONMENT: dict[str, tuple[str, Callable[[str], object]]] = {
    "url": ("NOISESCOPE_URL", str),
    "token": ("NOISESCOPE_TOKEN", str),
    "mode": ("NOISESCOPE_MODE", str),
    "dir": ("NOISESCOPE_DIR", str),
    "flush_timeout": ("NOISESCOPE_FLUSH_TIMEOUT", _number),
    "all_ranks": ("NOISESCOPE_ALL_RANKS", _truthy),
    "quiet": ("NOISESCOPE_QUIET", _truthy),
    "dashboard_url": ("NOISESCOPE_DASHBOARD_URL", str),
}


def detect_rank() -> tuple[int, int]:
    """(rank, world_size) from an initialised torch.distributed, else torchrun's env vars.

    torch is only consulted when it is already imported: importing it here would cost seconds.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size())
        except Exception:
            pass
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
    return rank, max(world, 1)


def check_url(url: str, how: str | None = "set url= or NOISESCOPE_URL") -> str:
    """``url`` without a trailing slash; ValueError with the fix (and ``how`` to give it) when
    it is not an http(s) URL (``127.0.0.1:8765`` would otherwise fail only when the first
    request is made). The one URL check: ``init``, ``Api``, ``sync`` and every ``--url``."""
    text = url.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        shown, fixed = redact_text(url), redact_text(_http_url(text))
        raise ValueError(
            f"noisescope url {shown!r} is not an http(s) URL: use e.g. {fixed!r}"
            + (f" ({how})" if how else "")
        )
    return text


def _http_url(text: str) -> str:
    """The http(s) URL ``text`` was most likely meant to be: ``http//host`` and ``http:/host``
    get their ``://``, another scheme (``ftp://host``) becomes ``http``, a bare host gets
    ``http://``."""
    typo = re.match(r"(?i)(https?)[:/]+(?=[^:/])", text)
    if typo is not None:
        return f"{typo[1].lower()}://{text[typo.end() :]}"
    if "://" in text:
        return f"http://{text.split('://', 1)[1]}"
    return f"http://{text}"


def url_argument(value: str) -> str:
    """``check_url`` as an argparse type, for the CLI's URL options."""
    try:
        return check_url(value, how=None)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def server_url_for(url: str) -> str | None:
    """The server's URL when ``url`` is the dashboard's (its port is the dashboard's default),
    else None: the fix to offer for a URL that answers as no noisescope server does."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return None
    if port != DEFAULT_DASHBOARD_PORT or parts.hostname is None:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{DEFAULT_PORT}"


def server_hint(url: str) -> str:
    """What to try instead of ``url``, which answers as no noisescope server does."""
    server = server_url_for(url)
    if server is not None:
        return (
            f"this looks like the dashboard (port {DEFAULT_DASHBOARD_PORT}); the server is on "
            f"port {DEFAULT_PORT}: use {server}"
        )
    return f"is it the dashboard? the server's default port is {DEFAULT_PORT}"


def resolve(**given: object) -> Settings:
    """``Settings`` from the arguments given (None or "": not given), then the ``ENVIRONMENT``
    variables, then the defaults; rank and world size not given are detected."""
    unknown = set(given) - set(Settings.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown noisescope setting(s): {', '.join(sorted(unknown))}")
    fields = {name: value for name, value in given.items() if value not in (None, "")}
    for name, (variable, read) in ENVIRONMENT.items():
        raw = None if name in fields else _env(variable)
        if raw is not None:
            try:
                fields[name] = read(raw)
            except ValueError as exc:
                raise ValueError(f"{variable}={raw!r} {exc}") from None
    mode = str(fields.get("mode", "online")).strip().lower()
    if mode not in MODES:
        raise ValueError(
            f"noisescope mode {mode!r} is not one of {', '.join(MODES)} "
            "(set mode= or NOISESCOPE_MODE)"
        )
    fields["mode"] = mode
    fields["url"] = check_url(str(fields.get("url", DEFAULT_URL)))
    if "dir" in fields:
        fields["dir"] = Path(cast("str | os.PathLike[str]", fields["dir"])).expanduser()
    detected_rank, detected_world = detect_rank()
    fields.setdefault("rank", detected_rank)
    fields.setdefault("world_size", detected_world)
    return Settings(**fields)  # type: ignore[arg-type]
