"""Release check: build every package the standard way and install what was built (stdlib only).

    .venv/bin/python tools/release_check.py

1. ``python -m build packages/NAME`` for each package into build/release/dist: an sdist, then
   a wheel built from that sdist (so a file the sdist lacks fails here, as it would on PyPI).
2. A fresh venv with the megafmt wheel alone, no torch anywhere, and its smoke test
   (tools/release_smoke/megafmt_only.py).
3. A fresh venv with torch (the CPU build, pinned first by requirements/constraints.txt) and
   the four wheels, and their smoke test (tools/release_smoke/all_packages.py). The wheels are
   the ones built from the sdists, so megaindex's extension is compiled once.

Progress goes to stdout, each step's full output to build/release/logs/. The last line is
``N passed, M failed``; the exit status is 1 when a step failed, naming it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path

from venvs import CONSTRAINTS, ROOT, local_dependencies, local_packages

RELEASE = ROOT / "build" / "release"
DIST = RELEASE / "dist"
LOGS = RELEASE / "logs"
SMOKE = ROOT / "tools" / "release_smoke"
VERSION = (ROOT / "VERSION").read_text().strip()
TORCH = "torch==2.13.0"
#: the line a smoke test prints for each check that passed (tools/release_smoke/smoke.py)
CHECK_PREFIX = "ok: "


class StepFailed(Exception):
    """A step of the check failed; the message names it, ``output`` is its stdout."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass
class Report:
    """What passed so far: check names in order, and each venv's smoke checks."""

    passed: list[str] = field(default_factory=list)
    smoke: dict[str, list[str]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def progress(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}", flush=True)


def run_step(
    report: Report, name: str, command: list[str | Path], cwd: Path = ROOT, env: dict | None = None
) -> str:
    """Run ``command`` as the step ``name``, its output logged; its stdout, or StepFailed."""
    report.progress(f"{name} ...")
    log = LOGS / f"{len(list(LOGS.iterdir())):02d}-{name.replace(' ', '-')}.log"
    start = time.monotonic()
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )
    log.write_text(f"$ {' '.join(map(str, command))}\n{result.stdout}\n{result.stderr}")
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        print(tail, flush=True)
        message = f"{name} (exit status {result.returncode}; full output: {log})"
        raise StepFailed(message, result.stdout)
    report.progress(f"{name}: ok ({time.monotonic() - start:.0f} s)")
    return result.stdout


def build_environment() -> dict[str, str]:
    """This environment without a scikit-build-core build folder: a release builds afresh."""
    return {key: value for key, value in os.environ.items() if key != "SKBUILD_BUILD_DIR"}


def artifacts(package: str) -> tuple[Path, Path]:
    """The sdist and wheel of ``package`` in build/release/dist, each exactly one."""
    found = []
    for pattern in (f"{package}-{VERSION}.tar.gz", f"{package}-{VERSION}-*.whl"):
        matches = sorted(DIST.glob(pattern))
        if len(matches) != 1:
            raise StepFailed(f"build {package}: expected one {pattern} in {DIST}, found {matches}")
        found.append(matches[0])
    return found[0], found[1]


def build(report: Report, package: str) -> None:
    """An sdist of ``package``, then a wheel from it (``python -m build``'s default)."""
    command = [sys.executable, "-m", "build", "--outdir", DIST, ROOT / "packages" / package]
    run_step(report, f"build {package}", command, env=build_environment())
    artifacts(package)
    report.passed.append(f"build {package}")


def make_venv(report: Report, name: str, installs: dict[str, list[str | Path]]) -> Path:
    """A fresh venv build/release/NAME; ``installs`` (a label: requirements) installed in turn,
    each pinned by requirements/constraints.txt."""
    path = RELEASE / name
    report.progress(f"create {path.relative_to(ROOT)}")
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    for what, requirements in installs.items():
        command = [python, "-m", "pip", "install", "--quiet", "--no-compile", "-c", CONSTRAINTS]
        command += requirements
        run_step(report, f"{name}: install {what}", command)
        report.passed.append(f"{name}: install {what}")
    return python


def smoke(report: Report, venv_name: str, python: Path, script: str) -> None:
    """Run a smoke test with the venv's python in a scratch folder; count its checks."""
    scratch = RELEASE / f"{venv_name}-scratch"
    scratch.mkdir()
    # -E -s: no PYTHONPATH nor user site, so only what the venv installed is imported
    command = [python, "-E", "-s", SMOKE / script, VERSION]
    env = {**os.environ, "MEGA_CACHE_DIR": str(scratch / "mega-cache")}
    try:
        output = run_step(report, f"{venv_name}: {script}", command, cwd=scratch, env=env)
    except StepFailed as error:
        record_checks(report, venv_name, error.output)
        raise
    record_checks(report, venv_name, output)


def record_checks(report: Report, venv_name: str, output: str) -> None:
    """Count the checks a smoke test's ``output`` says passed, also when a later one failed."""
    checks = [
        line.removeprefix(CHECK_PREFIX)
        for line in output.splitlines()
        if line.startswith(CHECK_PREFIX)
    ]
    for check in checks:
        report.progress(f"  {CHECK_PREFIX}{check}")
    report.smoke[venv_name] = checks
    report.passed += [f"{venv_name}: {check}" for check in checks]


def summary(report: Report, failure: StepFailed | None) -> None:
    """The artifacts and their sizes, what passed in each venv, then ``N passed, M failed``."""
    print("\nsummary", flush=True)
    for package in local_packages():
        try:
            files = artifacts(package)
        except StepFailed:
            print(f"  {package:<10} not built")
            continue
        sizes = [f"{file.name} ({file.stat().st_size / 1024:.0f} KiB)" for file in files]
        print(f"  {package:<10} {'  '.join(sizes)}")
    for venv_name, checks in report.smoke.items():
        print(f"  {venv_name}: {'; '.join(checks) or 'nothing passed'}")
    if failure is not None:
        print(f"FAILED: {failure}")
    print(f"took {time.monotonic() - report.started:.0f} s")
    print(f"{len(report.passed)} passed, {0 if failure is None else 1} failed", flush=True)


def main() -> int:
    if subprocess.run([sys.executable, "-m", "build", "--version"], capture_output=True).returncode:
        sys.exit(
            f"{sys.executable} has no `build` frontend: run `make setup` (requirements/test.txt)"
        )
    report = Report()
    shutil.rmtree(RELEASE, ignore_errors=True)
    LOGS.mkdir(parents=True)
    failure = None
    packages = list(
        dict.fromkeys(p for name in local_packages() for p in [*local_dependencies(name), name])
    )
    try:
        for package in packages:
            build(report, package)
        wheels = [artifacts(package)[1] for package in packages]
        megafmt = {"the megafmt wheel": [artifacts("megafmt")[1]]}
        python = make_venv(report, "venv-megafmt", megafmt)
        smoke(report, "venv-megafmt", python, "megafmt_only.py")
        python = make_venv(report, "venv-all", {TORCH: [TORCH], "the wheels": wheels})
        smoke(report, "venv-all", python, "all_packages.py")
    except StepFailed as error:
        failure = error
    summary(report, failure)
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
