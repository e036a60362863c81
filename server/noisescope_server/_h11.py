"""uvicorn's h11 protocol with one change: a request uvicorn itself answers 400 (its body broke
the framing, e.g. a bad chunk size) is over for the app too.

uvicorn writes its 400 and closes the connection, but marks the request's cycle disconnected
only when the loop later reports the connection lost. An app that answers without reading the
body (a 401 before any byte of it, with auth on) can get there first, and its answer meets a
connection h11 already closed: ``Exception in ASGI application`` with a traceback, for every
such request, from anyone. Here the cycle is marked at once, so the app's answer is dropped,
as uvicorn drops any answer to a client that is gone. ``cli._serve`` names this class.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol as _H11Protocol

__all__ = ["H11Protocol"]


class H11Protocol(_H11Protocol):
    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        live = cycle is not None and not cycle.response_complete
        if live and cycle is not None and cycle.response_started:
            self.transport.close()  # the app's answer is half written: no 400 can follow it
        else:
            super().send_400_response(msg)
        if live and cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
