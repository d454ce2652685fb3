"""A package's public names, imported when first used (PEP 562 module ``__getattr__``).

megaindex, megaload and megadist export classes whose modules import torch, which takes seconds;
``mega --help`` and ``mega --version`` only need a command's help line. So those packages import
nothing when they are imported: each lists its exports once, as imports under
``if TYPE_CHECKING:`` in its ``__init__.py`` (what type checkers, editors and the API reference
read), and ``lazy_exports`` reads that block from the source and imports a name's module when the
name is first asked for (``from megaindex import GPTDataset`` works as before)::

    if TYPE_CHECKING:
        from megaindex.gpt_dataset import GPTDataset

    __all__ = ["GPTDataset"]
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: names a package defines itself rather than re-exports (``__version__``)
OWN_NAMES = frozenset({"__version__"})


def _type_checking_imports(init_file: str) -> dict[str, tuple[str, str]]:
    """``{exported name: (module, attribute)}`` from the ``if TYPE_CHECKING:`` block of
    ``init_file``."""
    with open(init_file, encoding="utf-8") as stream:
        tree = ast.parse(stream.read(), init_file)
    exports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom) or statement.level or not statement.module:
                raise ImportError(
                    f"{init_file}, line {statement.lineno}: expected only absolute "
                    f"'from MODULE import NAME' statements under 'if TYPE_CHECKING:', found "
                    f"{ast.unparse(statement)!r}"
                )
            for alias in statement.names:
                exports[alias.asname or alias.name] = (statement.module, alias.name)
    return exports


def lazy_exports(
    package: str, init_file: str, public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose ``__init__.py`` is
    ``init_file``: each name of ``public`` (its ``__all__``) is imported from the module its
    ``TYPE_CHECKING`` import names, once, then kept in the package's namespace. A name of
    ``__all__`` that no such import provides (or the reverse) is an ``ImportError`` here, when
    the package is imported, not when the name is first used."""
    exports = _type_checking_imports(init_file)
    declared = set(public) - OWN_NAMES
    if declared != set(exports):
        raise ImportError(
            f"{init_file}: __all__ and the imports under 'if TYPE_CHECKING:' must name the same "
            f"exports; only in __all__: {sorted(declared - set(exports))}, only imported: "
            f"{sorted(set(exports) - declared)}"
        )

    def __getattr__(name: str) -> Any:
        try:
            module, attribute = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
