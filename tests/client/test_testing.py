"""``noisescope.testing.MemoryTransport``: the in-memory server users test their own training
code against (docs/client.md, "Testing your own integration"), as the server would answer."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import noisescope
from noisescope import Request, TransportError, protocol
from noisescope.testing import MemoryTransport

ROOT = Path(__file__).resolve().parents[2]


def _documented_example() -> str:
    text = (ROOT / "docs" / "client.md").read_text()
    blocks: list[str] = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (block,) = [b for b in blocks if "from noisescope.testing import MemoryTransport" in b]
    return block


def test_the_documented_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_documented_example())
    env = {**os.environ, "NOISESCOPE_DIR": str(tmp_path / "spool")}
    env.pop("NOISESCOPE_URL", None)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "100 samples stored; the run is finished\n"
    assert not (tmp_path / "spool").exists() or not any((tmp_path / "spool").rglob("*.jsonl"))
    # the refused request's warning names the transport, not a server URL it never used
    assert "cannot deliver to the transport MemoryTransport" in proc.stderr, proc.stderr
    assert "8765" not in proc.stderr


def _columns(seqs: list[int], **changed: list[Any]) -> dict[str, list[Any]]:
    n = len(seqs)
    columns: dict[str, list[Any]] = {
        "seq": seqs,
        "step": list(range(n)),
        "examples": [64.0 * (i + 1) for i in range(n)],
        "b_small": [8.0] * n,
        "b_big": [64.0] * n,
        "g_small_sq": [2.0] * n,
        "g_big_sq": [1.2] * n,
        "loss": [None] * n,
        "lr": [None] * n,
        "time": [1.7e9] * n,
        "series": [""] * n,
    }
    assert set(columns) == set(protocol.SAMPLE_COLUMNS)
    return {**columns, **changed}


def _send(server: MemoryTransport, method: str, path: str, body: Any, gz: bool = False) -> Any:
    raw = json.dumps(body).encode()
    headers = {"Content-Encoding": "gzip"} if gz else {}
    response = server.handle_request(
        Request(method, path, gzip.compress(raw) if gz else raw, headers)
    )
    return response.status, response.json()


RUN = {"project": "p", "task": "t", "name": "n", "config": {}, "tags": [], "units": "examples"}


def test_samples_are_inserted_or_ignored_on_run_and_seq() -> None:
    server = MemoryTransport()
    assert _send(server, "PUT", protocol.runs_path("r1"), RUN)[0] == 201
    assert _send(server, "PUT", protocol.runs_path("r1"), RUN)[0] == 200
    path = protocol.samples_path("r1")
    assert _send(server, "POST", path, {"columns": _columns([0, 1, 2])}) == (
        200,
        {"received": 3, "inserted": 3},
    )
    answer = _send(server, "POST", path, {"columns": _columns([2, 3])}, gz=True)
    assert answer == (200, {"received": 2, "inserted": 1})
    assert [row["seq"] for row in server.rows("r1")] == [0, 1, 2, 3]
    assert server.batch_sizes == [3, 2]
    events = {"events": [{"seq": 0, "step": 1, "kind": "eval", "payload": {"loss": 1.0}}]}
    assert _send(server, "POST", protocol.events_path("r1"), events)[1]["inserted"] == 1
    assert _send(server, "POST", protocol.events_path("r1"), events)[1]["inserted"] == 0
    assert [e["kind"] for e in server.event_rows("r1")] == ["eval"]
    assert _send(server, "PATCH", protocol.runs_path("r1"), {"status": "finished"})[0] == 200
    assert server.runs["r1"]["status"] == "finished"
    assert server.handle_request(Request("POST", protocol.heartbeat_path("r1"))).status == 204
    assert server.heartbeats == ["r1"]


def test_it_refuses_what_the_server_refuses() -> None:
    server = MemoryTransport()
    assert _send(server, "POST", protocol.samples_path("nobody"), {"columns": _columns([0])})[
        0
    ] == 404  # fmt: skip
    status, answer = _send(server, "PUT", protocol.runs_path("r"), {**RUN, "project": " "})
    assert status == 422 and "project must not be blank" in answer["detail"]
    assert _send(server, "PUT", protocol.runs_path("r"), {**RUN, "colour": "red"})[0] == 422
    assert _send(server, "PUT", protocol.runs_path("-bad"), RUN)[0] == 422  # the run-id rule
    assert _send(server, "PUT", protocol.runs_path("r"), RUN)[0] == 201
    bad = _columns([0, 1], b_small=[8.0, 64.0])  # row 1: b_small == b_big
    status, answer = _send(server, "POST", protocol.samples_path("r"), {"columns": bad})
    assert status == 422 and answer["detail"].startswith("row 1: need 0 < b_small < b_big")
    assert server.rows("r") == []  # refused whole, as the server does
    short = {**_columns([0, 1]), "step": [0]}
    assert _send(server, "POST", protocol.samples_path("r"), {"columns": short})[0] == 422
    event = {"events": [{"seq": 0, "step": -1, "kind": "eval", "payload": {}}]}
    assert _send(server, "POST", protocol.events_path("r"), event)[0] == 422
    assert server.handle_request(Request("GET", "/api/v1/nowhere")).status == 404


def test_faults_are_answered_in_order_then_the_api(tmp_path: Path) -> None:
    server = MemoryTransport()
    server.faults += [503, (429, {"Retry-After": "0"}), TransportError("reset")]
    assert server.handle_request(Request("PUT", protocol.runs_path("r"))).status == 503
    answer = server.handle_request(Request("PUT", protocol.runs_path("r")))
    assert (answer.status, answer.header("retry-after")) == (429, "0")
    with pytest.raises(TransportError, match="reset"):
        server.handle_request(Request("PUT", protocol.runs_path("r")))
    server.down = True
    with pytest.raises(TransportError):
        server.handle_request(Request("PUT", protocol.runs_path("r")))
    assert len(server.requests) == 4 and not server.runs

    # a run while it is down spools, and sync delivers the spool to it once it is up
    run = noisescope.init(
        project="p", task="t", transport=server, dir=tmp_path, quiet=True, flush_timeout=0.2
    )
    run.log_sample(1, 8, 64, 2.0, 1.2)
    assert run.finish().spooled == 1
    server.down = False
    assert noisescope.sync(tmp_path, transport=server).synced
    assert [row["step"] for row in server.rows(run.id)] == [1]
