"""Running the tour: the stages every installed package contributes, in order, each timed,
skipped with a reason when a stage it needs did not run."""

from __future__ import annotations

import time

from megafmt.demo.run import DemoRun, DemoStage
from megafmt.registry import Registry

#: the stages the sibling packages contribute, and which package to install for each
PROVIDERS = {"index": "megaindex", "loader": "megaload", "get_batch": "megadist"}

#: the stages of the tour, by name (entry-point group ``mega.demo_stages``)
STAGES: Registry[type[DemoStage]] = Registry(
    "mega.demo_stages",
    "mega demo stage",
    required=("title", "order", "needs", "check", "run"),
    providers={
        name: f"it is provided by {package}: pip install ./packages/{package}"
        for name, package in PROVIDERS.items()
    },
    home="megafmt",
)


def installed_stages() -> list[tuple[str, DemoStage]]:
    """Every installed stage, instantiated, in tour order."""
    stages = [(name, STAGES.get(name)()) for name in STAGES.available()]
    return sorted(stages, key=lambda item: (item[1].order, item[0]))


def missing_stages() -> list[str]:
    """The sibling packages' stages that are not installed, with what to install."""
    return [
        f"{name} stage: it is provided by {package}: pip install ./packages/{package}"
        for name, package in PROVIDERS.items()
        if name not in STAGES
    ]


def run_tour(run: DemoRun) -> None:
    """Run every installed stage on ``run``; ``run.seconds`` gets each one's wall time. Every
    stage checks the settings first, so a bad flag stops the tour before any work."""
    stages = installed_stages()
    for _, stage in stages:
        stage.check(run)
    for number, (name, stage) in enumerate(stages, start=1):
        print(f"\n== {number}. {name}: {stage.title}", flush=True)
        absent = [need for need in stage.needs if need not in run.completed]
        if absent:
            print(f"   skipped: it needs the {', '.join(absent)} stage(s), which did not run")
            continue
        start = time.perf_counter()
        stage.run(run)
        run.seconds[name] = time.perf_counter() - start
        run.completed.append(name)
        print(f"   ({run.seconds[name]:.1f} s)", flush=True)
