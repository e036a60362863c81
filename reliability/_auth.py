"""Isolation and auth against a real multi-worker server with ``--auth all``: tokens hashed at
rest, no cross-project reads or writes, revocation at once on every worker, no secret in any
log (server debug + access log, client output)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from reliability._check import Check
from reliability._client import ClientSpec
from reliability._hostile import good_columns
from reliability._infra import REPO, Server, create_token, engine_for, start_worker

API = "/api/v1"


@dataclass
class AuthResult:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, what: str, expected: object, got: object) -> None:
        self.checks.append(Check(what, str(expected), str(got)))


def _db_text(server: Server, engine: Any) -> str:
    """Everything the database holds, as text (SQLite: the files' bytes; PostgreSQL: every
    row of every noisescope table), to search for secrets."""
    url = server.database_url
    if url.startswith("sqlite"):
        path = Path(url.split("///", 1)[1])
        blobs = [p.read_bytes() for p in path.parent.glob(path.name + "*")]
        return b"".join(blobs).decode("latin-1")
    with engine.connect() as conn:
        tables = ["project", "task", "run", "token", "event", "sample_block", "series"]
        return "\n".join(repr(list(conn.execute(text(f"SELECT * FROM {t}")))) for t in tables)


def run_auth(server: Server, workdir: Path, *, cli: bool = True) -> AuthResult:
    """``server`` must run with auth ``all`` and a debug/access log (``Server(log_level=...)``).

    ``cli``: create and revoke tokens with the ``noisescope token`` commands (else through
    ``crud``, the same code path without three interpreter start-ups; for CI).
    """
    from noisescope_server import crud

    res = AuthResult()
    url = server.database_url
    engine = engine_for(url)
    if cli:
        secret_a, secret_b = create_token(url, "team-a"), create_token(url, "team-b")
    else:
        secret_a = crud.create_token(engine, "team-a").secret
        secret_b = crud.create_token(engine, "team-b").secret
    wrong = "nsk_" + "x" * 43
    run_a, run_b = uuid.uuid4().hex, uuid.uuid4().hex

    def client(secret: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.Client(base_url=server.url + API, headers=headers, timeout=30)

    body_a = {"project": "team-a", "task": "t", "name": "a"}
    body_b = {"project": "team-b", "task": "t", "name": "b"}
    cols = {"columns": good_columns(5, 0)}
    with client(secret_a) as a, client(secret_b) as b, client(None) as anon, client(wrong) as bad:
        res.add("A creates its run", 201, a.put(f"/runs/{run_a}", json=body_a).status_code)
        res.add("B creates its run", 201, b.put(f"/runs/{run_b}", json=body_b).status_code)
        res.add(
            "A writes its samples", 200, a.post(f"/runs/{run_a}/samples", json=cols).status_code
        )
        res.add(
            "no token cannot write", 401, anon.post(f"/runs/{run_a}/samples", json=cols).status_code
        )
        res.add("no token cannot read (auth all)", 401, anon.get("/runs").status_code)
        res.add("unknown token is refused", 401, bad.get("/runs").status_code)
        res.add(
            "A cannot write B's run", 403, a.post(f"/runs/{run_b}/samples", json=cols).status_code
        )
        res.add(
            "A cannot create a run in B",
            403,
            a.put(f"/runs/{uuid.uuid4().hex}", json=body_b).status_code,
        )
        res.add(
            "A cannot take over B's run id",
            True,
            a.put(f"/runs/{run_b}", json=body_a).status_code in (403, 409),
        )
        res.add(
            "A cannot patch B's run",
            403,
            a.patch(f"/runs/{run_b}", json={"status": "failed"}).status_code,
        )
        res.add(
            "A cannot add events to B's run",
            403,
            a.post(
                f"/runs/{run_b}/events", json={"events": [{"step": 1, "kind": "m"}]}
            ).status_code,
        )
        for path in ("", "/series", "/series-names", "/events", "/samples.csv", "/recommendation"):
            status = a.get(f"/runs/{run_b}{path}").status_code
            res.add(f"A cannot read B's run{path or ''}", True, status in (403, 404))
        listed = {r["run_id"] if "run_id" in r else r.get("uid") for r in a.get("/runs").json()}
        res.add("A's run list holds only A's runs", {run_a}, listed)
        res.add("A's project list", ["team-a"], a.get("/projects").json())
        res.add(
            "A's task list is A's",
            True,
            all(t.get("project", "team-a") == "team-a" for t in a.get("/tasks").json()),
        )
        res.add("B's data unchanged by A's attempts", 0, _count(engine, run_b))
        # revocation: the next request fails, whichever worker takes it
        token_id = _token_id(engine, secret_b)
        if cli:
            revoke = subprocess.run(
                [sys.executable, "-m", "noisescope.cli", "token", "revoke", str(token_id),
                 "--database-url", url], capture_output=True, text=True, timeout=120, cwd=REPO,
            )  # fmt: skip
            res.add("`noisescope token revoke` succeeds", 0, revoke.returncode)
        else:
            res.add("token revoked", True, crud.revoke_token(engine, token_id))
        after = {b.get("/runs").status_code for _ in range(20)}
        after |= {b.post(f"/runs/{run_b}/samples", json=cols).status_code for _ in range(10)}
        res.add("revoked token refused on every request (20 reads, 10 writes)", {401}, after)
    # the real client with a token, and with a wrong one (must spool, never print the secret)
    spool = workdir / "spool-auth"
    spool.mkdir()
    cases = (("valid", secret_a, 2000), ("wrong", wrong, 0))
    workers = [
        start_worker(ClientSpec(
            url=server.url, run_id=uuid.uuid4().hex, project="team-a", task="client",
            samples=2000, spool_dir=str(spool), out=str(workdir / f"auth-{label}.json"),
            token=secret, flush_timeout=10.0, seed=3,
        ), workdir)
        for label, secret, _ in cases
    ]  # fmt: skip
    for (label, secret, expect_sent), worker in zip(cases, workers, strict=True):
        worker.proc.wait(300)
        result = worker.result() or {}
        res.add(f"client with a {label} token: sent", expect_sent, result.get("sent"))
        if label == "wrong":
            res.add(
                "client with a wrong token keeps its samples in the spool",
                2000,
                result.get("spooled"),
            )
        logs = worker.log()
        res.add(f"client output with a {label} token holds no secret", False, secret in logs)
    # secrets at rest and in logs
    with engine.connect() as conn:
        hashes = [r[0] for r in conn.execute(text("SELECT token_hash FROM token"))]
    res.add(
        "tokens stored as sha256 hashes",
        True,
        hashlib.sha256(secret_a.encode()).hexdigest() in hashes
        and all(len(h) == 64 for h in hashes),
    )
    stored = _db_text(server, engine)
    for label, secret in (("A", secret_a), ("B", secret_b)):
        res.add(f"token {label}'s secret appears nowhere in the database", False, secret in stored)
        res.add(
            f"token {label}'s secret body appears nowhere in the database",
            False,
            secret[4:] in stored,
        )
    log = server.log()
    res.add("server log captured (debug + access log)", True, len(log) > 1000)
    for label, secret in (("A", secret_a), ("B", secret_b), ("wrong", wrong)):
        res.add(f"token {label} never in the server log", False, secret[4:] in log)
    engine.dispose()
    return res


def _count(engine: Any, run_uid: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(
            text("SELECT count(*) FROM sample s JOIN run r ON r.id = s.run_id WHERE r.uid = :u"),
            {"u": run_uid},
        ).scalar_one())  # fmt: skip


def _token_id(engine: Any, secret: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(
            text("SELECT id FROM token WHERE token_hash = :h"),
            {"h": hashlib.sha256(secret.encode()).hexdigest()},
        ).scalar_one())  # fmt: skip
