"""The README's first command: `noisescope up`, the example posting to it, and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.servers import free_port, wait_for_health

ROOT = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


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
    env.pop("NOISESCOPE_DATABASE_URL", None)
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

        db = tmp_path / "noisescope.db"
        assert db.exists(), "noisescope up did not create its database under NOISESCOPE_HOME"
        engine = sa.create_engine(f"sqlite:///{db}")
        with engine.connect() as conn:
            n = conn.execute(
                sa.text(
                    "SELECT count(*) FROM sample JOIN run ON run.id = sample.run_id "
                    "WHERE run.name = 'from-test'"
                )
            ).scalar_one()
        engine.dispose()
        assert n == 30
    finally:
        up.send_signal(signal.SIGTERM)
        output, _ = up.communicate(timeout=60)
    assert str(tmp_path / "noisescope.db") in output
    assert server_url in output and dash_url in output
    assert not _answers(f"{server_url}/api/v1/health"), "server left running after SIGTERM"
    assert not _answers(f"{dash_url}/_stcore/health"), "dashboard left running after SIGTERM"
