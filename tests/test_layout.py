"""The import rules DEVELOPERS.md states for each package, checked on the source (AST), and no
import cycle among the modules of a package.

Every import counts, also those inside functions (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Import name -> source folder of every package DEVELOPERS.md describes.
PACKAGES = {
    "noisescope": ROOT / "client" / "noisescope",
    "noisescope_server": ROOT / "server" / "noisescope_server",
    "noisescope_dashboard": ROOT / "dashboard" / "noisescope_dashboard",
    "experiments": ROOT / "experiments",
    "benchmarks": ROOT / "benchmarks",
    "reliability": ROOT / "reliability",
    "harness": ROOT / "harness",
}
#: The two client sub-packages with their own rules (they need torch).
TORCH_PARTS = ("noisescope.torch", "noisescope.integrations")
#: Only the research and tooling packages may import these.
TOOLING = ("experiments", "benchmarks", "reliability", "harness", "tests")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the full name imported ("noisescope._wire", "torch.nn", ...)
    line: int


def _module_name(package: str, path: Path) -> str:
    parts = [package, *path.relative_to(PACKAGES[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for branch in node.orelse:
                yield from _import_nodes(ast.Module(body=[branch], type_ignores=[]))
        else:
            yield from _import_nodes(node)


def _imports(package: str) -> list[Import]:
    found = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        module = _module_name(package, path)
        # The package a relative import starts from: a package's own __init__ is that package.
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
                names = [f"{base}.{alias.name}" for alias in node.names]
            found += [Import(module, name, node.lineno) for name in names]
    return found


ALL_IMPORTS = {package: _imports(package) for package in PACKAGES}


def _top(name: str) -> str:
    return name.split(".")[0]


def _part(module: str) -> str:
    """``noisescope.torch`` / ``noisescope.integrations`` for their modules, else the package."""
    return next((p for p in TORCH_PARTS if module == p or module.startswith(p + ".")), _top(module))


def _third_party(imports: list[Import]) -> set[str]:
    return {
        _top(i.target)
        for i in imports
        if _top(i.target) not in sys.stdlib_module_names
        and _top(i.target) not in PACKAGES
        and _top(i.target) not in ("tests", "__future__")
    }


def _violations(
    package: str, part: str, forbidden: set[str], allowed_in: tuple[str, ...] = ()
) -> list[str]:
    return [
        f"{i.module}:{i.line} imports {i.target}"
        for i in ALL_IMPORTS[package]
        if _part(i.module) == part
        and (_top(i.target) in forbidden or _part(i.target) in forbidden)
        and i.module not in allowed_in
    ]


def test_the_client_core_needs_only_requests() -> None:
    """``noisescope`` (outside torch/ and integrations/) runs in any training job: no torch, no
    framework; the optional packages each in one module that works without them (pandas inside
    ``to_frame``, orjson in ``_json``); never the server: its subcommands reach ``noisescope.cli``
    through the entry point group ``noisescope.commands``."""
    core = [i for i in ALL_IMPORTS["noisescope"] if _part(i.module) == "noisescope"]
    optional = {"pandas": {"noisescope._results"}, "orjson": {"noisescope._json"}}
    assert _third_party(core) <= {"requests", *optional}, _third_party(core)
    for package, homes in optional.items():
        users = {i.module for i in core if _top(i.target) == package}
        assert users <= homes, (package, users)
    assert not _violations("noisescope", "noisescope", {*TORCH_PARTS, "noisescope_dashboard"})
    server_users = {i.module for i in core if _top(i.target) == "noisescope_server"}
    assert not server_users, server_users


def test_the_probes_do_not_import_the_integrations() -> None:
    """Torch only; DeepSpeed, optional, in the one module that reads its engines (imported
    there only for a model whose class comes from it)."""
    assert not _violations("noisescope", "noisescope.torch", {"noisescope.integrations"})
    probes = [i for i in ALL_IMPORTS["noisescope"] if _part(i.module) == "noisescope.torch"]
    assert _third_party(probes) <= {"torch", "deepspeed"}
    users = {i.module for i in probes if _top(i.target) == "deepspeed"}
    assert users <= {"noisescope.torch._deepspeed"}, users


def test_the_server_never_imports_torch_probes_or_the_dashboard() -> None:
    """No dashboard code at all: ``noisescope dashboard`` finds the dashboard's ``app.py`` as a
    file (``importlib.util.find_spec``, which runs none of it) for Streamlit to run."""
    forbidden = {"torch", *TORCH_PARTS, "noisescope_dashboard"}
    assert not _violations("noisescope_server", "noisescope_server", forbidden)
    users = {i.module for i in ALL_IMPORTS["noisescope_server"] if i.target == "importlib.util"}
    assert "noisescope_server.cli._processes" in users  # the scan sees where it looks the file up


def test_the_dashboard_reads_only_the_http_api() -> None:
    forbidden = {"noisescope_server", "sqlalchemy", "torch", *TORCH_PARTS}
    assert not _violations("noisescope_dashboard", "noisescope_dashboard", forbidden)


#: The bottom of the client (DEVELOPERS.md, "The contract at the bottom"): ``noisescope.protocol``
#: and every client module it imports, transitively. The wire format, the answer types, the
#: number format, the redaction rule and the sample rule (which computes the two-batch
#: estimates, so it brings the pure maths of ``estimators``); never the read client
#: (``_api``), ``sweep``, the run and its delivery path, the transports or the probes.
PROTOCOL_CLOSURE = {
    "noisescope.protocol",
    "noisescope._wire",
    "noisescope._results",
    "noisescope._format",
    "noisescope._redact",
    "noisescope._sample_rule",
    "noisescope._public",
    "noisescope.estimators",
}
#: What would make the contract heavy again, named so that a failure says what came in.
NEVER_UNDER_PROTOCOL = {
    "noisescope._api",
    "noisescope.sweep",
    "noisescope.recommend",
    "noisescope._run",
    "noisescope._delivery",
    "noisescope._spool",
    "noisescope._transport",
    "noisescope._records",
    "noisescope._config",
    "noisescope.cli",
    *TORCH_PARTS,
}


def _client_closure(start: str) -> set[str]:
    """``start`` and the client modules it imports, transitively (by the source), with the
    sub-packages they sit in (loading ``noisescope.estimators._two_batch`` runs
    ``noisescope.estimators``); the root ``noisescope`` itself aside."""
    edges: dict[str, set[str]] = {}
    for i in ALL_IMPORTS["noisescope"]:
        if _top(i.target) == "noisescope":
            edges.setdefault(i.module, set()).add(_client_module(i.target))
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module == "noisescope":
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:n]) for n in range(2, len(parts))]
        todo += sorted(edges.get(module, ()))
    return seen


def test_protocol_and_what_it_imports_import_nothing_else_of_the_client() -> None:
    """``noisescope.protocol``, imported by the server from about 23 files, is the bottom of the
    client: the modules it reaches are exactly ``PROTOCOL_CLOSURE`` (the estimators whole),
    and they need nothing beyond the standard library (pandas only inside ``to_frame``)."""
    closure = _client_closure("noisescope.protocol")
    estimators = {m for m in closure if m.startswith("noisescope.estimators.")}
    assert closure - estimators == PROTOCOL_CLOSURE, sorted(closure ^ PROTOCOL_CLOSURE)
    assert estimators, "the sample rule's two-batch estimates come from estimators"
    reached = {m for m in NEVER_UNDER_PROTOCOL for c in closure if c == m or c.startswith(m + ".")}
    assert not reached, reached
    imports = [i for i in ALL_IMPORTS["noisescope"] if i.module in closure]
    assert _third_party(imports) <= {"pandas"}, _third_party(imports)
    pandas_users = {i.module for i in imports if _top(i.target) == "pandas"}
    assert pandas_users <= {"noisescope._results"}, pandas_users


def test_loading_protocol_loads_only_its_closure() -> None:
    """The same, at run time: a fresh interpreter (no site-packages) loading
    ``noisescope.protocol`` from the source, the package's own ``__init__`` (the whole
    client's front) aside, holds exactly the modules the source scan above finds, and no
    third-party one."""
    import json
    import subprocess

    script = (
        "import json, sys, types\n"
        "root = types.ModuleType('noisescope')\n"
        f"root.__path__ = [{str(PACKAGES['noisescope'])!r}]\n"
        "sys.modules['noisescope'] = root\n"
        "import noisescope.protocol\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(done.stdout))
    client = {m for m in loaded if _top(m) == "noisescope"} - {"noisescope"}
    assert "noisescope._api" not in client and "noisescope.sweep" not in client, sorted(client)
    assert client == _client_closure("noisescope.protocol"), sorted(client)
    others = {_top(m) for m in loaded} - {*sys.stdlib_module_names, "__main__", "noisescope"}
    assert not others, others


def test_the_server_and_a_training_job_never_load_the_read_client() -> None:
    """The whole package as installed: ``import noisescope`` (a training job) and the server's
    app, API and CLI leave ``noisescope._api`` unloaded; ``noisescope.Api`` loads it on first
    use and shows its names as ``noisescope.X``."""
    import subprocess

    script = (
        "import sys\n"
        "import noisescope\n"
        "import noisescope_server.app, noisescope_server.api, noisescope_server.cli\n"
        "assert 'noisescope._api' not in sys.modules, 'loaded'\n"
        "from noisescope._api import NotFoundError\n"
        "assert noisescope.Api.__module__ == 'noisescope'\n"
        "assert NotFoundError.__module__ == 'noisescope', NotFoundError.__module__\n"
        "assert {'Api', 'ApiError'} <= set(dir(noisescope))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


#: The client modules each product may import (DEVELOPERS.md, Packages): the public contract
#: (``noisescope.protocol``: wire format, sample fields, run body, event kinds, answer types)
#: and the public maths; never a private module, never a name starting with ``_``.
CLIENT_ALLOWED = {
    "noisescope_server": {
        "noisescope.protocol",
        "noisescope.estimators",
        "noisescope.sweep",
        "noisescope.recommend",
        "noisescope.forecast",
        "noisescope.cli",
    },
    "noisescope_dashboard": {
        "noisescope",
        "noisescope.protocol",
        "noisescope.estimators",
        "noisescope.sweep",
        "noisescope.forecast",
        # the Run page's verdict on the run it read (issue 56 item 4: one read per render)
        "noisescope.recommend",
    },
}
CLIENT_MODULES = {_module_name("noisescope", p) for p in PACKAGES["noisescope"].rglob("*.py")}


def _client_module(target: str) -> str:
    """The client module an import target names or takes a name from."""
    while target not in CLIENT_MODULES:
        target = target.rpartition(".")[0]
    return target


@pytest.mark.parametrize("package", sorted(CLIENT_ALLOWED))
def test_the_server_and_dashboard_import_only_the_public_client(package: str) -> None:
    """``noisescope_server`` and ``noisescope_dashboard`` use the client through its public
    modules (the allow-list) and never a name starting with ``_``."""
    bad = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in ALL_IMPORTS[package]
        if _top(i.target) == "noisescope"
        and (
            _client_module(i.target) not in CLIENT_ALLOWED[package]
            or any(part.startswith("_") for part in i.target.split("."))
        )
    ]
    assert not bad
    used = {
        _client_module(i.target) for i in ALL_IMPORTS[package] if _top(i.target) == "noisescope"
    }
    assert "noisescope.protocol" in used, used  # the check sees the imports it rules on


@pytest.mark.parametrize("package", ["noisescope", "noisescope_server", "noisescope_dashboard"])
def test_products_never_import_the_tooling(package: str) -> None:
    bad = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in ALL_IMPORTS[package]
        if _top(i.target) in TOOLING
    ]
    assert not bad


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_within_a_package(package: str) -> None:
    modules = {_module_name(package, p) for p in PACKAGES[package].rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in ALL_IMPORTS[package]:
        target = resolve(i.target)
        # A module importing its own package's __init__ is how submodules reach siblings
        # (``from noisescope import _wire``): that edge goes to the sibling, resolved above.
        if target is not None and target != i.module:
            graph[i.module].add(target)

    cycles = _cycles(graph)
    assert not cycles, f"import cycles in {package}: {cycles}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_scan_sees_the_imports_it_checks() -> None:
    """Guards the checks above against a scanner that finds nothing."""
    targets = {(i.module, i.target) for i in ALL_IMPORTS["noisescope"]}
    assert ("noisescope.protocol", "noisescope._wire.API_PREFIX") in targets
    assert any(m.startswith("noisescope.torch.") and t == "torch" for m, t in targets)
    assert any(_top(i.target) == "noisescope" for i in ALL_IMPORTS["noisescope_dashboard"])
    graph_probe = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph_probe) == [["a", "b"]]


def test_mypy_checks_every_python_file() -> None:
    """``mypy --strict`` (pyproject.toml's ``files``) reaches every Python file git tracks:
    a new folder of code is type-checked from its first commit."""
    import subprocess

    import tomllib

    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked
    unchecked = [f for f in tracked if not any(f.startswith(f"{d}/") for d in folders)]
    assert not unchecked, f"add their folders to [tool.mypy] files: {unchecked}"


def test_developers_md_layout_names_every_module() -> None:
    """Each top-level module and sub-package of the three products is in DEVELOPERS.md's layout."""
    text = (ROOT / "DEVELOPERS.md").read_text()
    layout = text[text.index("## Layout") : text.index("## Packages")]
    missing = []
    for package in ("noisescope", "noisescope_server", "noisescope_dashboard"):
        for path in sorted(PACKAGES[package].iterdir()):
            if path.suffix == ".py" and path.name != "__init__.py":
                named = re.search(rf"(?<![\w.]){re.escape(path.stem)}(\.py)?\b", layout)
            elif (path / "__init__.py").is_file():
                named = re.search(rf"(?<![\w/]){re.escape(path.name)}/", layout)
            else:
                continue
            if not named:
                missing.append(f"{package}/{path.name}")
    assert not missing, f"not in DEVELOPERS.md's layout: {missing}"


#: The server's modules that assemble answers from what ``queries`` reads (issue 49).
ASSEMBLERS = ("noisescope_server.sweeps", "noisescope_server.branches")


def test_the_server_reads_the_database_for_answers_only_in_queries() -> None:
    """``sweeps`` and ``branches`` assemble answers from what ``queries`` reads: they build no
    statement (no ``select``, no table of ``models``), and no server module outside
    ``queries`` reaches into one of its private modules (``queries._common``, ...)."""
    found = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in ALL_IMPORTS["noisescope_server"]
        if (
            i.module in ASSEMBLERS
            and (
                (_top(i.target) == "sqlalchemy" and i.target != "sqlalchemy.Engine")
                or i.target.startswith("noisescope_server.models")
            )
        )
        or (
            i.target.startswith("noisescope_server.queries._")
            and not i.module.startswith("noisescope_server.queries")
        )
    ]
    assert not found, found
    readers = {i.target for i in ALL_IMPORTS["noisescope_server"] if i.module in ASSEMBLERS}
    assert "noisescope_server.queries.read_task_sweep" in readers  # the scan sees them
    assert "noisescope_server.queries.read_run_branches" in readers


#: The read side of the server: it fetches sums and hands them to ``noisescope.estimators``.
READ_SIDE = [
    *sorted((PACKAGES["noisescope_server"] / "queries").glob("*.py")),
    PACKAGES["noisescope_server"] / "sweeps.py",
    PACKAGES["noisescope_server"] / "branches.py",
]
#: What a window, smoother, fit or interval of its own would be called.
MATHS_NAME = re.compile(
    r"smooth|prefix|running|window|interval|jackknife|fieller|reblock|moment|fit"
)
#: The read side's functions named so that only hand the sums over, each to its policy.
HAND_OVERS = {"smooth_series": "trailing_windows"}
#: The estimators' parts, reached from the read side only through the named policies that use
#: them (``bucket_noise_scales``, ``trailing_windows``, ``training_loss_curve``, ...).
ESTIMATOR_PARTS = {
    "b_simple_and_reason",
    "b_simple_interval",
    "block_moments",
    "fieller",
    "interval_from_blocks",
    "reblock",
    "smooth_training_loss",
    "student_t_quantile",
}


def test_the_read_side_leaves_windows_smoothers_and_intervals_to_estimators() -> None:
    """Issue 34: ``estimators`` owns every window, smoother and fit; ``queries`` (and the
    sweep and branch reads) only fetch and hand the sums over. A function of theirs named like
    one is a hand-over that calls its policy; none imports ``bisect`` or ``accumulate`` (a
    window's running sums) or calls the parts the policies are built from."""
    found = []
    for path in READ_SIDE:
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and MATHS_NAME.search(node.name):
                called = {
                    n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                    for n in ast.walk(node)
                    if isinstance(n, ast.Call)
                }
                if HAND_OVERS.get(node.name) not in called:
                    found.append(f"{where}:{node.lineno} defines {node.name}")
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = {a.name for a in node.names} | {getattr(node, "module", None) or ""}
                for bad in sorted(names & ({"bisect", "accumulate"} | ESTIMATOR_PARTS)):
                    found.append(f"{where}:{node.lineno} imports {bad}")
            elif isinstance(node, ast.Attribute) and node.attr in ESTIMATOR_PARTS:
                found.append(f"{where}:{node.lineno} uses {node.attr}")
    assert not found, found
    assert len(READ_SIDE) >= 10 and any(p.name == "_series.py" for p in READ_SIDE)


def _imports_tests(path: Path) -> list[int]:
    """The lines of ``path`` that import ``tests`` or a module of it (every import)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(_top(name) == "tests" for name in names):
            lines.append(node.lineno)
    return lines


def test_nothing_outside_tests_imports_tests() -> None:
    """The tooling (benchmarks, reliability, experiments, scripts) and the products share the
    test harness through ``harness``, never through ``tests``: the test suite may change its
    helpers without breaking a benchmark or a reproduction."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    outside = [ROOT / f for f in listed if not f.startswith("tests/") and (ROOT / f).is_file()]
    assert any(p.parent.name == "benchmarks" for p in outside)  # the scan sees the tooling
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(outside) for line in _imports_tests(p)]
    assert not found, found
