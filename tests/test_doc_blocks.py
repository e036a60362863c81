"""Every fenced block of README.md and docs/*.md is run (or checked) by a test, or is marked as
what it is in its info string, after the language:

- ``fragment``: a piece of the reader's own program, configuration or a command with
  placeholders (``URL``, ``TOKEN``, ``db.internal``); not runnable alone. Python fragments must
  compile, and every ``noisescope ...`` line of a bash fragment must parse with the CLI's parser.
- ``long``: a reproduction command that runs for many minutes (the experiments); its module
  must exist and know each option the command passes.

Every other block has its tests in ``TESTED_BY``; this module checks that the list and the
pages agree (a new block without a test fails here), and runs the blocks no other test runs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from harness import ServerProcess, columns, free_port, run_body, wait_for_health

ROOT = Path(__file__).resolve().parent.parent
MARKS = {"fragment", "long"}


class Block(NamedTuple):
    page: str  # relative to the repo root
    line: int  # of the opening fence
    language: str
    marks: frozenset[str]
    body: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def doc_blocks() -> list[Block]:
    """The fenced blocks of README.md and docs/*.md, in order (indented ones dedented)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for path in pages:
        text = path.read_text()
        fence = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```", flags=re.M | re.S)
        for m in fence.finditer(text):
            language, *marks = m.group(2).split() or [""]
            found.append(
                Block(
                    str(path.relative_to(ROOT)),
                    text.count("\n", 0, m.start()) + 1,
                    language,
                    frozenset(marks),
                    textwrap.dedent(m.group(3)),
                )
            )
    return found


#: (page, a line that only that block of the page has) -> the tests that run or check it.
TESTED_BY: dict[tuple[str, str], list[str]] = {
    ("README.md", "pip install ./client . && noisescope up"): [
        # `pip install ./client .` builds these distributions
        "tests/test_packaging.py::test_wheel_ships_every_module",
        "tests/e2e/test_up.py::test_up_runs_server_and_dashboard_and_stops_both",
        "tests/test_docs.py::test_readme_starts_with_the_two_commands",
    ],
    ("README.md", "scripts/test.sh"): [
        # CI runs scripts/test.sh itself
        "tests/test_docs.py::test_readme_starts_with_the_two_commands",
        "tests/test_docs.py::test_ci_runs_exactly_the_readme_test_command",
    ],
    ("README.md", "python examples/digits.py --sleep 0.05"): [
        "tests/test_docs.py::test_the_readme_steps_then_the_api_example_run_in_order",
    ],
    ("README.md", "python -m experiments --tasks digits --url http://127.0.0.1:8765"): [
        "tests/test_docs.py::test_the_readme_steps_then_the_api_example_run_in_order",
    ],
    ("README.md", "pip install torch --index-url https://download.pytorch.org/whl/cpu"): [
        # an install line: checked against what exists, not run (a download of torch)
        "tests/test_docs.py::test_install_lines_name_what_exists",
        "tests/test_docs.py::test_the_torch_import_error_says_how_to_get_the_cpu_build",
    ],
    ("docs/adaptive_batch.md", "from noisescope.recommend import recommend"): [
        "tests/test_doc_blocks.py::test_the_recommend_example_prints_what_its_comment_says",
    ],
    ("docs/adaptive_batch.md", "GET /api/v1/runs/{run_id}/recommendation?candidates=128"): [
        "tests/test_doc_blocks.py::test_the_recommendation_request_is_answered",
    ],
    ("docs/api.md", "lacks the 'manage' scope"): [
        "tests/server/test_scopes.py::test_the_403_in_the_docs_is_the_servers",
    ],
    ("docs/api.md", "reuse_deleted=true with a token"): [
        "tests/server/test_deleted_runs.py::test_the_410_in_the_docs_is_the_servers",
    ],
    ("docs/deployment.md", "newer than this noisescope"): [
        "tests/server/test_newer_database.py::test_the_line_in_the_docs_is_the_commands",
    ],
    ("docs/api.md", 'api = noisescope.Api("http://127.0.0.1:8765")'): [
        "tests/test_docs.py::test_the_api_example_runs_and_says_only_what_is_true",
        "tests/test_docs.py::test_the_readme_steps_then_the_api_example_run_in_order",
    ],
    ("docs/branching.md", "trainer.fit(DigitsMLP(), train)"): [
        "tests/integrations/test_docs.py::test_the_branching_example_runs_and_branches",
    ],
    ("docs/branching.md", "python examples/branching.py --store /tmp/branches"): [
        "tests/branch/test_example.py::test_the_documented_command_runs_as_written",
        "tests/branch/test_example.py::test_the_branching_example_measures_and_resumes",
    ],
    ("docs/client.md", "noisescope: run bs64 (3f2a9c1e): http://127.0.0.1:8501/run?run="): [
        "tests/test_doc_blocks.py::test_the_client_prints_the_lines_docs_client_md_shows",
    ],
    ("docs/client.md", "waiting up to 30 s (flush_timeout)"): [
        "tests/test_doc_blocks.py::test_the_client_prints_the_lines_docs_client_md_shows",
    ],
    ("docs/client.md", "queued 0, sent 1200, spooled 300, dropped 0"): [
        "tests/test_doc_blocks.py::test_the_client_prints_the_lines_docs_client_md_shows",
    ],
    ("docs/client.md", "from noisescope.testing import MemoryTransport"): [
        "tests/client/test_testing.py::test_the_documented_example_runs_as_written",
    ],
    ("docs/dashboard.md", 'python -m pytest tests/dashboard -m "not browser"'): [
        # CI runs every test of tests/dashboard (scripts/test.sh); this checks the commands
        "tests/test_doc_blocks.py::test_the_dashboard_test_commands_select_real_tests",
    ],
    ("docs/deployment.md", "noisescope up\n"): [
        "tests/e2e/test_up.py::test_up_runs_server_and_dashboard_and_stops_both",
    ],
    ("docs/deployment.md", "is already in use, so the ingest server cannot start there"): [
        "tests/server/test_cli.py::test_a_taken_port_is_one_line_and_status_2_before_any_url",
    ],
    ("docs/deployment.md", "noisescope db upgrade"): [
        "tests/test_doc_blocks.py::test_the_team_server_commands_run_against_postgresql",
    ],
    ("docs/deployment.md", "noisescope: cannot open database postgresql+psycopg"): [
        "tests/server/test_cli.py::test_a_bad_database_url_is_one_line_and_status_2",
        "tests/server/test_cli.py::test_bad_database_urls_name_the_url_and_the_problem",
    ],
    ("docs/integrations.md", "callbacks=[HuggingFaceCallback("): [
        "tests/integrations/test_docs.py::test_doc_script_runs_and_reaches_the_server",
    ],
    ("docs/integrations.md", 'callbacks=[LightningCallback(project="docs", task="digits-mlp")]'): [
        "tests/integrations/test_docs.py::test_doc_script_runs_and_reaches_the_server",
    ],
}


def _unmarked() -> list[Block]:
    return [b for b in doc_blocks() if not b.marks & MARKS]


def test_the_scan_finds_the_blocks() -> None:
    blocks = doc_blocks()
    assert len(blocks) >= 30, len(blocks)
    assert any(b.page == "docs/deployment.md" and "cannot open database" in b.body for b in blocks)
    unknown = [(str(b), sorted(b.marks)) for b in blocks if b.marks - MARKS]
    assert not unknown, f"marks other than {sorted(MARKS)}: {unknown}"


def test_every_block_is_tested_or_marked() -> None:
    """Each unmarked block has exactly one entry, each entry one block, each named test exists."""
    unmarked = _unmarked()
    matches = {
        key: [b for b in unmarked if b.page == key[0] and key[1] in b.body] for key in TESTED_BY
    }
    stale = {key: [str(b) for b in found] for key, found in matches.items() if len(found) != 1}
    assert not stale, f"entries of TESTED_BY that match no block or several: {stale}"
    untested = [str(b) for b in unmarked if not any(b in found for found in matches.values())]
    assert not untested, (
        f"blocks no test runs: {untested}; add a test to TESTED_BY, or mark the block "
        f"`fragment` or `long` in its info string (see this module's docstring)"
    )
    for key, tests in TESTED_BY.items():
        for test in tests:
            file, name = test.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / file).read_text(), flags=re.M), (key, test)


# --- marked blocks ------------------------------------------------------------------------------


def _cli_lines(body: str) -> list[list[str]]:
    """The ``noisescope ...`` commands of a shell block as argv (comments, ``VAR=...`` prefixes,
    continuation lines and ``[optional]`` brackets resolved; ``URL``/``TOKEN`` filled in)."""
    joined = body.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line.split("  #")[0], comments=True)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words[:1] == ["noisescope"]:
            fill = {"URL": "http://127.0.0.1:8765", "TOKEN": "nsk_x"}
            commands.append([fill.get(w, w) for w in (w.strip("[]") for w in words[1:]) if w])
    return commands


def test_fragments_are_valid_code() -> None:
    from noisescope.cli import build_parser

    parser = build_parser()
    checked = 0
    for block in doc_blocks():
        if "fragment" not in block.marks:
            continue
        if block.language == "python":
            compile(block.body, str(block), "exec")
            checked += 1
        elif block.language == "bash":
            for argv in _cli_lines(block.body):
                parser.parse_args(argv)  # SystemExit (2) on an option the CLI does not take
                checked += 1
    assert checked >= 12, checked


def test_long_commands_name_what_exists() -> None:
    """``python -m MODULE --option ...``: the module is in the repo and reads each option."""
    longs = [b for b in doc_blocks() if "long" in b.marks]
    assert len(longs) >= 3
    for block in longs:
        for line in block.body.splitlines():
            words = shlex.split(line)
            if not words:
                continue
            assert "python" in words and words[words.index("python") + 1] == "-m", (block, line)
            module = words[words.index("python") + 2]
            source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
            for option in (w for w in words if w.startswith("--")):
                assert f'"{option}"' in source, (str(block), module, option)
            for path in (w for w in words if w.startswith("docs/")):
                assert (ROOT / path).parent.is_dir(), (str(block), path)


# --- blocks no other test runs ------------------------------------------------------------------


def _block(page: str, needle: str) -> str:
    (found,) = [b.body for b in doc_blocks() if b.page == page and needle in b.body]
    return found


@pytest.fixture(scope="module")
def server() -> Any:
    with ServerProcess() as proc:
        yield proc


def test_the_recommend_example_prints_what_its_comment_says(tmp_path: Path) -> None:
    code = _block("docs/adaptive_batch.md", "from noisescope.recommend import recommend")
    expected = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# ")]
    assert expected, code
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected


def test_the_recommendation_request_is_answered(server: ServerProcess) -> None:
    request = _block("docs/adaptive_batch.md", "GET /api/v1/runs/{run_id}/recommendation").strip()
    method, path = request.split()
    assert method == "GET"
    rid = uuid.uuid4().hex
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.put(f"/api/v1/runs/{rid}", json=run_body(batch_size=64)).status_code == 201
        r = client.post(f"/api/v1/runs/{rid}/samples", json={"columns": columns(600)})
        assert r.status_code == 200, r.text
        r = client.get(path.replace("{run_id}", rid))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) >= {"run_id", "units", "last_step", "window_samples", "recommendation"}
    rec = answer["recommendation"]
    assert {o["batch_size"] for o in rec["options"]} >= {128, 512}
    assert rec["goodput_batch_size"] is not None  # the throughput was read


def _pattern(doc_line: str, holes: dict[str, str]) -> re.Pattern[str]:
    """The doc's line as a regex: its text literally, each key of ``holes`` (an example value
    the doc shows) replaced by the regex for what stands there."""
    keys = sorted(holes, key=len, reverse=True)
    parts = re.split("(" + "|".join(map(re.escape, keys)) + ")", doc_line)
    return re.compile("".join(holes[p] if p in holes else re.escape(p) for p in parts))


def test_the_client_prints_the_lines_docs_client_md_shows(
    server: ServerProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's page once the server created it; then, with the server gone, the wait at
    finish and the finish line, as docs/client.md shows them (ids, counts, paths and the URL
    are this run's)."""
    import noisescope

    monkeypatch.delenv("NOISESCOPE_QUIET", raising=False)
    link_doc = _block("docs/client.md", "/run?run=3f2a9c1e").strip()
    wait_doc = _block("docs/client.md", "waiting up to 30 s").strip()
    end_doc = _block("docs/client.md", "queued 0, sent 1200").strip()
    with socket.socket() as sock:  # a port nothing listens on: connections refused
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    hex_id = "[0-9a-f]+"
    spool = r"[^\s)]+"

    run = noisescope.init(
        url=server.url, project="digits", task="mlp", name="bs64", dir=tmp_path,
        dashboard_url="http://127.0.0.1:8501",
    )  # fmt: skip
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    link = _pattern(link_doc, {"3f2a9c1e...": hex_id, "3f2a9c1e": hex_id})
    assert any(link.fullmatch(line) for line in capsys.readouterr().err.splitlines()), link

    run = noisescope.init(
        url=down, project="digits", task="mlp", name="bs64", dir=tmp_path, flush_timeout=1.5
    )
    for step in range(1500):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    run.finish()
    printed = capsys.readouterr().err.splitlines()
    holes = {
        "3f2a...": hex_id, "30 s": r"1\.5 s", "/home/me/.noisescope/spool": spool,
        "http://127.0.0.1:8765": re.escape(down), "1200": r"\d+", "300": r"\d+",
    }  # fmt: skip
    for doc_line in (wait_doc, end_doc):
        pattern = _pattern(doc_line, holes)
        assert any(pattern.fullmatch(line) for line in printed), (pattern, printed)


def test_the_dashboard_test_commands_select_real_tests() -> None:
    """The markers and paths the commands name exist; CI runs these tests (all of them)."""
    import tomllib

    block = _block("docs/dashboard.md", "python -m pytest tests/dashboard")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = {m.split(":")[0] for m in config["ini_options"]["markers"]}
    browser_tests = [p for p in (ROOT / "tests" / "dashboard").glob("test_*.py")
                     if "pytest.mark.browser" in p.read_text()]  # fmt: skip
    assert browser_tests
    for line in block.splitlines():
        words = shlex.split(line.split("  #")[0])
        assert words[:3] == ["python", "-m", "pytest"], line
        assert (ROOT / words[3]).is_dir(), line
        selection = words[len(words) - 1 - words[::-1].index("-m") + 1]
        assert set(re.findall(r"\w+", selection)) - {"not", "and", "or"} <= markers, line
    ci = (ROOT / "scripts" / "test.sh").read_text()
    assert 'python -m pytest -n "$workers" --dist loadfile' in ci


def test_the_dashboard_test_commands_say_what_installs_their_extras() -> None:
    """Issue 47 item 6: the README's first command leaves out pytest and Playwright."""
    import tomllib

    doc = (ROOT / "docs" / "dashboard.md").read_text()
    tests = doc.split("\n## Tests\n", 1)[1].split("```bash", 1)[0]
    install = "pip install -e ./client -e '.[dev]'"
    assert install in tests and install in (ROOT / "DEVELOPERS.md").read_text(), tests
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pytest") for d in dev["optional-dependencies"]["dev"])


@pytest.mark.postgres
@pytest.mark.slow
def test_the_team_server_commands_run_against_postgresql(pg_url: str, tmp_path: Path) -> None:
    """docs/deployment.md's team-server block as written, on this machine's PostgreSQL (its host,
    a fresh database and a free port in place of the doc's): the server comes up with 4 workers
    and refuses an unauthenticated write (--auth write)."""
    from sqlalchemy.engine import make_url

    from harness import postgres

    block = _block("docs/deployment.md", "noisescope db upgrade")
    admin = make_url(pg_url)
    name = f"{admin.database}_deploy"
    port = free_port()
    script = (
        block.replace("noisescope:SECRET@db.internal:5432/noisescope",
                      f"{admin.username}@{admin.host}:{admin.port or 5432}/{name}")
        .replace("-U postgres noisescope\n", f"-U {admin.username} {name}\n")
        .replace("db.internal", str(admin.host))
        .replace("--port 8765", f"--port {port}")
    )  # fmt: skip
    assert name in script and "db.internal" not in script and str(port) in script, script
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    env["NOISESCOPE_HOME"] = str(tmp_path)
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script], env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(url, 120, proc)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{log.read_text()}") from exc
        r = httpx.put(f"{url}/api/v1/runs/{uuid.uuid4().hex}", json=run_body(), timeout=30)
        assert r.status_code == 401, r.text
        assert httpx.get(f"{url}/api/v1/runs", timeout=30).status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        with postgres.connect(pg_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert "Traceback" not in log.read_text()
