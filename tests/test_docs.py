"""Documentation checked by tests: the README's commands, links and CLI stay true."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_readme_starts_with_the_two_commands() -> None:
    """``noisescope up`` first, in a block of its own (it runs until Ctrl-C: issue 56 item 12),
    and the test command in another block, with how long it takes."""
    blocks = _bash_blocks(README)
    commands = [line for line in blocks[0].splitlines() if line and not line.startswith("#")]
    assert len(commands) == 1, commands
    assert commands[0].endswith("noisescope up")
    (tests,) = [b for b in blocks if "scripts/test.sh" in b]
    assert tests.strip() == "scripts/test.sh"
    before = README.split("```bash\nscripts/test.sh", 1)[0].rsplit("```", 1)[1]
    assert re.search(r"\d+ min", before) and ".venv-test" in before and "free ports" in before


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
    "args",
    [
        [],
        ["up"],
        ["server"],
        ["dashboard"],
        ["db"],
        ["token"],
        ["sync"],
        ["runs"],
        ["runs", "list"],
    ],
    ids=str,
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


def test_cli_version() -> None:
    """Issue 30 item 8: `noisescope --version` names the client's and the server's versions."""
    from importlib import metadata

    import noisescope

    out = subprocess.run(
        [sys.executable, "-m", "noisescope.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    server = metadata.version("noisescope-server")
    assert out.stdout.strip() == f"noisescope {noisescope.__version__} (noisescope-server {server})"


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


# --- The maths' reference: docs/science.md, and every citation of it ---------------------------

_SCIENCE_NAME = "science" + ".md"  # spelt apart so this file is no citation itself
SCIENCE = ROOT / "docs" / _SCIENCE_NAME


def _repo_text_files() -> dict[str, str]:
    """Every file git tracks or would add (untracked, not ignored) that reads as UTF-8 text."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    texts = {}
    for name in listed:
        path = ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # figures and other binaries
    return texts


@pytest.fixture(scope="module")
def repo_texts() -> dict[str, str]:
    return _repo_text_files()


def _science_headings() -> list[str]:
    return [
        line.lstrip("#").strip()
        for line in SCIENCE.read_text().splitlines()
        if line.startswith("#")
    ]


def test_science_md_is_in_the_repo_with_the_cited_sections() -> None:
    headings = _science_headings()
    for name in (
        "Quantities",
        "Two-batch-size unbiased estimator",
        "Where the two batch sizes come from",
        "Pitfalls",
        "Critical batch size from batch-size sweeps",
        "Ground truth for tests",
        "Measuring the critical batch size directly (branching)",
        "The critical batch size as a function of loss",
    ):
        assert any(h.startswith(name) for h in headings), f"docs/science.md lacks {name!r}"


def test_the_maths_is_cited_as_docs_science_md(repo_texts: dict[str, str]) -> None:
    """Citations name the file in the repo, never a copy outside it or a bare file name."""
    bad = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        for name, text in repo_texts.items()
        for m in re.finditer(re.escape(_SCIENCE_NAME), text)
        if text[max(0, m.start() - 5) : m.start()] != "docs/"
        or text[max(0, m.start() - 6) : m.start() - 5] in ("/", ".")
    ]
    assert not bad, f"cite the maths as docs/{_SCIENCE_NAME}: {bad}"


def test_cited_science_sections_and_equations_exist(repo_texts: dict[str, str]) -> None:
    """A quoted section after a citation names a heading of the page; an "eq. N" an equation."""
    science = SCIENCE.read_text()
    headings = [" ".join(h.split()) for h in _science_headings()]
    equations = set(re.findall(r"\((\d+)\)\s*$", science, flags=re.M))
    cite = r"docs/" + re.escape(_SCIENCE_NAME)
    for name, text in repo_texts.items():
        for quoted in re.findall(cite + r',?\s+"([^"]+)"', text):
            section = " ".join(quoted.split())
            assert any(h.startswith(section) for h in headings), f"{name}: no section {quoted!r}"
        for first, last in re.findall(cite + r",?\s+eqs?\.\s*(\d+)(?:-(\d+))?", text):
            for number in filter(None, (first, last)):
                assert number in equations, f"{name}: docs/{_SCIENCE_NAME} has no eq. {number}"


def test_cited_docs_pages_exist(repo_texts: dict[str, str]) -> None:
    """Every `docs/<page>.md` named in code or docs is a file of the repo."""
    missing = sorted(
        {
            f"{name}: {page}"
            for name, text in repo_texts.items()
            for page in re.findall(r"(?<![\w/.])docs/[\w/.-]+?\.md\b", text)
            if not (ROOT / page).is_file()
        }
    )
    assert not missing, missing


# --- Every setting, variable, CLI option and route is documented ------------------------------


def _doc_pages() -> list[str]:
    """What a user reads: README, DEVELOPERS.md and docs/*.md."""
    pages = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [page.read_text() for page in pages]


def _docs_text() -> str:
    return "\n".join(_doc_pages())


def _environment_variables(repo_texts: dict[str, str]) -> set[str]:
    """The ``NOISESCOPE_*`` variables the product reads (client, server, dashboard)."""
    product = ("client/", "server/", "dashboard/", "migrations/")
    return {
        var
        for name, text in repo_texts.items()
        if name.startswith(product) and name.endswith(".py")
        for var in re.findall(r"\bNOISESCOPE_[A-Z][A-Z0-9_]*[A-Z0-9]\b", text)
    }


def test_every_settings_field_is_documented() -> None:
    from noisescope import Settings as ClientSettings
    from noisescope_server.settings import Settings as ServerSettings

    client_doc = (ROOT / "docs" / "client.md").read_text()
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    undocumented = [
        f"noisescope.Settings.{f.name} (docs/client.md)"
        for f in dataclasses.fields(ClientSettings)
        if f"`{f.name}`" not in client_doc
    ] + [
        f"noisescope_server Settings.{f.name} (docs/deployment.md)"
        for f in dataclasses.fields(ServerSettings)
        if f"`{f.name}`" not in deployment
    ]
    assert not undocumented, undocumented


def test_every_environment_variable_is_documented(repo_texts: dict[str, str]) -> None:
    docs = _docs_text()
    variables = _environment_variables(repo_texts)
    assert "NOISESCOPE_URL" in variables  # the scan finds what it is meant to
    assert not sorted(v for v in variables if f"`{v}`" not in docs)


def _cli_options(parser: argparse.ArgumentParser, command: str) -> Iterator[tuple[str, str]]:
    """(command, its long option or "") for every command of ``parser`` and its subcommands."""
    yield command, ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _cli_options(sub, f"{command} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield from ((command, flag) for flag in action.option_strings if flag[:2] == "--")


def test_every_cli_option_is_documented() -> None:
    from benchmarks.__main__ import build_parser as benchmarks_parser
    from experiments.__main__ import build_parser as experiments_parser
    from noisescope.cli import build_parser
    from reliability.__main__ import build_parser as reliability_parser

    pages = _doc_pages()
    options = [
        *_cli_options(build_parser(), "noisescope"),
        *_cli_options(benchmarks_parser(), "python -m benchmarks"),
        *_cli_options(reliability_parser(), "python -m reliability"),
        *_cli_options(experiments_parser(), "python -m experiments"),
    ]
    commands = {command for command, _ in options}
    assert {"noisescope up", "noisescope sync", "noisescope token create"} <= commands
    missing = [  # on a page that names the command
        f"{command} {option}".strip()
        for command, option in options
        if not any(command in page and option in page for page in pages)
    ]
    assert not missing, f"not in README/DEVELOPERS/docs: {missing}"


def test_every_api_route_is_documented() -> None:
    """Each route of the app (its OpenAPI paths), as `METHOD /path` in docs/api.md or
    DEVELOPERS.md."""
    from noisescope_server.app import create_app
    from noisescope_server.settings import Settings

    docs = (ROOT / "docs" / "api.md").read_text() + (ROOT / "DEVELOPERS.md").read_text()
    spec = create_app(Settings(database_url="sqlite://")).openapi()
    routes = [
        (method.upper(), path.removeprefix("/api/v1"))
        for path, operations in spec["paths"].items()
        for method in operations
    ]
    assert ("PUT", "/runs/{run_id}") in routes
    missing = [
        f"{method} {path}"
        for method, path in routes
        if not re.search(rf"`{method} (/api/v1)?{re.escape(path)}[`?]", docs)
    ]
    assert not missing, f"not in docs/api.md or DEVELOPERS.md: {missing}"


def test_developers_md_signatures_match_the_code() -> None:
    """Each `name(params)` DEVELOPERS.md shows for a public function has the code's parameters
    (in order; `name=` stands for a keyword the function takes)."""
    import noisescope
    from noisescope import estimators

    text = (ROOT / "DEVELOPERS.md").read_text()
    homes = (estimators, noisescope, noisescope.Run, noisescope.Api)
    checked = 0
    for name, params in re.findall(r"`(?:[\w.]+\.)?(\w+)\(([^()`]*)\)", text):
        target = next((getattr(h, name) for h in homes if hasattr(h, name)), None)
        if not inspect.isfunction(target) or "..." in params:
            continue  # classes, and calls shown with their arguments elided
        shown = [p.strip() for p in params.split(",") if p.strip() not in ("", "*", "/")]
        written = [p.split("=")[0].strip() for p in shown if not p.endswith("=")]
        keywords = [p.removesuffix("=").strip() for p in shown if p.endswith("=")]
        actual = [
            p.name
            for p in inspect.signature(target).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
        ]
        assert written == actual[: len(written)], f"DEVELOPERS.md shows {name}({params})"
        assert set(keywords) <= set(actual), f"DEVELOPERS.md shows {name}({params})"
        checked += 1
    assert checked >= 5, checked


# --- Install lines that work ------------------------------------------------------------------

CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_install_lines_name_what_exists() -> None:
    """From a checkout the extras are `./client[...]`, and each extra shown is the client's."""
    import tomllib

    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    extras = set(client["optional-dependencies"])
    for extra in re.findall(r"pip install '\./client\[(\w+)\]'", README):
        assert extra in extras, extra
    assert "pip install './client[transformers]'" in README
    assert CPU_TORCH in README
    for page in ("README.md", "docs/integrations.md", "docs/client.md"):
        text = (ROOT / page).read_text()
        bare = re.findall(r"pip install '?noisescope\[", text)
        assert not bare or "once published" in text, f"{page}: a PyPI line as if it worked"


def test_the_torch_import_error_says_how_to_get_the_cpu_build() -> None:
    code = "import sys; sys.modules['torch'] = None; import noisescope.torch"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError: noisescope.torch needs PyTorch" in done.stderr
    assert CPU_TORCH in done.stderr


def _api_example() -> str:
    """docs/api.md's first Python block: the notebook example of ``noisescope.Api``."""
    text = (ROOT / "docs" / "api.md").read_text()
    block: str = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    return block


DEFAULT_URL = "http://127.0.0.1:8765"


def _run_example(code: str, url: str, folder: Path) -> subprocess.CompletedProcess[str]:
    script = folder / "example.py"
    script.write_text(code.replace(DEFAULT_URL, url))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )


def _says_b_crit_and_a_plan(stdout: str, b_crit: str) -> None:
    """Each target's B_crit line is followed by the plan's summary."""
    lines = stdout.splitlines()
    found = [
        i for i, line in enumerate(lines) if re.match(rf"loss \S+: B_crit = {b_crit} \[", line)
    ]
    assert found, stdout
    for i in found:
        plan = lines[i + 1]
        assert plan.startswith("  ") and "device" in plan and "note:" not in plan, stdout
    assert "not determined" not in stdout


@pytest.mark.parametrize("swept", [False, True], ids=["one-batch-size", "sweep"])
def test_the_api_example_runs_and_says_only_what_is_true(swept: bool, tmp_path: Path) -> None:
    """The example runs as written against a server holding a digits run and a sweep under
    the names the README's steps use: a determined sweep gives B_crit and a plan, one batch size
    gives no B_crit and says why."""
    import random

    import httpx

    from harness import ServerProcess
    from harness.synthetic_sweep import make_sweep, post

    code = _api_example()
    assert "if t.determined" in code
    with ServerProcess() as server, httpx.Client(base_url=server.url, timeout=60) as client:
        sizes = (16, 64, 256, 1024) if swept else (64,)
        runs = make_sweep(200.0, sizes, lrs=((0.3, 1.0),), seeds=2, rng=random.Random(2))
        post(client, runs, project="noisescope-reproduction", task="digits")
        one = make_sweep(200.0, (64,), lrs=((0.3, 1.0),), rng=random.Random(3))
        post(client, one, project="examples", task="digits-mlp")
        out = _run_example(code, server.url, tmp_path)
    assert out.returncode == 0, out.stderr
    if swept:
        _says_b_crit_and_a_plan(out.stdout, r"2\d\d")
    else:
        assert "B_crit not determined: " in out.stdout, out.stdout
        assert "B_crit =" not in out.stdout and "devices" not in out.stdout


def _readme_steps() -> list[str]:
    """The commands the README has a user type once `noisescope up` runs, in order: its bash
    blocks from the second to the "Install" section, comments dropped."""
    before_install = README[: README.index("## Install")]
    lines = [line.split("  #")[0].strip() for block in _bash_blocks(before_install)[1:]
             for line in block.splitlines()]  # fmt: skip
    # the test command (CI runs it: test_ci_runs_exactly_the_readme_test_command) is no step
    return [line for line in lines if line and not line.startswith("#") and line != TEST_COMMAND]


TEST_COMMAND = "scripts/test.sh"


@pytest.mark.slow
def test_the_readme_steps_then_the_api_example_run_in_order(tmp_path: Path) -> None:
    """After `noisescope up` (tests/e2e/test_up.py), the README's next commands as written, in
    a fresh folder, against a fresh server: the digits example, then the sweep that fills the
    sweep pages; then docs/api.md's example reads both and finds B_crit at every target.

    The pip lines are checked, not run: what they install is what this environment has."""
    import importlib.util
    import shlex

    import noisescope
    from harness import ServerProcess

    steps = _readme_steps()
    installs = [s for s in steps if "pip install" in s]
    commands = [s for s in steps if s not in installs]
    assert any("torch==2.13.0" in s for s in installs) and "pip install scikit-learn" in steps
    assert importlib.util.find_spec("torch") and importlib.util.find_spec("sklearn")
    assert [shlex.split(c)[:2] for c in commands] == [
        ["python", "examples/digits.py"],
        ["python", "-m"],
    ], commands
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")},
        "PYTHONPATH": str(ROOT),  # the checkout, as `python -m experiments` at its root
        "NOISESCOPE_HOME": str(tmp_path / "home"),
        "OMP_NUM_THREADS": "1",
    }
    with ServerProcess() as server:
        env["NOISESCOPE_URL"] = server.url  # what the README's default URL is to a user
        for command in commands:
            args = shlex.split(command.replace(DEFAULT_URL, server.url))
            done = subprocess.run(
                [sys.executable, *args[1:]], cwd=tmp_path, env=env, capture_output=True,
                text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, f"{command}:\n{done.stderr[-3000:]}"
        out = _run_example(_api_example(), server.url, tmp_path)
        with noisescope.Api(server.url) as api:
            sweep = api.critical_batch("noisescope-reproduction", "digits")
    assert out.returncode == 0, out.stderr
    assert sweep.targets and all(t.determined for t in sweep.targets), sweep.warnings
    # issue 56 item 2: the API answers at the targets the sweep printed and the pages show
    from experiments.tasks import TASKS

    assert [t.target for t in sweep.targets] == sorted(TASKS["digits"].loss_targets, reverse=True)
    _says_b_crit_and_a_plan(out.stdout, r"\S+")
    assert sum(line.startswith("loss ") for line in out.stdout.splitlines()) == len(sweep.targets)
    # a part of the study reports beside its cache, never over the checkout's docs/ page
    assert (tmp_path / "experiments" / "runs" / "full" / "report" / "reproduction.md").is_file()
    assert not (tmp_path / "docs").exists()
