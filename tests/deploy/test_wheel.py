"""A built wheel holds one import package, `webhook_ingest`, and exactly the
files of the folders it maps (package-dir in pyproject.toml): every module
and every data file — SQL, TOML, Lua, templates, static files. A data file
missing from `[tool.setuptools.package-data]` fails here, not in production.
Builds from a copy of the tree, so the working tree gets no build/ folder."""

import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.support.repository import ROOT, repository_files

# The installed name of each top-level folder (the package-dir mapping).
INSTALLED_AS = {
    "webhook_ingest": "webhook_ingest",
    "ingress": "webhook_ingest/ingress",
    "workers": "webhook_ingest/workers",
    "shared": "webhook_ingest/shared",
}


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[zipfile.ZipFile, str]:
    """The wheel, and what its build printed (`--quiet`, as `make install`)."""
    source = tmp_path_factory.mktemp("source")
    for path in repository_files():
        target = source / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    out = tmp_path_factory.mktemp("wheel")
    built_by = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
        timeout=170,
    )
    [built] = out.glob("webhook_ingest-*.whl")
    return zipfile.ZipFile(built), built_by.stdout + built_by.stderr


@pytest.fixture(scope="module")
def wheel(build) -> zipfile.ZipFile:
    return build[0]


def test_the_build_prints_nothing(build):
    assert build[1] == ""


def expected_files() -> set[str]:
    """What the package folders hold, by installed path, tests and caches aside."""
    expected = set()
    for path in repository_files():
        parts = path.relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] in INSTALLED_AS:
            expected.add("/".join((INSTALLED_AS[parts[0]], *parts[1:])))
    return expected


def test_the_wheel_installs_one_top_level_name(wheel: zipfile.ZipFile):
    names = wheel.namelist()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"webhook_ingest"}
    [listed] = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert wheel.read(listed).decode().split() == ["webhook_ingest"]


def test_the_wheel_holds_every_module_and_data_file(wheel: zipfile.ZipFile):
    packaged = {name for name in wheel.namelist() if ".dist-info/" not in name}
    expected = expected_files()
    assert {name for name in expected if name.endswith((".sql", ".toml", ".lua"))}, "no data files found"
    assert packaged == expected, {"missing": sorted(expected - packaged), "unexpected": sorted(packaged - expected)}


def test_the_wheel_has_the_console_script(wheel: zipfile.ZipFile):
    [entry_points] = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    assert "webhook-ingest = webhook_ingest.cli.main:main" in wheel.read(entry_points).decode()
