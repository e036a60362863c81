"""The README's first command: `noisescope up`, the example posting to it, and a clean stop.

The dashboard `up` starts reads the server it started (NOISESCOPE_URL), never the database, and
the server hands out links to that dashboard's run pages, which the example's client prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import noisescope
from harness import free_port, wait_for_health
from noisescope.protocol import format_count
from tests.support.database import query

ROOT = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _child_environ(parent: int, program: str) -> dict[str, str]:
    """The environment of the child process of ``parent`` whose command line names ``program``
    (Linux /proc)."""
    for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        if program.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
            return {k.decode(): v.decode() for k, _, v in pairs}
    raise AssertionError(f"noisescope up has no {program} child")


def _wait(url: str, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(url):
        assert proc.poll() is None, (
            f"noisescope up exited early:\n{proc.stdout and proc.stdout.read()}"
        )
        assert time.monotonic() < deadline, f"{url} did not answer within {timeout} s"
        time.sleep(0.3)


@pytest.mark.slow
def test_up_runs_server_and_dashboard_and_stops_both(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    port, dash_port = free_port(), free_port()
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path)}
    for name in ("NOISESCOPE_DATABASE_URL", "NOISESCOPE_DASHBOARD_URL", "NOISESCOPE_QUIET"):
        env.pop(name, None)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "noisescope.cli",
            "up",
            "--port",
            str(port),
            "--dashboard-port",
            str(dash_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server_url, dash_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dash_port}"
    try:
        wait_for_health(server_url, timeout=120)
        _wait(f"{dash_url}/_stcore/health", up)
        dash_env = _child_environ(up.pid, "streamlit")
        assert dash_env["NOISESCOPE_URL"] == server_url
        assert "NOISESCOPE_DATABASE_URL" not in dash_env  # it reads the HTTP API only
        assert _child_environ(up.pid, "noisescope_server")["NOISESCOPE_DASHBOARD_URL"] == dash_url

        example = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "digits.py"),
                "--url",
                server_url,
                "--steps",
                "30",
                "--name",
                "from-test",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert example.returncode == 0, example.stderr
        assert "sent 30" in example.stdout + example.stderr
        *_, finished, b_simple, verdict = example.stdout.splitlines()
        run_id = finished.split()[1]
        assert finished == f"run {run_id} finished; its page on the dashboard shows its noise scale"
        # Issue 47 item 9: it ends on its current B_simple and the verdict, read from the server
        with noisescope.Api(server_url) as api:
            advice = api.recommendation(run_id).recommendation
            summary = api.run(run_id)
        assert advice.b_simple == summary.b_simple  # the number the Runs table shows
        if advice.b_simple is None:
            said = advice.reason if advice.b_simple_lower is None else "≥ "
            assert b_simple.startswith(f"B_simple now: {said}"), b_simple
        else:
            assert b_simple.startswith(f"B_simple now: {format_count(advice.b_simple)}"), b_simple
        assert verdict == f"verdict at batch 64: {advice.verdict}" and advice.verdict, verdict
        link = f"{dash_url}/run?run={run_id}"
        # printed once when the server answered the run's creation, and again at finish
        assert f"noisescope: run from-test ({run_id[:8]}): {link}\n" in example.stderr
        assert f"View it at {link}" in example.stderr

        db = tmp_path / "noisescope.db"
        assert db.exists(), "noisescope up did not create its database under NOISESCOPE_HOME"
        [(n,)] = query(
            f"sqlite:///{db}",
            "SELECT count(*) FROM sample JOIN run ON run.id = sample.run_id "
            "WHERE run.name = 'from-test'",
        )
        assert n == 30
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=60)
    assert str(tmp_path / "noisescope.db") in output
    assert server_url in output and dash_url in output
    assert not _answers(f"{server_url}/api/v1/health"), "server left running after SIGTERM"
    assert not _answers(f"{dash_url}/_stcore/health"), "dashboard left running after SIGTERM"


def _children(parent: int) -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]


def _program(pid: int) -> str:
    return "streamlit" if b"streamlit" in Path(f"/proc/{pid}/cmdline").read_bytes() else "server"


@pytest.mark.slow
def test_up_says_which_child_died_and_stops_the_other(tmp_path: Path) -> None:
    """The server child killed: `up` names it, its pid and the signal, stops the dashboard
    and exits 1."""
    port, dash_port = free_port(), free_port()
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "noisescope.cli", "up", "--port", str(port),
         "--dashboard-port", str(dash_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        head = []
        for line in up.stdout:  # the last line of the start, once both answer
            head.append(line)
            if "Ctrl-C stops both" in line:
                break
        by_program = {_program(pid): pid for pid in _children(up.pid)}
        os.kill(by_program["server"], signal.SIGKILL)
        rest, _ = up.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGKILL)
        up.wait(30)
    out = "".join(head) + rest
    assert (
        f"noisescope up: the ingest server (pid {by_program['server']}) was stopped by SIGKILL; "
        "stopping the dashboard" in out
    ), out
    assert up.returncode == 1
    assert not Path(f"/proc/{by_program['streamlit']}").exists(), "Streamlit left running"
    assert not _answers(f"http://127.0.0.1:{dash_port}/_stcore/health"), "dashboard left running"
