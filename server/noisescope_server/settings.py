"""Server settings, read from the environment once at start-up.

Environment variables (all optional, so ``noisescope up`` needs no setup):

- ``NOISESCOPE_HOME``: data directory, default ``~/.noisescope``.
- ``NOISESCOPE_DATABASE_URL``: SQLAlchemy URL; default the SQLite file
  ``$NOISESCOPE_HOME/noisescope.db``.
- ``NOISESCOPE_AUTH``: ``off`` (no tokens; the zero-setup local default), ``write`` (writing
  needs a project token, reading is open) or ``all`` (reading needs a token too).
- ``NOISESCOPE_ADMIN_TOKEN``: enables token management over HTTP when auth is on.
- ``NOISESCOPE_MAX_BODY_BYTES``, ``NOISESCOPE_MAX_SAMPLES``: request limits (defaults from the
  wire format, which the client respects when batching).
- ``NOISESCOPE_CRASH_AFTER``: seconds (default 120) after which a run still "running" that
  has sent nothing, not even a heartbeat, reads as "crashed" (computed at each read).
- ``NOISESCOPE_READ_TIMEOUT``: seconds (default 60) a request body may take to arrive; a
  slower one is answered 408 and its connection closed.
- ``NOISESCOPE_DASHBOARD_URL``: the dashboard's base URL (``noisescope up`` sets it to the one it
  starts); when set, the answer to ``PUT /api/v1/runs/{id}`` carries the link to the run's page,
  which the client prints, as wandb does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from noisescope import protocol
from noisescope.protocol import run_page_url

__all__ = ["AUTH_MODES", "AuthMode", "Settings", "default_database_url", "default_home"]

AuthMode = Literal["off", "write", "all"]
AUTH_MODES: tuple[AuthMode, ...] = ("off", "write", "all")


def default_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("NOISESCOPE_HOME") or Path.home() / ".noisescope").expanduser()


def default_database_url(env: Mapping[str, str] | None = None) -> str:
    return f"sqlite:///{default_home(env) / 'noisescope.db'}"


#: The default ``read_timeout`` (seconds): a 16 MiB body at under 300 kB/s still arrives.
READ_TIMEOUT = 60.0


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None


def parse_auth(value: str) -> AuthMode:
    mode = value.strip().lower()
    for known in AUTH_MODES:
        if mode == known:
            return known
    raise ValueError(f"NOISESCOPE_AUTH must be one of {', '.join(AUTH_MODES)}, got {value!r}")


#: Seconds a finished (or failed) run must be silent before the server compacts it: the
#: client's last flush and a ``noisescope sync`` of its spool usually land within this, as rows.
COMPACT_FINISHED_AFTER = 600.0
#: Seconds any run, running or not, must be silent before it is compacted (a job that died
#: without finishing); later samples still land (``crud.reopen_chunks``).
COMPACT_QUIET_AFTER = 6 * 3600.0


@dataclass(frozen=True)
class Settings:
    """Everything the app factory needs; immutable so workers cannot drift apart."""

    database_url: str
    auth: AuthMode = "off"
    admin_token: str | None = None
    max_body_bytes: int = protocol.MAX_BODY_BYTES
    max_samples: int = protocol.MAX_SAMPLES_PER_REQUEST
    #: Apply Alembic migrations when the app starts (under a lock; safe with many workers).
    migrate: bool = True
    #: The dashboard's base URL, for the run links in PUT answers (None: no links).
    dashboard_url: str | None = None
    #: A "running" run silent this long (seconds) reads as "crashed".
    crash_after: float = protocol.CRASH_AFTER
    #: The longest a request body may take to arrive (seconds).
    read_timeout: float = READ_TIMEOUT
    #: Seconds between the compactor's rounds (docs/deployment.md, "Compaction"); 0: no
    #: compactor (``noisescope db compact`` still compacts on demand).
    compact_every: float = 60.0
    #: Seconds a finished run, and any run, must be silent before it is compacted.
    compact_finished_after: float = COMPACT_FINISHED_AFTER
    compact_quiet_after: float = COMPACT_QUIET_AFTER

    def __post_init__(self) -> None:
        for name in ("crash_after", "read_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("compact_every", "compact_finished_after", "compact_quiet_after"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, /, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        settings = cls(
            database_url=env.get("NOISESCOPE_DATABASE_URL") or default_database_url(env),
            auth=parse_auth(env.get("NOISESCOPE_AUTH", "off")),
            admin_token=env.get("NOISESCOPE_ADMIN_TOKEN") or None,
            max_body_bytes=int(env.get("NOISESCOPE_MAX_BODY_BYTES", protocol.MAX_BODY_BYTES)),
            max_samples=int(env.get("NOISESCOPE_MAX_SAMPLES", protocol.MAX_SAMPLES_PER_REQUEST)),
            dashboard_url=env.get("NOISESCOPE_DASHBOARD_URL") or None,
            crash_after=_seconds(env, "NOISESCOPE_CRASH_AFTER", protocol.CRASH_AFTER),
            read_timeout=_seconds(env, "NOISESCOPE_READ_TIMEOUT", READ_TIMEOUT),
            compact_every=_seconds(env, "NOISESCOPE_COMPACT_EVERY", 60.0),
            compact_finished_after=_seconds(
                env, "NOISESCOPE_COMPACT_FINISHED_AFTER", COMPACT_FINISHED_AFTER
            ),
            compact_quiet_after=_seconds(
                env, "NOISESCOPE_COMPACT_QUIET_AFTER", COMPACT_QUIET_AFTER
            ),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(settings, **given) if given else settings  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a worker process."""
        env = {
            "NOISESCOPE_DATABASE_URL": self.database_url,
            "NOISESCOPE_AUTH": self.auth,
            "NOISESCOPE_MAX_BODY_BYTES": str(self.max_body_bytes),
            "NOISESCOPE_MAX_SAMPLES": str(self.max_samples),
            "NOISESCOPE_CRASH_AFTER": repr(self.crash_after),
            "NOISESCOPE_READ_TIMEOUT": repr(self.read_timeout),
            "NOISESCOPE_COMPACT_EVERY": repr(self.compact_every),
            "NOISESCOPE_COMPACT_FINISHED_AFTER": repr(self.compact_finished_after),
            "NOISESCOPE_COMPACT_QUIET_AFTER": repr(self.compact_quiet_after),
        }
        if self.admin_token:
            env["NOISESCOPE_ADMIN_TOKEN"] = self.admin_token
        if self.dashboard_url:
            env["NOISESCOPE_DASHBOARD_URL"] = self.dashboard_url
        return env

    def run_page_url(self, run_id: str) -> str | None:
        """The link to a run's dashboard page, None without ``dashboard_url``."""
        return run_page_url(self.dashboard_url, run_id) if self.dashboard_url else None
