"""``--find-optimal-num-workers``: time a trial run per worker count, report them fastest first
as Megatron's preprocess_data.py reports them, then preprocess the whole input with the fastest.

Megatron's tool runs each count on the first ``--max-documents`` documents into the output
prefix itself and stops there, leaving the last trial's truncated files as its output. Here the
trials write into a temporary folder beside the output (``<output-prefix>.trials.<pid>-<token>
.partial``) that is removed at the end, and the real run follows, so the output is the whole
corpus, byte-identical to a run without the flag. A trial folder that a killed run left (its
process gone) is removed by the next run with the same output prefix.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from megafmt.atomic import partial_path, remove_stale_partials
from megafmt.folders import make_folder
from megafmt.preprocess.pipeline import PreprocessConfig, PreprocessSummary, preprocess

#: the trials' folder is named ``<output-prefix>.trials.<pid>-<token>.partial``
TRIALS_SUFFIX = ".trials"


@dataclasses.dataclass(frozen=True)
class WorkerTrial:
    workers: int
    documents: int
    seconds: float

    @property
    def documents_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


def usable_worker_counts(
    counts: Sequence[int], partitions: int, stream: TextIO | None = None
) -> list[int]:
    """The counts that split evenly over ``partitions`` (each other one is reported, as the
    tool reports it); an error when none is left."""
    out = stream or sys.stdout
    usable = []
    for count in counts:
        if count < 1 or count % partitions:
            print(
                f"Removing num_workers ({count}) from workers list because it's not "
                f"divisible by num_partitions ({partitions})",
                file=out,
            )
        else:
            usable.append(count)
    if not usable:
        raise ValueError(
            f"--workers-to-check {' '.join(map(str, counts))}: no count is a positive multiple "
            f"of --partitions {partitions}"
        )
    return usable


def time_worker_counts(
    config: PreprocessConfig,
    counts: Sequence[int],
    max_documents: int,
    stream: TextIO | None = None,
) -> list[WorkerTrial]:
    """A trial run of ``config`` on its first ``max_documents`` documents per count (outputs in
    a temporary folder beside the output, removed at the end), fastest first."""
    out = stream or sys.stdout
    usable = usable_worker_counts(counts, config.partitions, out)
    trials_name = config.output_prefix + TRIALS_SUFFIX
    remove_stale_partials(trials_name)
    make_folder(os.path.dirname(os.path.abspath(trials_name)), "the output folder")
    scratch = partial_path(trials_name)
    os.mkdir(scratch)
    try:
        trials = _run_trials(config, usable, max_documents, scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    trials.sort(key=lambda trial: trial.documents_per_second, reverse=True)
    return trials


def _run_trials(
    config: PreprocessConfig,
    usable: list[int],
    max_documents: int,
    scratch: str,
    out: TextIO,
) -> list[WorkerTrial]:
    """One trial per count in ``usable``, outputs under ``scratch``, in the order run."""
    trials = []
    with open(os.devnull, "w") as quiet:
        for count in usable:
            print(f"Processing data with {count} workers.", file=out)
            trial = dataclasses.replace(
                config,
                output_prefix=os.path.join(scratch, f"trial-{count}"),
                workers=count,
                trial_documents=max_documents,
            )
            done = preprocess(trial, stream=quiet)
            trials.append(WorkerTrial(count, done.documents, done.elapsed))
    return trials


def report(trials: Sequence[WorkerTrial], stream: TextIO | None = None) -> None:
    """The ranking, in the words and layout of the tool's report."""
    out = stream or sys.stdout
    rule = "-----------------------------------"
    print(f"\n{rule}\nPerformance results (fastest → slowest):", file=out)
    for place, trial in enumerate(trials, start=1):
        print(
            f"{place}. {trial.workers} workers → avg. docs/s: {trial.documents_per_second:.4f}",
            file=out,
        )
    best = trials[0]
    print(
        f"\n{rule}\nThe most optimal num of workers is {best.workers} with avg. preprocessed "
        f"docs/s: {best.documents_per_second:.4f}.\n{rule}",
        file=out,
    )


def preprocess_with_best_workers(
    config: PreprocessConfig,
    counts: Sequence[int],
    max_documents: int,
    stream: TextIO | None = None,
) -> PreprocessSummary:
    """Time each of ``counts``, report, then preprocess everything with the fastest."""
    trials = time_worker_counts(config, counts, max_documents, stream)
    report(trials, stream)
    return preprocess(dataclasses.replace(config, workers=trials[0].workers), stream=stream)
