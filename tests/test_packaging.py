"""The four packages as installed: one version (the repository's VERSION file) in each one's
metadata and ``__version__``, the siblings pinned to exactly that megafmt, and a ``py.typed``
marker shipped in every wheel."""

import importlib
import importlib.metadata
import re
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
    import tomllib

    project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
    assert "build-dir" not in project.get("tool", {}).get("scikit-build", {})
