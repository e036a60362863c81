"""The delivery package's two rules: one owner of the buffer (``Outbox``), one state machine
(``_state.transition``, applied only by ``Sender._on``); and the transitions themselves."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from noisescope._config import Settings
from noisescope._delivery import Link, Outbox, Signal, Stage, State, transition
from noisescope._delivery._state import initial

CLIENT = Path(__file__).resolve().parents[2] / "client" / "noisescope"


def test_only_the_outbox_touches_the_buffer() -> None:
    """The deque of committed samples (``Outbox._buffer``) is named in ``_outbox.py`` alone: the
    Run, the sender and the guard move rows only through the outbox's methods."""
    users = set()
    for path in CLIENT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "_buffer":
                users.add(path.relative_to(CLIENT).as_posix())
    assert users == {"_delivery/_outbox.py"}


def test_a_batch_is_converted_and_spooled_in_one_place() -> None:
    """A batch takes its one form as the outbox takes it: ``rows_to_columns`` has one caller
    (``Outbox._take``), and only the outbox appends samples or events to the spool."""
    calls: dict[str, list[str]] = {"rows_to_columns": [], "append": [], "append_record": []}
    for path in CLIENT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                spool_call = isinstance(func, ast.Attribute) and "spool" in ast.unparse(func.value)
                if name == "rows_to_columns" or (name in calls and spool_call):
                    calls[name].append(f"{path.relative_to(CLIENT).as_posix()}:{function.name}")
    assert calls["rows_to_columns"] == ["_delivery/_outbox.py:_take"]
    delivery = {c for c in calls["append"] + calls["append_record"] if c.startswith("_delivery")}
    assert delivery == {"_delivery/_outbox.py:_to_spool", "_delivery/_outbox.py:_spool_events"}


def test_the_sender_state_changes_in_one_place() -> None:
    """``state`` is assigned only in ``Sender._on`` (its base's, through ``transition``), and
    the old flags are gone."""
    sources = [(CLIENT / "_delivery" / name).read_text() for name in ("_sender.py", "_exchange.py")]
    tree = ast.parse("\n".join(sources))
    assigners = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else []
            targets += [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "state":
                    assigners.add(function.name)
    assert assigners == {"__init__", "_on"}
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"_flush_requested", "_orphans_checked", "_final", "_outage_until", "phase"}


def test_a_run_goes_from_new_to_finished() -> None:
    state = initial(has_server=True)
    assert (state.stage, state.link, state.urgent, state.spools_only) == (
        Stage.RUNNING, Link.NEW, False, False,
    )  # fmt: skip
    state = transition(state, Signal.FAILED, retry_at=5.0)
    assert state.retry_at == 5.0
    state = transition(state, Signal.CREATED)
    state = transition(state, Signal.ANSWERED)
    assert (state.link, state.retry_at) == (Link.CREATED, 0.0)
    state = transition(state, Signal.CLOSE, final={"status": "finished"})
    assert state.stopping and state.urgent and state.final == {"status": "finished"}
    state = transition(state, Signal.FINAL_TAKEN)
    assert state.final_sent


def test_a_lost_run_is_created_again_after_the_delay() -> None:
    state = transition(initial(has_server=True), Signal.CREATED)
    state = transition(state, Signal.LOST, retry_at=2.0)
    assert (state.link, state.retry_at) == (Link.NEW, 2.0)


def test_refused_and_offline_runs_only_spool() -> None:
    refused = transition(initial(has_server=True), Signal.REFUSED)
    offline = initial(has_server=False)
    for state in (refused, offline):
        assert state.spools_only
        # a late answer changes nothing: the spool keeps the run
        assert transition(state, Signal.CREATED).link is state.link
        assert transition(state, Signal.FINAL_TAKEN).link is state.link


def test_flush_and_close() -> None:
    state = transition(State(), Signal.FLUSH)
    assert state.urgent and not state.stopping
    assert not transition(state, Signal.FLUSHED).urgent
    closed = transition(State(), Signal.CLOSE, final={"status": "failed"})
    again = transition(closed, Signal.CLOSE, final={"status": "finished"})
    assert again.final == {"status": "failed"}  # the first close's end is the run's end
    assert transition(closed, Signal.FLUSHED).urgent  # a flush ending does not undo a close
    assert transition(closed, Signal.ABANDON).stage is Stage.ABANDONED


@given(st.lists(st.sampled_from(list(Signal)), max_size=40), st.booleans())
def test_every_sequence_of_events_is_a_state(events: list[Signal], server: bool) -> None:
    """Any order of events (threads race) gives a state: finished and refused runs stay so,
    the end never changes once given, a run never goes back to running."""
    state = initial(has_server=server)
    for event in events:
        after = transition(state, event, retry_at=1.0, final={"status": "finished"})
        if state.link in (Link.FINISHED, Link.REFUSED, Link.LOCAL):
            assert after.link is state.link
        if state.final is not None:
            assert after.final == state.final
        if state.stopping:
            assert after.stopping
        state = after


def test_the_outbox_numbers_commits_and_wakes_the_sender_at_a_batch() -> None:
    woken: list[int] = []
    settings = Settings(batch_max=3, rank=2, world_size=4, all_ranks=True)
    outbox = Outbox(settings, None, "rank2", lambda *a, **k: None, lambda: woken.append(1))
    outbox.commit([[0, None, 8.0, 64.0, 2.0, 1.0, None, None, 0.0, ""]] * 2)
    assert (len(outbox), woken) == (2, [])
    outbox.commit([[1, None, 8.0, 64.0, 2.0, 1.0, None, None, 0.0, ""]] * 2)
    assert (len(outbox), woken) == (4, [1])
    batch = outbox.take(3)
    assert batch is not None
    assert batch.columns["seq"] == [2, 6, 10]  # rank 2 of 4: seq = index · 4 + 2
    assert batch.columns["series"] == ["rank2"] * 3  # in the wire's columns from the take
    assert outbox.queued() == 4
    outbox.end_batch(batch, delivered=False)  # no spool: held in memory, as it is
    assert (len(outbox), outbox.queued()) == (4, 4)
    again = outbox.take(10)
    assert again is batch and again.sent_before  # the held batch first, whole
    outbox.end_batch(again, delivered=True)
    rest = outbox.take(10)
    assert rest is not None and rest.columns["seq"] == [14]
    assert [*batch.columns["seq"], *rest.columns["seq"]] == [2, 6, 10, 14]


def test_a_full_outbox_without_a_spool_counts_what_it_cannot_hold() -> None:
    outbox = Outbox(Settings(memory_max=2), None, "", lambda *a, **k: None)
    outbox.commit([[step, None, 8.0, 64.0, 2.0, 1.0, None, None, 0.0, ""] for step in range(5)])
    assert (len(outbox), outbox.overflow, outbox.dropped) == (2, 3, 3)
    assert "memory_max=2" in outbox.drops()[0][1]


def test_a_batch_with_a_bad_row_is_held_whole_without_a_spool() -> None:
    """One row the server would refuse is left out, and counted, when the batch is taken; the
    valid rest of a batch that no server and no disk took waits in memory like any other."""
    outbox = Outbox(Settings(batch_max=10), None, "", lambda *a, **k: None)
    rows = [[step, None, 8.0, 64.0, 2.0, 1.0, None, None, 0.0, ""] for step in range(10)]
    rows[4][4] = float("inf")  # g_small_sq
    outbox.commit(rows)
    batch = outbox.take(10)
    assert batch is not None and (batch.count, batch.invalid) == (9, 1)
    outbox.end_batch(batch, delivered=False)
    assert (len(outbox), outbox.dropped) == (9, 1)
    outbox.spill(force=True)  # no spool: still in memory, nothing more dropped
    assert (len(outbox), outbox.dropped) == (9, 1)
    again = outbox.take(10)
    assert again is batch
    outbox.end_batch(again, delivered=True)
    assert (len(outbox), outbox.queued(), outbox.dropped) == (0, 0, 1)


def test_a_request_ending_after_close_gave_up_is_counted_not_held() -> None:
    """close() empties memory for good (spill_everything); a request that ends after that has
    nowhere to wait, so its batch is counted dropped instead of held where nobody reads it."""
    outbox = Outbox(Settings(batch_max=5), None, "", lambda *a, **k: None)
    outbox.commit([[step, None, 8.0, 64.0, 2.0, 1.0, None, None, 0.0, ""] for step in range(5)])
    batch = outbox.take(5)
    assert batch is not None
    outbox.spill_everything()
    outbox.end_batch(batch, delivered=False)
    assert (len(outbox), outbox.queued(), outbox.dropped) == (0, 0, 5)
