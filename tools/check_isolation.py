"""Check that a per-package venv holds no torch unless the package asks for it.

Run with the venv's own python: ``.venvs/NAME/bin/python tools/check_isolation.py NAME``.
megafmt promises a torch-free install; a dependency that drags torch in fails here.
"""

from __future__ import annotations

import importlib.util
import sys

from venvs import local_dependencies, needs_torch


def main() -> None:
    package = sys.argv[1]
    if (
        not needs_torch([*local_dependencies(package), package], extras=True)
        and importlib.util.find_spec("torch") is not None
    ):
        sys.exit(f"{package} does not depend on torch, yet torch is installed in its venv")
    print(f"{package}: venv isolation ok")


if __name__ == "__main__":
    main()
