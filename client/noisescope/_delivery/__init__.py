"""The delivery path: a run's committed samples and events on their way to the server or the
spool.

``Outbox`` (``_outbox.py``) is the one owner of what is committed and not yet acknowledged:
the Run only hands it finished steps; it hands the sender each batch already in the wire's
columns (a ``Batch``), and is the one place batches go to the spool. ``Sender``
(``_sender.py``) is the thread that takes them to the server, its every decision read from one
``State`` that changes only through ``_state.transition`` on a ``Signal``; ``Guard``
(``_guard.py``) spills while a request hangs.
"""

from noisescope._delivery._outbox import Batch, Outbox
from noisescope._delivery._sender import Sender
from noisescope._delivery._state import Link, Signal, Stage, State, transition

__all__ = ["Batch", "Link", "Outbox", "Sender", "Signal", "Stage", "State", "transition"]
