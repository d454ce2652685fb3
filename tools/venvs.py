"""Create or refresh the project's virtual environments (stdlib only; run with any python3).

    python3 tools/venvs.py full
        .venv: torch (CPU), every package, the test tools and megatron-core
    python3 tools/venvs.py package NAME
        .venvs/NAME: only that package, the siblings it depends on, its own dependencies and
        its [test] extra

torch is installed first and pinned by requirements/constraints.txt, so pip takes the CPU build on
this machine instead of downloading a CUDA one. Packages are installed as wheels, not in editable
mode, so a file missing from a package's build shows up as a failing test. A package is
reinstalled only when its sources or the build inputs all packages share (the VERSION file, the
build hooks) changed (a hash is kept in the venv). Each package is built once per source hash into
build/wheels/, and every venv installs that wheel: the package venvs do not build it again, and
venvs refreshed at the same time (``make -j``) take turns building it.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
TEST_REQUIREMENTS = ROOT / "requirements" / "test.txt"
SOURCE_PARTS = ("pyproject.toml", "CMakeLists.txt", "README.md", "src", "csrc")
#: what every package's build reads from outside its own folder, through the links there
#: (VERSION, pinned_dependencies.py; each sdist carries copies): the one version, the build hooks
SHARED_BUILD_INPUTS = (ROOT / "VERSION", ROOT / "tools" / "build")


#: each package's wheel, built once per source hash: build/wheels/NAME/HASH/*.whl
WHEELS = ROOT / "build" / "wheels"
#: where scikit-build-core keeps megaindex's CMake tree between builds of this checkout (an
#: ignored folder at the root: a plain ``pip install ./packages/megaindex`` builds in a
#: temporary folder and writes nothing into the source tree)
BUILD_TREES = ROOT / "build" / "skbuild" / "{wheel_tag}"


def run(*command: str | Path) -> None:
    print("+", " ".join(str(part) for part in command), flush=True)
    environment = {**os.environ, "SKBUILD_BUILD_DIR": str(BUILD_TREES)}
    subprocess.run([str(part) for part in command], check=True, env=environment)


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pyproject(package: str) -> dict:
    with open(PACKAGES / package / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)


def metadata(package: str) -> dict:
    return pyproject(package)["project"]


def declared_dependencies(package: str) -> list[str]:
    """The requirements ``package`` declares: its ``project.dependencies``, or, where the build
    pins siblings to the one version, the templates its build backend fills in."""
    config = pyproject(package)
    project = config["project"]
    if "dependencies" not in project.get("dynamic", []):
        return list(project.get("dependencies", []))
    tool = config["tool"]
    if "dynamic-metadata" in tool:  # scikit-build-core's providers
        (entry,) = [e for e in tool["dynamic-metadata"] if e["field"] == "dependencies"]
        return entry["result"]
    return tool["hatch"]["metadata"]["hooks"]["custom"]["dependencies"]


def local_packages() -> list[str]:
    return sorted(path.name for path in PACKAGES.iterdir() if (path / "pyproject.toml").exists())


def local_dependencies(package: str) -> list[str]:
    """Sibling packages ``package`` needs, dependencies first."""
    siblings = set(local_packages())
    order: list[str] = []
    for requirement in declared_dependencies(package):
        name = requirement_name(requirement)
        if name in siblings:
            order += [dep for dep in [*local_dependencies(name), name] if dep not in order]
    return order


def needs_torch(packages: list[str], extras: bool = False) -> bool:
    """Whether any of ``packages`` asks for torch (with ``extras``: in any extra too)."""
    for package in packages:
        requirements = declared_dependencies(package)
        if extras:
            requirements += [
                r
                for extra in metadata(package).get("optional-dependencies", {}).values()
                for r in extra
            ]
        if any(requirement_name(r) == "torch" for r in requirements):
            return True
    return False


def source_hash(package: str) -> str:
    """A hash of everything ``package``'s build reads: its sources and the shared build inputs."""
    digest = hashlib.sha256()
    paths = [PACKAGES / package / part for part in SOURCE_PARTS] + list(SHARED_BUILD_INPUTS)
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(ROOT)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def ensure_venv(path: Path) -> Path:
    python = path / "bin" / "python"
    if not python.exists():
        print(f"creating {path.relative_to(ROOT)}", flush=True)
        venv.create(path, with_pip=True)
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    return python


def pip_install(python: Path, *arguments: str | Path) -> None:
    """pip install under the constraints, not byte-compiled: :func:`byte_compile` compiles the
    whole venv once its installs are done, on every core (pip compiles one file after another)."""
    run(python, "-m", "pip", "install", "--quiet", "--no-compile", "-c", CONSTRAINTS, *arguments)


def byte_compile(python: Path) -> None:
    """Byte-compile what the venv's site-packages hold and has not compiled yet. Where
    PYTHONDONTWRITEBYTECODE is set (this project's machines and CI set it), Python never writes
    the compiled files of what it imports: every process compiled torch's modules again (2.8 s
    to import it instead of 1.3 s, and 64 ranks of a job on one machine took minutes), and
    every test that starts a process paid it. The few modules written for newer Pythons than the
    venv's (torch's tests of 3.12 syntax) do not compile; they are never imported here."""
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"+ byte-compiling {site}", flush=True)
    failed = subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", site], capture_output=True, text=True
    )
    if failed.returncode == 0:
        return
    refused = failed.stdout.count("*** Error compiling")
    syntax = sum(line.startswith("SyntaxError") for line in failed.stdout.splitlines())
    if refused == 0 or syntax != refused:  # not only modules' syntax: say what compileall said
        sys.exit(f"byte-compiling {site} failed:\n{failed.stdout}{failed.stderr}")
    print(f"  {refused} module(s) of another Python's syntax left uncompiled", flush=True)


def install_torch_first(python: Path) -> bool:
    """Install torch unless the venv has it; whether it did."""
    has_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    if not has_torch:
        pip_install(python, "torch==2.13.0")
    return not has_torch


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (made if missing) for the ``with`` block."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def built_wheel(python: Path, package: str, digest: str) -> Path:
    """The wheel of ``package`` at source hash ``digest``, built by ``python``'s pip if no venv
    built it yet; wheels of the package's older sources are removed."""
    folder = WHEELS / package / digest
    with exclusive(WHEELS / f"{package}.lock"):
        if not folder.is_dir():
            partial = folder.with_name(f"{digest}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            build = ("-m", "pip", "wheel", "--quiet", "--no-deps", "-w", partial)
            run(python, *build, PACKAGES / package)
            for older in folder.parent.iterdir():
                if older.is_dir() and older != partial:
                    shutil.rmtree(older)
            partial.rename(folder)
        (wheel,) = folder.glob("*.whl")
        return wheel


def install_packages(python: Path, packages: list[str], extras: dict[str, str]) -> bool:
    """Install ``packages`` in order, each again only when its sources changed; whether any
    was."""
    installed = False
    for package in packages:
        stamp = python.parent.parent / f".mega-{package}.sha256"
        digest = source_hash(package)
        if stamp.exists() and stamp.read_text() == digest:
            continue
        installed = True
        wheel = built_wheel(python, package, digest)
        if stamp.exists():  # a rebuild of the same version: force it, then add new dependencies
            pip_install(python, "--no-deps", "--force-reinstall", wheel)
        pip_install(python, f"{package}{extras.get(package, '')} @ {wheel.as_uri()}")
        stamp.write_text(digest)
    return installed


def full() -> None:
    python = ensure_venv(ROOT / ".venv")
    installed = install_torch_first(python)
    packages = local_packages()
    ordered = [p for package in packages for p in [*local_dependencies(package), package]]
    ordered = list(dict.fromkeys(ordered))
    stamp = ROOT / ".venv" / ".mega-test-requirements.sha256"
    digest = hashlib.sha256(TEST_REQUIREMENTS.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        pip_install(python, "-r", TEST_REQUIREMENTS)
        stamp.write_text(digest)
        installed = True
    if install_packages(python, ordered, {package: "[test]" for package in ordered}) or installed:
        byte_compile(python)


def package(name: str) -> None:
    if name not in local_packages():
        sys.exit(f"unknown package {name!r}; packages: {', '.join(local_packages())}")
    python = ensure_venv(ROOT / ".venvs" / name)
    chain = [*local_dependencies(name), name]
    installed = needs_torch(chain) and install_torch_first(python)
    if install_packages(python, chain, {name: "[test]"}) or installed:
        byte_compile(python)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="which", required=True)
    sub.add_parser("full", help="the full development venv (.venv)")
    one = sub.add_parser("package", help="a venv with only one package (.venvs/NAME)")
    one.add_argument("name")
    sub.add_parser("list", help="print the package names")
    args = parser.parse_args()
    if args.which == "full":
        full()
    elif args.which == "package":
        package(args.name)
    else:
        print(" ".join(local_packages()))


if __name__ == "__main__":
    main()
