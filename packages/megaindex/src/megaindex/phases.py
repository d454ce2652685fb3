"""A mid-training schedule: the blend changes at set iterations (the seed commit's
``--phase-transition-iterations``, one launch per phase with its own ``--data-path``).

``PhaseSchedule`` holds the phases; ``build_phase_datasets`` builds every phase's datasets
before the run starts, each sized as Megatron-LM sizes the phase's launch (its training split
holds the phase's samples, ``get_train_valid_test_num_samples`` with the transitions), so the
caches are those the restart-based run builds and a transition never waits for an index build.
megaload's ``PhasedDataLoader`` then reads them in one process.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

from megafmt.protocols import CorpusAccounting
from megaindex.blend import Blend, get_blend_from_list
from megaindex.budget import samples_in_phase
from megaindex.builder import BlendedMegatronDatasetBuilder
from megaindex.config import BlendedMegatronDatasetConfig
from megaindex.errors import ConfigError
from megaindex.mix_resume import MixState
from megaindex.utils import Split


@dataclass(frozen=True)
class Phase:
    """One phase: its first iteration and its data (a blend, or one per split)."""

    start_iteration: int
    blend: Blend | None = None
    blend_per_split: list[Blend | None] | None = None


@dataclass(frozen=True)
class PhaseSchedule:
    """Phases in order, the first at iteration 0; the last ends at ``train_samples``."""

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        starts = self.starts
        if not all(isinstance(s, int | numpy.integer) and not isinstance(s, bool) for s in starts):
            raise ConfigError(
                f"phases start at whole iterations (integers), found {starts}: a transition "
                "falls between two iterations"
            )
        if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise ConfigError(
                f"phases start at iteration 0 and at increasing iterations after it, found {starts}"
            )

    @classmethod
    def parse(cls, items: Sequence[str]) -> PhaseSchedule:
        """``["0:0.3 web 0.7 code", "4000:code"]``: each phase as ``START:DATA_PATH``, its
        first iteration and its ``--data-path`` words (``mega index`` and ``mega load
        simulate``'s ``--phases``)."""
        phases = []
        for item in items:
            start, colon, words = item.partition(":")
            if not colon or not start.strip().isdigit():
                raise ConfigError(
                    f"--phases item {item!r}: expected START:DATA_PATH, the phase's first "
                    "iteration (an integer >= 0), a colon and its --data-path words"
                )
            blend = get_blend_from_list(words.split(), argument=f"--phases item {item!r}")
            phases.append(Phase(int(start), blend=blend))
        return cls(tuple(phases))

    @property
    def starts(self) -> list[int]:
        return [phase.start_iteration for phase in self.phases]

    @property
    def transitions(self) -> list[int]:
        """Megatron-LM's ``--phase-transition-iterations``: every start but the first."""
        return self.starts[1:]

    def phase_at(self, iteration: int) -> int:
        """The index of the phase ``iteration`` is in."""
        return max(index for index, start in enumerate(self.starts) if start <= iteration)

    def train_samples(self, global_batch_size: int, train_samples: int) -> list[int]:
        """Each phase's training samples, as the phase's own launch asks for them."""
        return [
            samples_in_phase(global_batch_size, train_samples, self.transitions, start)
            for start in self.starts
        ]


def build_phase_datasets(
    cls: Any,
    schedule: PhaseSchedule,
    config: BlendedMegatronDatasetConfig,
    global_batch_size: int,
    train_samples: int,
    eval_sizes: Sequence[int | None],
    is_built_on_rank: Callable[[], bool] = lambda: True,
    *,
    continue_corpora: bool = False,
) -> list[list[Any]]:
    """``[train, valid, test]`` of every phase, built (or found in the cache) now: phase
    ``p``'s config is ``config`` with its blend, its sizes the phase's training samples and
    ``eval_sizes`` (the valid and test counts, the same for every phase's launch).

    Each phase's training blend starts its corpora at their first sample, as each launch of
    Megatron-LM's does; with ``continue_corpora`` (``--resume-with-new-mix``), a phase after
    the first continues each corpus where the phases before left it (the transition is a
    resume with a new mix, :mod:`megaindex.mix_resume`)."""
    counts = schedule.train_samples(global_batch_size, train_samples)
    built: list[list[Any]] = []
    for number, (phase, count) in enumerate(zip(schedule.phases, counts, strict=True)):
        phase_config = dataclasses.replace(
            config, blend=phase.blend, blend_per_split=phase.blend_per_split
        )
        if continue_corpora and number:
            left = _left_by(built[-1][Split.train.value], counts[number - 1])
            phase_config = dataclasses.replace(phase_config, resume_with_new_mix=left)
        sizes = [count, *eval_sizes]
        built.append(
            BlendedMegatronDatasetBuilder(cls, sizes, is_built_on_rank, phase_config).build()
        )
    return built


def _left_by(previous: Any, served: int) -> MixState:
    """Where the phase before left each corpus once it ``served`` its samples: the state the
    next phase's blend continues, read from its own first sample (nothing on a rank that
    builds no datasets)."""
    if previous is None:
        return MixState(consumed_samples=0)
    mix = previous.mix_state(served) if isinstance(previous, CorpusAccounting) else None
    if mix is None:
        raise ConfigError(
            "continuing the corpora across phases needs every phase's training data to be a "
            "weighted blend of corpora (a single corpus: --data-path 1 PREFIX)"
        )
    return MixState(consumed_samples=0, corpora=mix["corpora"])
