"""What the benchmarks that run this checkout beside an earlier commit share (``dashboard``,
``series``): the earlier commit exported with ``git archive``, an environment that runs one
checkout's own code, and a worker subprocess per version that answers JSON lines on stdin
with ``MARK`` + JSON on stdout (its first answer names the files its modules came from)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
MARK = "@@bench "


def export(rev: str, dest: Path, folders: Iterable[str]) -> str:
    """``git archive rev folders...`` into ``dest``; the short hash."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", f"{rev}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", commit, *folders],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def export_code(rev: str, dest: Path) -> str:
    """``git archive rev client server migrations`` into ``dest`` (the migrations inside the
    server package, where an installed one has them); the short hash."""
    commit = export(rev, dest, ("client", "server", "migrations"))
    (dest / "migrations").rename(dest / "server" / "noisescope_server" / "migrations")
    return commit


def code_env(root: Path, packages: Iterable[str], **set_: str) -> dict[str, str]:
    """This process's environment without ``NOISESCOPE_*``, with ``PYTHONPATH`` the checkout at
    ``root``'s package folders (so a worker runs that checkout's code, whatever the virtual
    environment has installed), and ``set_``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    env["PYTHONPATH"] = os.pathsep.join(str(root / d) for d in packages)
    env.update(set_)
    return env


def server_cpu(pid: int) -> Callable[[], float]:
    """A reading of the user + system CPU seconds of the process ``pid`` and its children (a
    server and its workers), as psutil reports them."""
    import psutil  # type: ignore[import-untyped]

    server = psutil.Process(pid)

    def cpu() -> float:
        total = 0.0
        for proc in [server, *server.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = proc.cpu_times()
                total += t.user + t.system
        return total

    return cpu


def reply(obj: dict[str, Any]) -> None:
    """The worker side: one answer."""
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    """One version in a subprocess: ``python -m module --worker args...``."""

    def __init__(self, label: str, module: str, args: list[str], env: dict[str, str], log: Path):
        self.label = label
        self.log = log
        self._log_file = open(log, "w")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--worker", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        self.modules: list[str] = self._read()["modules"]

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(MARK):
                answer: dict[str, Any] = json.loads(line[len(MARK) :])
                return answer
        tail = self.log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the {self.label} worker ended:\n{tail}")

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def check_modules(self, under: Path) -> None:
        """Raise unless every module the worker reported came from under ``under``."""
        for path in self.modules:
            if not Path(path).resolve().is_relative_to(under.resolve()):
                raise RuntimeError(
                    f"the {self.label} worker imported {path}, not from under {under}"
                )

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log_file.close()


@contextlib.contextmanager
def worker_process(
    label: str, module: str, args: list[str], env: dict[str, str], log: Path
) -> Iterator[Worker]:
    worker = Worker(label, module, args, env, log)
    try:
        yield worker
    finally:
        worker.close()
