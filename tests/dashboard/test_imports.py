"""The dashboard is a client of the HTTP API: no module of it imports the server package or
SQLAlchemy, or opens a database. Checked twice: statically (every file's import statements)
and dynamically (every page run in a fresh interpreter, then ``sys.modules``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dashboard" / "noisescope_dashboard"
FORBIDDEN = ("noisescope_server", "sqlalchemy", "sqlite3", "psycopg")


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names


def test_no_dashboard_file_imports_the_server_or_a_database() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) >= 10
    for path in files:
        bad = {n for n in _imported(path) if n.split(".")[0] in FORBIDDEN}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


_PROBE = """
import json, os, sys
from pathlib import Path
from streamlit.testing.v1 import AppTest
import noisescope_dashboard
from noisescope_dashboard import _charts, _compare, _data, _frames, _state, _text, _ui
views = Path(noisescope_dashboard.__file__).with_name("views")
errors = []
for page in sorted(views.glob("*.py")):
    if page.name == "__init__.py":
        continue
    at = AppTest.from_file(str(page), default_timeout=120).run()
    errors += [f"{page.name}: {e.message}" for e in at.exception]
app = AppTest.from_file(str(views.parent / "app.py"), default_timeout=120).run()
errors += [e.message for e in app.exception]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print(json.dumps({"loaded": loaded, "errors": errors}))
"""


def test_running_every_page_loads_neither_the_server_nor_sqlalchemy(server: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "NOISESCOPE_URL": server, "HOME": str(Path.home())}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("FORBIDDEN", repr(set(FORBIDDEN)))],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["errors"] == []
    assert answer["loaded"] == []
