"""Secrets out of everything noisescope prints, raises or writes to disk.

A server URL may carry a password (``http://user:pass@host``) and a query may carry a token
(``?token=...``): both are replaced by ``***`` before a URL reaches a message, an exception,
a log line or the spool's ``run.json``. The one place that rule lives.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["SECRET_PARAMS", "redact_text", "redact_url"]

#: Query parameters whose values are secrets wherever they appear.
SECRET_PARAMS = frozenset({"token", "access_token", "api_key", "apikey", "key", "password"})
MASK = "***"
#: ``scheme://user:password@`` anywhere in a text.
#: The password runs to the authority's last "@" (one left unescaped in it is still its own).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):[^/\s]*@")
#: ``user:password@host`` without a scheme (a URL typed without ``http://``, which the URL
#: check refuses by quoting it), not inside a word.
_BARE_USERINFO = re.compile(r"(?<![\w.~%+/-])(?P<user>[\w.~%+-]+):[^/\s'\"]+@(?=[\w\[])")
#: ``token=...`` (and the other secret names) in a query string anywhere in a text.
_PARAM = re.compile(
    r"(?P<key>(?<![A-Za-z0-9_])(?:" + "|".join(sorted(SECRET_PARAMS)) + r")=)[^&\s#:'\"]*",
    re.IGNORECASE,
)


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values replaced by ``***`` (the user name,
    host, port and path kept, so the message still says where)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() in SECRET_PARAMS for key, _ in pairs):
            query = urlencode(
                [(k, MASK if k.lower() in SECRET_PARAMS else v) for k, v in pairs], safe="*"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL password and secret query value in it replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _BARE_USERINFO.sub(lambda m: f"{m['user']}:{MASK}@", text)
    return _PARAM.sub(lambda m: f"{m['key']}{MASK}", text)
