"""Infrastructure the scenarios share: databases (fresh PostgreSQL, SQLite), the server process,
server memory sampling, and client worker processes. Everything stays on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import ServerProcess, free_port, postgres
from reliability._client import ClientSpec

PG_ADMIN = os.environ.get(
    "NOISESCOPE_RELIABILITY_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database (``ns_rel_<random>``), dropped afterwards."""
    # the harness restarts PostgreSQL: wait for it before dropping
    with postgres.fresh_database(
        PG_ADMIN, "ns_rel", before_drop=lambda: wait_for_postgres(60)
    ) as url:
        yield url


@contextlib.contextmanager
def database(backend: str, workdir: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'noisescope.db'}"
    elif backend == "postgresql":
        with fresh_pg_database() as url:
            yield url
    else:
        raise ValueError(f"unknown backend {backend!r}")


def postgres_available() -> bool:
    try:
        with postgres.connect(PG_ADMIN):
            return True
    except Exception:
        return False


def wait_for_postgres(timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if postgres_available():
            return True
        time.sleep(0.5)
    return False


def _pg_cluster() -> list[str]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main"]


def restart_postgres() -> float:
    """Restart the PostgreSQL cluster (connections of every client break); seconds it took."""
    t0 = time.monotonic()
    subprocess.run([*_pg_cluster(), "restart"], check=True, capture_output=True, timeout=120)
    wait_for_postgres(60)
    return time.monotonic() - t0


def ensure_postgres_running() -> None:
    """Start the cluster if a restart left it down (other engineers' tests use it)."""
    if wait_for_postgres(10):
        return
    subprocess.run([*_pg_cluster(), "start"], check=False, capture_output=True, timeout=120)
    wait_for_postgres(60)


def engine_for(url: str) -> Any:
    from sqlalchemy import create_engine

    return create_engine(url, pool_pre_ping=True)


class Server(ServerProcess):
    """``ServerProcess`` with access logging and a chosen log level (to audit the logs)."""

    def __init__(self, database_url: str, *, log_level: str = "warning", **kw: Any) -> None:
        super().__init__(database_url, **kw)
        self.log_level = log_level

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--log-level") + 1] = self.log_level
        if self.log_level in ("debug", "info"):
            cmd.append("--access-log")
        return cmd

    def __enter__(self) -> Server:
        self.start()
        return self

    def crash_and_restart(self, down_s: float) -> None:
        """SIGKILL the server and its workers, stay down ``down_s``, start on the same port."""
        self.kill()
        time.sleep(down_s)
        self.restart()


class MemorySampler:
    """Peak and last resident memory of the server's process tree (parent + workers)."""

    def __init__(self, server: ServerProcess, interval: float = 0.5) -> None:
        self.server = server
        self.interval = interval
        self.peak_bytes = 0
        self.last_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def rss(self) -> int:
        import psutil  # type: ignore[import-untyped]

        proc = self.server.proc
        if proc is None or proc.poll() is not None:
            return 0
        try:
            root = psutil.Process(proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            value = self.rss()
            if value:
                self.last_bytes = value
                self.peak_bytes = max(self.peak_bytes, value)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Worker:
    spec: ClientSpec
    proc: subprocess.Popen[bytes]
    log_path: Path

    def wait(self, timeout: float) -> int:
        """The worker's exit code; -9 when it was still running after ``timeout`` s (killed)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return -9

    def result(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(Path(self.spec.out).read_text())
        except (OSError, ValueError):
            return None
        return data

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


#: Run a command without the capabilities that let root ignore file permissions, so that a
#: read-only directory is read-only for it too (``setpriv`` from util-linux).
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def start_worker(spec: ClientSpec, workdir: Path, respect_permissions: bool = False) -> Worker:
    """Spawn ``python -m reliability._client``; with ``respect_permissions`` a root harness
    drops its permission-override capabilities in the child (read-only spool scenario)."""
    prefix = NO_DAC if respect_permissions and os.geteuid() == 0 else []
    log_path = workdir / f"client-{spec.run_id}.log"
    # this checkout's client, not whichever one is installed
    paths = [str(REPO / "client"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    for name in ("NOISESCOPE_URL", "NOISESCOPE_TOKEN", "NOISESCOPE_DIR", "NOISESCOPE_MODE"):
        env.pop(name, None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "reliability._client", json.dumps(asdict(spec))],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker(spec, proc, log_path)


def wait_workers(workers: list[Worker], deadline: float) -> list[str]:
    """Wait until every worker exits or ``deadline`` (monotonic) passes; kill stragglers.

    Returns problems (non-zero exits, timeouts) as readable lines.
    """
    problems: list[str] = []
    for w in workers:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            code = w.proc.wait(remaining)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait(10)
            problems.append(f"client {w.spec.run_id[:8]} still running at the deadline: killed")
            continue
        if code != 0:
            problems.append(f"client {w.spec.run_id[:8]} exited {code}: {w.log()[-400:]}")
    return problems


def sync_spool(spool_dir: Path, url: str, token: str | None = None) -> tuple[int, str]:
    """``noisescope sync DIR --url URL``: deliver whatever the clients left in their spools."""
    cmd = [sys.executable, "-m", "noisescope.cli", "sync", str(spool_dir), "--url", url]
    if token:
        cmd += ["--token", token]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    return out.returncode, (out.stdout + out.stderr).strip()


def spooled_seqs(spool_dir: Path, run_id: str) -> set[int]:
    """Every seq in a run's spool segments (CRC-valid lines only, as a replay would see)."""
    from noisescope._spool import RunSpool

    spool = RunSpool(spool_dir, run_id)
    seqs: set[int] = set()
    for path in spool._segment_paths():
        for record in spool.read(path):
            seqs.update(record.get("columns", {}).get("seq", []))
    return seqs


def create_token(database_url: str, project: str, scope: str | None = None) -> str:
    """``noisescope token create --project P [--scope S]``: the secret printed once."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "noisescope.cli",
            "token",
            "--database-url",
            database_url,
            "create",
            "--project",
            project,
            *(["--scope", scope] if scope else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    secret = next(line for line in out.stdout.splitlines() if line.startswith("nsk_"))
    return secret.strip()


@dataclass
class Workdir:
    path: Path
    keep: bool = False
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @classmethod
    def make(cls, prefix: str) -> Workdir:
        tmp = tempfile.TemporaryDirectory(prefix=f"ns-rel-{prefix}-")
        path = Path(tmp.name)
        path.chmod(0o755)  # a client may run as `nobody`
        return cls(path, _tmp=tmp)

    def close(self) -> None:
        if self._tmp is not None and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)


def port() -> int:
    return free_port()
