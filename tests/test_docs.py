"""Documentation checked by tests: the README's commands, links and CLI stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_readme_starts_with_the_two_commands() -> None:
    first = _bash_blocks(README)[0]
    commands = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    assert commands[0].endswith("noisescope up")
    assert commands[1] == "scripts/test.sh"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec scripts/test.sh" in ci.splitlines()


@pytest.mark.parametrize("path", sorted(set(re.findall(r"\]\(([^)#]+\.md)\)", README))), ids=str)
def test_readme_links_exist(path: str) -> None:
    assert (ROOT / path).is_file(), f"README links to {path}, which does not exist"


def test_readme_examples_exist() -> None:
    for script in re.findall(r"python (examples/\S+\.py)", README):
        assert (ROOT / script).is_file(), script


@pytest.mark.parametrize(
    "args", [[], ["up"], ["server"], ["dashboard"], ["db"], ["token"], ["sync"]], ids=str
)
def test_cli_help(args: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "noisescope.cli", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: noisescope" in out.stdout
    if not args:
        for name in ("up", "server", "dashboard", "db", "token", "sync"):
            assert re.search(rf"^\s+{name}\b", out.stdout, flags=re.M), name


def test_every_read_endpoint_and_api_method_is_documented() -> None:
    """docs/api.md lists every query endpoint of the app and every public ``Api`` method."""
    import inspect

    from noisescope import Api
    from noisescope_server.app import create_app
    from noisescope_server.settings import Settings

    api_doc = (ROOT / "docs" / "api.md").read_text()
    app = create_app(Settings(database_url="sqlite://"))
    spec = app.openapi()
    for path, operations in spec["paths"].items():
        if any("query" in op.get("tags", []) for op in operations.values()):
            documented = path.removeprefix("/api/v1")
            assert f"`GET {documented}" in api_doc, f"{path} is not in docs/api.md"
    for name, _ in inspect.getmembers(Api, inspect.isfunction):
        if not name.startswith("_") and name != "close":
            assert f"`{name}(" in api_doc, f"Api.{name} is not in docs/api.md"
