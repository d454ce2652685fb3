"""A mid-training schedule as its cache shows it, for ``mega index inspect --phases``: per phase
its first iteration, its blend, the samples and tokens of its training split and, per corpus,
the samples it draws and the epochs of the corpus's split that makes.

Each phase's training dataset is found in the cache by what it describes (megatron-core's
description: the blend's corpora and weights, or the single corpus, of the train split), as
``mega index build --phases`` (or the launches of the run) left it; a phase not built yet is
shown as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy

from megaindex.blend import Blend
from megaindex.cache_report import CacheReport, SourceReport
from megaindex.phases import PhaseSchedule


@dataclass
class PhaseReport:
    """One phase of a schedule, and the cached training dataset that serves it."""

    start_iteration: int
    blend: Blend
    base: str | None = None
    """The cache key of the phase's training dataset (None: not in the cache)."""
    samples: int | None = None
    tokens: int | None = None
    sources: list[SourceReport] = field(default_factory=list)


def _paths(description: dict) -> list[str | None]:
    return [d.get("dataset_path") for d in description.get("datasets", [])]


def _serves(report: CacheReport, blend: Blend) -> bool:
    """Whether ``report`` is the training dataset of ``blend``."""
    prefixes, weights = blend
    described = report.description
    if described.get("class") == "BlendedDataset":
        if described.get("split") != "train" or _paths(described) != prefixes:
            return False
        if weights is None:
            return True
        given = numpy.asarray(weights, dtype=numpy.float64)
        return bool(numpy.allclose(described.get("weights"), given / given.sum()))
    single = len(prefixes) == 1 and weights is None
    return (
        single
        and described.get("index_split") == "train"
        and described.get("dataset_path") == prefixes[0]
    )


def _asked(report: CacheReport) -> int | None:
    """The samples a dataset was built for: an unblended one's ``num_samples`` (its tables
    hold whole epochs), a blend's size."""
    return report.description.get("num_samples") or report.samples


def _single_source(report: CacheReport) -> SourceReport:
    """The one corpus of an unblended phase: the samples it was asked, and their epochs."""
    described, samples = report.description, _asked(report) or 0
    tokens = samples * report.sequence_length(described) + int(
        described.get("add_extra_token_to_sequence", True)
    )
    epochs = tokens / report.plan["tokens_per_epoch"] if report.plan else None
    return SourceReport(described.get("dataset_path"), 1.0, 1.0, 1.0, samples, epochs)


def phase_reports(schedule: PhaseSchedule, reports: list[CacheReport]) -> list[PhaseReport]:
    """Each phase of ``schedule`` with the cached training dataset of its blend among
    ``reports`` (``inspect_cache``'s; the last by key where several are)."""
    # a blend's own datasets are not a phase of their corpus alone
    members = [d for r in reports for d in r.description.get("datasets", [])]
    phases = []
    for phase in schedule.phases:
        found = PhaseReport(phase.start_iteration, phase.blend)
        for report in reports:
            if not _serves(report, phase.blend) or report.description in members:
                continue
            blended = report.description.get("class") == "BlendedDataset"
            found.base, found.samples = report.base, _asked(report)
            found.sources = report.sources if blended else [_single_source(report)]
            if found.samples is not None:
                described, where = (
                    (report.description["datasets"][0], " in datasets[0]")
                    if blended
                    else (report.description, "")
                )
                found.tokens = found.samples * report.sequence_length(described, where)
        phases.append(found)
    return phases


def describe_phases(phases: list[PhaseReport]) -> list[str]:
    """``mega index inspect --phases``'s lines."""
    lines = []
    for number, phase in enumerate(phases):
        prefixes, weights = phase.blend
        blend = " ".join(
            prefixes
            if weights is None
            else [f"{w:g} {p}" for w, p in zip(weights, prefixes, strict=True)]
        )
        lines.append(f"phase {number} from iteration {phase.start_iteration}: {blend}")
        if phase.base is None:
            lines.append("  not in the cache: build it with mega index build --phases")
            continue
        lines.append(f"  {phase.samples:,} samples, {phase.tokens:,} tokens  ({phase.base})")
        lines.append(f"  {'corpus':<40} {'weight':>8} {'samples':>10} {'epochs':>8}")
        for source in phase.sources:
            epochs = "?" if source.epochs is None else f"{source.epochs:.3f}"
            lines.append(
                f"  {str(source.dataset_path)[-40:]:<40} {source.weight:>8.4f} "
                f"{source.samples_drawn:>10,} {epochs:>8}"
            )
    return lines
