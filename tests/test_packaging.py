"""The distributions ship every module and leak no generic top-level names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
            str(ROOT / "client"),
        ],
        check=True,
    )
    found = {}
    for whl in out.glob("*.whl"):
        name = whl.name.split("-")[0]
        found[name] = zipfile.ZipFile(whl)
    assert set(found) == {"noisescope", "noisescope_server"}
    return found


def _sources(root: Path, package: str) -> set[str]:
    return {
        f"{package}/{p.relative_to(root).as_posix()}"
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts
    }


@pytest.mark.parametrize(
    ("wheel", "src", "package"),
    [
        ("noisescope", "client/noisescope", "noisescope"),
        ("noisescope_server", "server/noisescope_server", "noisescope_server"),
        ("noisescope_server", "migrations", "noisescope_server/migrations"),
        ("noisescope_server", "dashboard/noisescope_dashboard", "noisescope_dashboard"),
    ],
)
def test_wheel_ships_every_module(
    wheels: dict[str, zipfile.ZipFile], wheel: str, src: str, package: str
) -> None:
    shipped = set(wheels[wheel].namelist())
    missing = _sources(ROOT / src, package) - shipped
    assert not missing, f"not in the {wheel} wheel (add the package to pyproject.toml): {missing}"


def test_no_generic_top_level_names(wheels: dict[str, zipfile.ZipFile]) -> None:
    tops = {
        name.split("/")[0]
        for zf in wheels.values()
        for name in zf.namelist()
        if not name.split("/")[0].endswith((".dist-info", ".data"))
    }
    assert tops == {"noisescope", "noisescope_server", "noisescope_dashboard"}


def test_client_depends_on_requests_only(wheels: dict[str, zipfile.ZipFile]) -> None:
    zf = wheels["noisescope"]
    meta_name = next(n for n in zf.namelist() if n.endswith("dist-info/METADATA"))
    meta = Parser().parsestr(zf.read(meta_name).decode())
    hard = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert [r.split(">")[0].split("=")[0].strip() for r in hard] == ["requests"]
