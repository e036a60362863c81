"""What requests get while PostgreSQL is down: a private cluster (``initdb`` in a temporary
directory, its own port, so nobody else's database is touched) is stopped for a while and
started again under a server taking sample batches from a few senders. Every answer and how
long it took is recorded; the server retries refused connections for ``db.CONNECT_WAIT``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliability._hostile import API, good_columns
from reliability._infra import Server, port

__all__ = ["Outage", "pg_binaries", "private_cluster", "run_outages"]


def pg_binaries() -> Path | None:
    """The newest PostgreSQL server binaries installed (Debian layout), None without any."""
    root = Path("/usr/lib/postgresql")
    versions = sorted(root.iterdir(), key=lambda p: p.name) if root.is_dir() else []
    for version in reversed(versions):
        if (version / "bin" / "initdb").exists():
            return version / "bin"
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run as the ``postgres`` user then."""
    if os.geteuid() != 0:
        return cmd
    return ["su", "postgres", "-c", " ".join(f"'{c}'" for c in cmd)]


@dataclass
class Cluster:
    bin: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        opts = f"-p {self.port} -k {self.data.parent} -c listen_addresses=127.0.0.1"
        cmd = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l",
               str(self.data.parent / "log"), "-o", opts, *args]  # fmt: skip
        subprocess.run(_as_owner(cmd), check=True, capture_output=True, timeout=120)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    binaries = pg_binaries()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) installed")
    tmp = Path(tempfile.mkdtemp(prefix="ns-pg-outage-"))
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres")
    data = tmp / "data"
    cmd = [str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
    subprocess.run(_as_owner(cmd), check=True, capture_output=True, timeout=300)
    cluster = Cluster(binaries, data, port())
    cluster.ctl("start")
    try:
        yield cluster
    finally:
        try:
            cluster.ctl("-m", "immediate", "stop")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Outage:
    down_s: float
    #: seconds from the stop command to the start command's return (the database unavailable)
    window_s: float = 0.0
    answers: Counter[str] = field(default_factory=Counter)
    #: the longest a request took, and the longest a failed one took
    slowest_s: float = 0.0
    slowest_failed_s: float = 0.0

    def line(self) -> str:
        keys = sorted(self.answers, key=lambda k: (not k.isdigit(), k))
        return "; ".join(f"{k}: {self.answers[k]:,}" for k in keys)


def run_outages(downs: list[float], senders: int = 4, batch: int = 50) -> list[Outage]:
    """For each entry of ``downs``: stop the cluster, wait that long, start it; the requests of
    ``senders`` threads posting ``batch``-sample batches are counted per outage (from the stop
    to 2 s after the start)."""
    results = [Outage(d) for d in downs]
    with private_cluster() as cluster, Server(cluster.url, workers=2) as srv:
        current: list[Outage | None] = [None]
        stop = threading.Event()

        def send() -> None:
            rid, seq = uuid.uuid4().hex, 0
            with httpx.Client(base_url=srv.url + API, timeout=30) as client:
                client.put(f"/runs/{rid}", json={"project": "outage", "task": "t"})
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        r = client.post(f"/runs/{rid}/samples",
                                        json={"columns": good_columns(batch, seq)})  # fmt: skip
                        key = str(r.status_code)
                    except httpx.HTTPError as exc:
                        key = f"no answer ({type(exc).__name__})"
                    took = time.monotonic() - t0
                    outage = current[0]
                    if key == "200":
                        seq += batch
                    if outage is not None:
                        outage.answers[key] += 1
                        outage.slowest_s = max(outage.slowest_s, took)
                        if key != "200":
                            outage.slowest_failed_s = max(outage.slowest_failed_s, took)
                    time.sleep(0.02)

        threads = [threading.Thread(target=send, daemon=True) for _ in range(senders)]
        for t in threads:
            t.start()
        time.sleep(2)
        for outage in results:
            current[0] = outage
            t0 = time.monotonic()
            cluster.ctl("-m", "fast", "stop")
            time.sleep(outage.down_s)
            cluster.ctl("start")
            outage.window_s = time.monotonic() - t0
            time.sleep(2)
            current[0] = None
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join(60)
    return results
