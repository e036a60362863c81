"""The import graph of the whole repository has no cycle.

``tests/test_layout.py`` checks each package on its own; this builds one graph over every
first-party module (the products, their migrations, the tooling packages, the scripts and the
examples) and asserts that no set of modules imports itself round, across packages too (the
client's CLI importing the server's, which imported the client's back, was such a loop).

Every import counts, also those inside functions (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:``. An import names the module it loads: ``from pkg import x``
is an edge to the submodule ``pkg.x`` when there is one, else to ``pkg`` (its ``__init__``).
Loading ``pkg.x`` also runs ``pkg``'s ``__init__``, but that is no edge: a package's
``__init__`` re-exporting its submodules while they import their siblings is how packages are
built, not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layout import _cycles, _import_nodes

ROOT = Path(__file__).resolve().parent.parent

#: The products: import name -> source folder (pyproject.toml's package-dir).
PRODUCTS = {
    "noisescope": ROOT / "client" / "noisescope",
    "noisescope_server": ROOT / "server" / "noisescope_server",
    "noisescope_server.migrations": ROOT / "migrations",
    "noisescope_dashboard": ROOT / "dashboard" / "noisescope_dashboard",
}
#: Folders of scripts run as files (no package): their modules are named ``folder.file``.
SCRIPT_FOLDERS = ("scripts", "examples")
#: Not part of the graph: the test suite (nothing outside it imports it, tests/test_layout.py)
#: and what is no source of ours.
NOT_SCANNED = {"tests", "docs", "client", "server", "dashboard", "migrations"}


def _sources() -> dict[str, Path]:
    """Import name -> folder of every first-party package: the products, and every top-level
    folder holding an ``__init__.py`` (``experiments``, ``benchmarks``, ``reliability``, ...)."""
    found = dict(PRODUCTS)
    for folder in sorted(ROOT.iterdir()):
        if folder.name in NOT_SCANNED or folder.name.startswith("."):
            continue
        if (folder / "__init__.py").is_file() or folder.name in SCRIPT_FOLDERS:
            found[folder.name] = folder
    return found


SOURCES = _sources()


def _module_files() -> dict[str, Path]:
    """Module name -> file, over every first-party source folder."""
    modules: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        nested = [p for p in SOURCES.values() if p != folder and p.is_relative_to(folder)]
        for path in sorted(folder.rglob("*.py")):
            if any(path.is_relative_to(n) for n in nested):
                continue  # scanned under its own name (none today; kept for a nested package)
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _module_files()


def _targets(module: str, path: Path) -> set[str]:
    """The first-party modules ``module`` imports (every import but ``TYPE_CHECKING`` ones)."""
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: list[str] = []
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
            continue
        base = node.module or ""
        if node.level:
            base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
        names += [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the first-party modules it imports, over the whole repository."""
    return {module: _targets(module, path) for module, path in MODULES.items()}


def test_the_repository_import_graph_has_no_cycle() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles (each list imports itself round):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_graph_sees_every_package_and_the_edges_across_them() -> None:
    """Guards the check above against a scan that misses packages or imports."""
    tops = {m.split(".")[0] for m in MODULES}
    assert {
        "noisescope",
        "noisescope_server",
        "noisescope_dashboard",
        "experiments",
        "benchmarks",
        "reliability",
        "scripts",
    } <= tops, tops
    assert "noisescope_server.migrations.env" in MODULES
    graph = import_graph()
    # lazy imports count: noisescope.cli's subcommands are imported inside build_parser
    assert "noisescope._sync" in graph["noisescope.cli"]
    # across packages, and ``from pkg import submodule`` resolved to the submodule
    assert "noisescope.protocol" in graph["noisescope_server.queries._common"]
    assert "noisescope_server.queries._common" in graph["noisescope_server.queries._runs"]
    assert any(t.startswith("noisescope_server") for t in graph["noisescope_server.migrations.env"])
