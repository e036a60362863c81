"""One type for the two HTTP clients the tests talk to a noisescope server through.

``ServerProcess.client()`` (``servers.py``) is an ``httpx.Client``. ``AppServer.client()``
(``inprocess.py``) is Starlette's ``TestClient``, which Starlette builds on httpx2 (httpx's API
in a package of its own) when that is installed: the same methods, but to a type checker no
``httpx.Client``, and its responses are ``httpx2.Response``. Helpers that take either client
are typed with these. Both packages are imported for the type checker only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import httpx
    import httpx2

__all__ = ["HttpClient", "HttpResponse"]

HttpClient: TypeAlias = "httpx.Client | httpx2.Client"
HttpResponse: TypeAlias = "httpx.Response | httpx2.Response"
