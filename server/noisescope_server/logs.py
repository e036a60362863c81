"""Secrets out of the server's logs.

uvicorn's access log (``noisescope server --access-log``) writes each request's path with its
query string, so a client that sends its token as ``?token=...`` (refused: a token goes in the
``Authorization`` header) would leave the secret in the log, and a URL with a password in it
likewise. ``RedactSecrets`` masks both in every record of the loggers it is installed on, by the
client's one rule (``protocol.redact_url``, ``protocol.redact_text``); ``install`` puts it on
uvicorn's access and error loggers and the server's own, once per process, whoever serves the
app (``noisescope server``, a plain ``uvicorn``, a test).
"""

from __future__ import annotations

import logging

from noisescope.protocol import redact_text, redact_url

__all__ = ["LOGGERS", "RedactSecrets", "install"]

#: The loggers whose records may carry a request's path or a URL.
LOGGERS = ("uvicorn.access", "uvicorn.error", "noisescope_server")


def _clean(value: str) -> str:
    """A path with its query (the access log's argument) or any other text, secrets masked."""
    if value.startswith("/"):
        # parsed, so that a percent-encoded name (``?%74oken=``, which the server reads as
        # ``token``) is caught too
        return redact_url(value) if ("?" in value or "@" in value) else value
    return redact_text(value)


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message and its string arguments; drops nothing. The
    arguments stay a tuple of the same length (uvicorn's access formatter unpacks them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_text(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_clean(a) if isinstance(a, str) else a for a in args)
        return True


def install() -> None:
    """``RedactSecrets`` on each of ``LOGGERS`` that does not have it yet."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
