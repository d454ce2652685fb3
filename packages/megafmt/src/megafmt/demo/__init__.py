"""``mega demo``'s tour: the state its stages share (:mod:`megafmt.demo.run`), the stages
megafmt contributes, and the runner that finds every installed package's stages."""

from megafmt.demo.report import dataset_ids
from megafmt.demo.run import DemoCorpus, DemoRun, DemoSettings, DemoStage, TrainingSplits
from megafmt.demo.tour import STAGES, run_tour

__all__ = [
    "STAGES",
    "DemoCorpus",
    "DemoRun",
    "DemoSettings",
    "DemoStage",
    "TrainingSplits",
    "dataset_ids",
    "run_tour",
]
