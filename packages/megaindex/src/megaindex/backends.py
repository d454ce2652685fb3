"""Which implementation of the index builders runs: the C++ extension or the numpy fallback.

``MEGAINDEX_BACKEND`` chooses: ``auto`` (the default: C++ when the extension was built, else
numpy with a one-time warning), ``cpp`` (the extension or an error) or ``numpy``. Both produce
identical arrays; the fallback exists for platforms where the extension could not be built and
is much slower on large inputs. Nothing is ever compiled at run time.
"""

from __future__ import annotations

import importlib
import os
import warnings
from functools import cache
from types import ModuleType

from megaindex.errors import MegaindexError

BACKEND_ENV = "MEGAINDEX_BACKEND"
CHOICES = ("auto", "cpp", "numpy")


class BackendError(MegaindexError, ImportError):
    """The backend asked for in MEGAINDEX_BACKEND is not available."""


@cache
def implementation() -> ModuleType:
    """The module that holds the builders: ``megaindex._ext`` or ``megaindex._numpy_backend``."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise BackendError(f"{BACKEND_ENV}={choice!r}; expected one of {', '.join(CHOICES)}")
    if choice != "numpy":
        try:
            return importlib.import_module("megaindex._ext")
        except ImportError as error:
            if choice == "cpp":
                raise BackendError(
                    f"{BACKEND_ENV}=cpp but the C++ extension megaindex._ext cannot be imported "
                    f"({error}); reinstall megaindex with a C++17 compiler available"
                ) from error
            warnings.warn(
                f"megaindex: the C++ extension is not available ({error}); using the numpy "
                f"fallback, which gives the same arrays but builds large indices much slower",
                RuntimeWarning,
                stacklevel=2,
            )
    return importlib.import_module("megaindex._numpy_backend")


def backend() -> str:
    """``"cpp"`` or ``"numpy"``: the implementation in use."""
    return "cpp" if implementation().__name__ == "megaindex._ext" else "numpy"
