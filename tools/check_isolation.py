"""Check that a per-package venv holds no torch unless the package asks for it.

Run with the venv's own python: ``.venvs/NAME/bin/python tools/check_isolation.py NAME``.
megafmt promises a torch-free install; a dependency that drags torch in fails here.
"""

from __future__ import annotations

import importlib.util
import sys

from venvs import local_dependencies, metadata, requirement_name


def declares_torch(package: str) -> bool:
    """Whether ``package``, its extras or the sibling packages it needs ask for torch."""
    for name in [*local_dependencies(package), package]:
        project = metadata(name)
        requirements = project.get("dependencies", []) + [
            r for extra in project.get("optional-dependencies", {}).values() for r in extra
        ]
        if any(requirement_name(r) == "torch" for r in requirements):
            return True
    return False


def main() -> None:
    package = sys.argv[1]
    if not declares_torch(package) and importlib.util.find_spec("torch") is not None:
        sys.exit(f"{package} does not depend on torch, yet torch is installed in its venv")
    print(f"{package}: venv isolation ok")


if __name__ == "__main__":
    main()
