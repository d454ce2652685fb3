"""One error base per package: every exception class a package defines derives from it. An
interrupt is no error (megafmt's ``Terminated``, a ``KeyboardInterrupt`` that SIGTERM raises in a
``mega`` command): deriving from the base would make ``except Exception`` swallow it."""

import importlib
import inspect
import pkgutil

import pytest

BASES = {
    "megafmt": "megafmt.errors:MegafmtError",
    "megaindex": "megaindex.errors:MegaindexError",
    "megaload": "megaload:MegaloadError",
    "megadist": "megadist.errors:MegadistError",
}


def defined_exceptions(package_name):
    package = importlib.import_module(package_name)
    for info in pkgutil.walk_packages(package.__path__, package_name + "."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                yield obj


@pytest.mark.parametrize("package_name", sorted(BASES))
def test_every_error_derives_from_its_package_base(package_name):
    module_name, _, name = BASES[package_name].partition(":")
    base = getattr(importlib.import_module(module_name), name)
    found = list(defined_exceptions(package_name))
    assert base in found  # the walk reached the base's own module
    strays = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in found
        if issubclass(cls, Exception) and not issubclass(cls, base)
    ]
    assert strays == []
