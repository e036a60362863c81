"""A run's series names, each stored once (``models.Series``): the number a name is stored
under in ``sample``, ``sample_block`` and ``sample_chunk``, made when its first sample comes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from noisescope_server.crud._sql import dialect_insert
from noisescope_server.models import WHOLE_MODEL, Series

_FIND = select(Series.name, Series.id).where(
    Series.run_id == bindparam("rid"), Series.name.in_(bindparam("names", expanding=True))
)
_ONE = select(Series.id).where(Series.run_id == bindparam("rid"), Series.name == bindparam("name"))
#: A new layer's number: one more than the run's largest (the whole model's is 0).
_NEXT = (
    select(func.coalesce(func.max(Series.id), WHOLE_MODEL) + 1)
    .where(Series.run_id == bindparam("rid"))
    .scalar_subquery()
)
#: Tries at a new name's number: on PostgreSQL two ingests into one run may take the same
#: number for two new names at once; the later one's insert then does nothing and it tries the
#: next number (each try after the other committed).
_TRIES = 1000


def series_ids(conn: Connection, run_id: int, names: Iterable[str]) -> dict[str, int]:
    """Each name's number in the run, stored first where it is new (in the caller's write
    transaction, which holds the run's lock)."""
    wanted = set(names)
    found = {str(n): int(i) for n, i in conn.execute(_FIND, {"rid": run_id, "names": list(wanted)})}
    for name in sorted(wanted - found.keys()):
        found[name] = _add(conn, run_id, name)
    return found


def series_id(conn: Connection, run_id: int, name: str) -> int | None:
    """The number of a run's series ``name``; None when the run has no such series."""
    found = conn.execute(_ONE, {"rid": run_id, "name": name}).scalar()
    return None if found is None else int(found)


def _add(conn: Connection, run_id: int, name: str) -> int:
    insert = dialect_insert(conn.dialect.name)
    number = WHOLE_MODEL if name == "" else _NEXT
    values: dict[str, Any] = {"run_id": bindparam("rid"), "id": number, "name": bindparam("name")}
    stmt = insert(Series).values(values).on_conflict_do_nothing()
    for _ in range(_TRIES):
        conn.execute(stmt, {"rid": run_id, "name": name})
        found = series_id(conn, run_id, name)
        if found is not None:
            return found
    raise RuntimeError(f"no number for series {name!r} of run {run_id} after {_TRIES} tries")
