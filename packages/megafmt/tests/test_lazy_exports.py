"""A package's exports imported on first use (megafmt.lazy_exports): resolved from the imports
under ``if TYPE_CHECKING:``, kept once resolved, and refused when they disagree with
``__all__``."""

import importlib
import sys

import pytest


def write_package(root, init: str) -> str:
    package = root / "lazypkg"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    (package / "heavy.py").write_text("LOADED = True\nclass Thing:\n    pass\n")
    return "lazypkg"


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n == "lazypkg" or n.startswith("lazypkg.")]:
        del sys.modules[name]


GOOD = (
    "from typing import TYPE_CHECKING\n"
    "from megafmt.lazy_exports import lazy_exports\n"
    "if TYPE_CHECKING:\n"
    "    from lazypkg.heavy import Thing\n"
    "    from lazypkg.heavy import LOADED as loaded\n"
    "__all__ = ['Thing', '__version__', 'loaded']\n"
    "__version__ = '1'\n"
    "__getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)\n"
)


def test_a_name_is_imported_when_first_used_and_kept(on_path):
    name = write_package(on_path, GOOD)
    package = importlib.import_module(name)
    assert "lazypkg.heavy" not in sys.modules
    assert "Thing" in dir(package)
    thing = package.Thing
    assert "lazypkg.heavy" in sys.modules and thing.__module__ == "lazypkg.heavy"
    assert vars(package)["Thing"] is thing and package.loaded is True
    from lazypkg import Thing  # noqa: F401  (the from-import form goes the same way)


def test_an_unknown_name_is_an_attribute_error_naming_it(on_path):
    package = importlib.import_module(write_package(on_path, GOOD))
    with pytest.raises(AttributeError, match="'lazypkg' has no attribute 'Other'"):
        package.Other  # noqa: B018


def test_all_and_the_imports_must_agree(on_path):
    init = GOOD.replace("['Thing', '__version__', 'loaded']", "['Thing', 'Missing', '__version__']")
    write_package(on_path, init)
    with pytest.raises(
        ImportError, match=r"only in __all__: \['Missing'\], only imported: \['loaded'\]"
    ):
        importlib.import_module("lazypkg")


def test_only_absolute_from_imports_are_taken(on_path):
    write_package(
        on_path, GOOD.replace("from lazypkg.heavy import Thing", "from .heavy import Thing")
    )
    with pytest.raises(ImportError, match="line 4: expected only absolute"):
        importlib.import_module("lazypkg")
