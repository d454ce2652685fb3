"""The four packages as installed: one version (the repository's VERSION file) in each one's
metadata and ``__version__``, the siblings pinned to exactly that megafmt, and a ``py.typed``
marker shipped in every wheel. And as released: an sdist carries everything its wheel's build
reads."""

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERSION = (ROOT / "VERSION").read_text().strip()
PACKAGES = ["megafmt", "megaindex", "megaload", "megadist"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_carries_the_one_version(name):
    assert importlib.metadata.version(name) == VERSION
    assert importlib.import_module(name).__version__ == VERSION


@pytest.mark.parametrize("name", ["megaindex", "megaload", "megadist"])
def test_siblings_pin_megafmt_to_the_one_version(name):
    pins = [
        requirement
        for requirement in importlib.metadata.requires(name)
        if re.split(r"[\s=<>!~;\[]", requirement, maxsplit=1)[0] == "megafmt"
    ]
    assert pins == [f"megafmt=={VERSION}"]


@pytest.mark.parametrize("name", PACKAGES)
def test_the_installed_package_is_marked_typed(name):
    package = Path(importlib.import_module(name).__file__).parent
    assert not package.is_relative_to(ROOT / "packages")  # the wheel's copy, not the sources
    assert (package / "py.typed").is_file()


@pytest.mark.parametrize("name", PACKAGES)
def test_building_a_package_writes_nothing_into_its_source_folder(name):
    # scikit-build-core builds in a temporary folder unless the project names one; the
    # checkout's own builds keep theirs under build/ (tools/venvs.py sets SKBUILD_BUILD_DIR)
    project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
    assert "build-dir" not in project.get("tool", {}).get("scikit-build", {})


def shared_build_inputs() -> tuple[Path, ...]:
    """tools/venvs.py's SHARED_BUILD_INPUTS: what a change of rebuilds every package."""
    spec = importlib.util.spec_from_file_location("venvs", ROOT / "tools" / "venvs.py")
    venvs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(venvs)
    return venvs.SHARED_BUILD_INPUTS


@pytest.mark.parametrize("name", PACKAGES)
def test_every_link_in_a_package_folder_is_a_file_in_its_sdist(name):
    # a package reads the root's VERSION and build hook through links in its folder; its sdist
    # must hold the files linked to (a link would dangle once unpacked), and tools/venvs.py must
    # rebuild the package when one changes
    folder = ROOT / "packages" / name
    links = {path.name: path.resolve() for path in folder.iterdir() if path.is_symlink()}
    assert "VERSION" in links
    shared = shared_build_inputs()
    for target in links.values():
        assert any(target.is_relative_to(path.resolve()) for path in shared), target
    tool = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]
    if "scikit-build" in tool:
        assert tool["scikit-build"]["sdist"]["resolve-symlinks"] in ("all", "external")
    else:
        sdist = tool["hatch"].get("build", {}).get("targets", {}).get("sdist", {})
        forced = sdist.get("force-include", {})
        assert {link: (folder / source).resolve() for source, link in forced.items()} == links


def build(*arguments: str | Path) -> None:
    """``python -m build --no-isolation ARGUMENTS`` with this venv's hatchling."""
    command = [sys.executable, "-m", "build", "--no-isolation", *map(str, arguments)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wheel_builds_from_the_unpacked_sdist_alone(tmp_path):
    # megaload's sdist (hatchling, a few seconds), unpacked where no repository file is near:
    # its pyproject.toml reaching for ../../VERSION or ../../tools/build again fails this
    build("--sdist", "--outdir", tmp_path / "dist", ROOT / "packages" / "megaload")
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        assert not [member.name for member in archive if member.issym()]
        archive.extractall(tmp_path / "unpacked", filter="data")
    (source,) = (tmp_path / "unpacked").iterdir()
    build("--wheel", "--outdir", tmp_path / "wheel", source)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"megaload-{VERSION}.dist-info/METADATA").decode().splitlines()
    assert f"Version: {VERSION}" in metadata
    assert f"Requires-Dist: megafmt=={VERSION}" in metadata
