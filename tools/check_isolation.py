"""Check that a per-package venv holds no torch unless the package asks for it.

Run with the venv's own python: ``.venvs/NAME/bin/python tools/check_isolation.py NAME``.
megafmt promises a torch-free install; a dependency that drags torch in fails here.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

PACKAGES = Path(__file__).resolve().parent.parent / "packages"


def declares_torch(package: str, seen: set[str]) -> bool:
    seen.add(package)
    with open(PACKAGES / package / "pyproject.toml", "rb") as stream:
        project = tomllib.load(stream)["project"]
    requirements = project.get("dependencies", []) + [
        r for extra in project.get("optional-dependencies", {}).values() for r in extra
    ]
    for requirement in requirements:
        name = requirement.split("[")[0].split(";")[0].strip().split(" ")[0]
        name = name.split("=")[0].split("<")[0].split(">")[0].split("~")[0].split("!")[0]
        if name == "torch":
            return True
        if (PACKAGES / name).is_dir() and name not in seen and declares_torch(name, seen):
            return True
    return False


def main() -> None:
    package = sys.argv[1]
    if not declares_torch(package, set()) and importlib.util.find_spec("torch") is not None:
        sys.exit(f"{package} does not depend on torch, yet torch is installed in its venv")
    print(f"{package}: venv isolation ok")


if __name__ == "__main__":
    main()
