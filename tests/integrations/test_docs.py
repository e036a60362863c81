"""The complete scripts in docs/integrations.md run as written, reach a real server and end
with a number on the run's page (the current B_simple)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess
from noisescope.estimators import CURRENT_MIN_SAMPLES
from noisescope_server.models import WHOLE_MODEL
from tests.support.database import query

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"


def _scripts() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    scripts = {}
    for block in blocks:
        if "HuggingFaceCallback(" in block:
            scripts["transformers"] = block
        elif "LightningCallback(" in block:
            scripts["lightning"] = block
    return scripts


def test_the_doc_has_both_complete_scripts() -> None:
    assert set(_scripts()) == {"transformers", "lightning"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "task", "b_small", "b_big"),
    [("transformers", "gpt2-bytes", 504, 2016), ("lightning", "digits-mlp", 16, 64)],
)
def test_doc_script_runs_and_reaches_the_server(
    server: ServerProcess,
    tmp_path: Path,
    framework: str,
    task: str,
    b_small: float,
    b_big: float,
) -> None:
    script = tmp_path / "example.py"
    script.write_text(_scripts()[framework])
    env = {
        **os.environ,
        "NOISESCOPE_URL": server.url,
        "NOISESCOPE_DIR": str(tmp_path / "spool"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the doc's own project: other tests of this session's server log the same task names
    rows = query(
        server.database_url,
        "SELECT s.b_small, s.b_big, s.g_small_sq, s.g_big_sq FROM sample s "
        "JOIN run r ON r.id = s.run_id JOIN task t ON t.id = r.task_id "
        "JOIN project p ON p.id = r.project_id "
        "WHERE p.name = 'docs' AND t.name = :task AND s.series_id = :whole",
        task=task,
        whole=WHOLE_MODEL,
    )
    assert len(rows) >= 20
    assert {(r.b_small, r.b_big) for r in rows} == {(b_small, b_big)}
    assert all(r.g_small_sq > 0 and r.g_big_sq > 0 for r in rows)
    with noisescope.Api(server.url) as api:
        (run,) = api.runs(project="docs", task=task)
    assert run.n_samples >= CURRENT_MIN_SAMPLES
    assert run.b_simple is not None, run.b_simple_reason  # what the Runs table shows


@pytest.mark.parametrize("name", ["HuggingFaceCallback", "LightningCallback"])
def test_the_documented_arguments_are_the_callbacks(name: str) -> None:
    import inspect

    import noisescope.integrations as integrations

    shown = re.search(rf"Arguments of `{name}\(([^`]*)\)`", DOC.read_text())
    assert shown is not None, name
    written = [p.strip().split("=")[0].lstrip("*") for p in shown.group(1).split(",")]
    actual = [p.name for p in inspect.signature(getattr(integrations, name)).parameters.values()]
    assert [p for p in written if p] == actual


@pytest.mark.parametrize("name", ["HuggingFaceCallback", "LightningCallback"])
def test_tools_that_read_the_callbacks_hints_resolve_them(name: str) -> None:
    """LightningCLI (jsonargparse) and the like read ``__init__``'s hints at run time, the
    keys of ``**options`` included: none may be a name only a type checker imports."""
    import typing

    import noisescope.integrations as integrations

    hints = typing.get_type_hints(getattr(integrations, name).__init__, include_extras=True)
    (unpacked,) = typing.get_args(hints["options"])
    assert unpacked is integrations.CallbackOptions
    assert set(typing.get_type_hints(unpacked)) == integrations.CallbackOptions.__optional_keys__


def test_the_branching_example_runs_and_branches(tmp_path: Path) -> None:
    """docs/branching.md's callback example: two branch points, each with a measurement."""
    blocks = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs" / "branching.md").read_text(), flags=re.DOTALL
    )
    (block,) = [b for b in blocks if "branch=BranchOptions(" in b]
    script = tmp_path / "example.py"
    script.write_text(block)
    env = {**os.environ, "NOISESCOPE_DIR": str(tmp_path / "spool"), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    assert [line[0] for line in lines] == ["40", "80"]
    assert all(line[2] != "None" for line in lines)  # b_crit_lo: an interval (2 seeds) or bound
