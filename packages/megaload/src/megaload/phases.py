"""Mid-training phases in one process: the training loader moves to the next phase's dataset
at the transition iteration, where Megatron-LM (the seed commit's
``--phase-transition-iterations``) saves a checkpoint, exits, and is restarted by a launcher
with the next blend.

Each phase is a dataset built for that phase's samples (megaindex's
``get_train_valid_test_num_samples`` with the transitions and the phase's first iteration),
read from its own first sample: phase ``p`` covers iterations ``[T_p, T_{p+1})``, each
iteration ``global_batch_size / (micro_batch_size x data_parallel_size)`` micro-batches on
every rank (one batch under the ``hybrid_cp`` sampler: the rank's share of the global
batch). So the batches equal the restart-based run's, batch for batch, and the run needs no
restart. Every phase's loader is made when this one is (the datasets are built before the
run starts), so a transition never waits for an index build.

``state_dict`` records the phase and that phase's loader state; ``load_state_dict`` resumes in
the right phase at the right sample, or a run restarted at iteration ``I`` starts there with
``consumed_samples = I x global_batch_size``, as Megatron-LM counts them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from megaload.accounting import consumed_in_phase, num_micro_batches
from megaload.batch_sampler import Bounded, GlobalBatchSampler
from megaload.checks import (
    COUNT,
    COUNTS,
    INTEGER,
    MAPPING,
    check_count,
    check_state,
    is_integer,
)
from megaload.config import DataLoaderConfig
from megaload.errors import LoaderStateError, PhaseDataError, ResumeError, SamplerError
from megaload.loader import MegatronDataLoader

logger = logging.getLogger(__name__)

#: the version of ``PhasedDataLoader.state_dict``
PHASED_STATE_VERSION = 1
#: the keys of its state, and their kinds
PHASED_STATE_SCHEMA = {
    "version": INTEGER,
    "phase_starts": COUNTS,
    "phase": COUNT,
    "taken_in_phase": COUNT,
    "loader": MAPPING,
}


class PhasedDataLoader:
    """Training batches across phases: ``phases`` are ``(first iteration, dataset)`` pairs,
    the first at iteration 0; ``consumed_samples`` counts all phases' training samples (all
    ranks together), as Megatron-LM's ``consumed_train_samples`` does."""

    def __init__(
        self,
        phases: Sequence[tuple[int, Any]],
        consumed_samples: int,
        config: DataLoaderConfig,
    ) -> None:
        starts = [start for start, _ in phases]
        if not all(map(is_integer, starts)):
            raise SamplerError(
                f"phases start at whole iterations (integers), found {starts}: a transition "
                "falls between two iterations"
            )
        if not phases or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise SamplerError(
                f"phases start at iteration 0 and at increasing iterations after it, found {starts}"
            )
        if config.global_batch_size is None:
            raise SamplerError("phases need global_batch_size: it turns iterations into samples")
        self.config = config
        self.starts = starts
        micro_batches = num_micro_batches(
            config.global_batch_size, config.micro_batch_size, config.data_parallel_size
        )
        consumed_samples = check_count("consumed_samples", consumed_samples)
        iteration, leftover = divmod(consumed_samples, config.global_batch_size)
        if leftover:
            raise ResumeError(
                f"consumed_samples {consumed_samples} is not a whole number of global batches "
                f"of {config.global_batch_size}: phases change at iteration boundaries"
            )
        self.phase = self._phase_at(iteration)
        self.loaders = [
            MegatronDataLoader(dataset, self._start_in(index, iteration), config)
            for index, (_, dataset) in enumerate(phases)
        ]
        #: loader batches per iteration on each rank: its micro-batches, fewer where the
        #: sampler's batch holds several (a GlobalBatchSampler, as ``hybrid_cp``'s: one batch,
        #: the rank's share of a whole global batch)
        sampler = self.loaders[self.phase].batch_sampler
        self.batches_per_iteration = (
            micro_batches // sampler.num_micro_batches
            if isinstance(sampler, GlobalBatchSampler)
            else micro_batches
        )
        #: batches this rank has read of the current phase
        self.taken_in_phase = (iteration - starts[self.phase]) * self.batches_per_iteration
        self._warn_of_short_phases()

    def _warn_of_short_phases(self) -> None:
        """Warn now of each phase before the last whose data ends before its last iteration
        (a sampler that says where its data ends, :class:`~megaload.batch_sampler.Bounded`):
        the run stops there with a :class:`PhaseDataError`, maybe hours from now. A warning,
        not an error: a run that stops before that phase ends needs no more data."""
        for phase in range(self.phase, len(self.starts) - 1):
            sampler = self.loaders[phase].batch_sampler
            if not isinstance(sampler, Bounded):
                continue
            taken = self.taken_in_phase if phase == self.phase else 0
            owed = self._phase_batches(phase)
            given = taken + sampler.batches_from(sampler.consumed_samples)
            if given < owed:
                logger.warning(
                    "%s; the run stops there with a PhaseDataError unless the data is rebuilt",
                    self._short_of_data(phase, given, owed),
                )

    def _short_of_data(self, phase: int, given: int, owed: int) -> str:
        """Phase ``phase``'s data gives this rank ``given`` of the ``owed`` batches: where it
        ends, and how many samples it would need."""
        per_batch = self._samples_per_batch
        size = len(self.loaders[phase].dataset)
        end = self.starts[phase] + given // self.batches_per_iteration
        return (
            f"phase {phase} (iterations {self.starts[phase]} to {self.starts[phase + 1] - 1}) "
            f"runs out of data at iteration {end}: "
            f"its dataset of {size} samples gives {given} of the {owed} batches it owes this "
            f"rank ({per_batch} samples each, all ranks together); build it with at least "
            f"{owed * per_batch} samples or move the transition earlier"
        )

    def _phase_at(self, iteration: int) -> int:
        return max(index for index, start in enumerate(self.starts) if start <= iteration)

    def _start_in(self, phase: int, iteration: int) -> int:
        """Where phase ``phase``'s loader starts for a run at ``iteration``."""
        if phase != self._phase_at(iteration):
            return 0
        return consumed_in_phase(
            iteration, self.config.global_batch_size, iteration * self.config.global_batch_size,
            self.starts[1:],
        )  # fmt: skip

    def _phase_batches(self, phase: int) -> int | None:
        """Batches phase ``phase`` gives each rank (None: the last, unbounded)."""
        if phase + 1 == len(self.starts):
            return None
        return (self.starts[phase + 1] - self.starts[phase]) * self.batches_per_iteration

    @property
    def _samples_per_batch(self) -> int:
        """Samples of one loader batch, all ranks together."""
        return self.config.global_batch_size // self.batches_per_iteration

    def _ran_out(self, limit: int) -> PhaseDataError:
        """The error for a phase whose dataset ended before its last iteration: the run would
        otherwise stop there and never read the later phases."""
        return PhaseDataError(self._short_of_data(self.phase, self.taken_in_phase, limit))

    @property
    def consumed_samples(self) -> int:
        """Training samples consumed across phases, all ranks together."""
        loader = self.loaders[self.phase]
        return self.starts[self.phase] * self.config.global_batch_size + loader.consumed_samples

    def __iter__(self) -> Iterator[Any]:
        while True:
            loader = self.loaders[self.phase]
            limit = self._phase_batches(self.phase)
            if limit is None or self.taken_in_phase < limit:
                for batch in loader:
                    self.taken_in_phase += 1
                    yield batch
                    if self.taken_in_phase == limit:
                        break
                else:
                    if limit is None:
                        return  # the last phase's data is used up
                    raise self._ran_out(limit)
            self.phase += 1
            self.taken_in_phase = 0

    def state_dict(self) -> dict[str, Any]:
        """The phase, where it stands, and its loader's state."""
        return {
            "version": PHASED_STATE_VERSION,
            "phase_starts": list(self.starts),
            "phase": self.phase,
            "taken_in_phase": self.taken_in_phase,
            "loader": self.loaders[self.phase].state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the same phase, its loader at the saved sample."""
        check_state(state, {"version": INTEGER}, "phased loader state")
        if state["version"] != PHASED_STATE_VERSION:  # before the keys: another version's
            raise LoaderStateError(
                f"phased loader state['version'] is {state['version']!r}; expected "
                f"{PHASED_STATE_VERSION}"
            )
        check_state(state, PHASED_STATE_SCHEMA, "phased loader state", exact=True)
        if list(state["phase_starts"]) != self.starts:
            raise ResumeError(
                f"the state was saved with phases starting at {state['phase_starts']}, this "
                f"loader's start at {self.starts}"
            )
        if state["phase"] >= len(self.starts):
            raise LoaderStateError(
                f"phased loader state['phase'] is {state['phase']}; this loader has phases 0 to "
                f"{len(self.starts) - 1}"
            )
        self._check_layout(state["loader"])
        phase, taken = int(state["phase"]), int(state["taken_in_phase"])
        self._check_counts(phase, taken, state["loader"])
        # the phase's loader first: a state it refuses leaves this loader where it was
        self.loaders[phase].load_state_dict(state["loader"])
        self.phase, self.taken_in_phase = phase, taken

    def _check_layout(self, loader_state: Mapping[str, Any]) -> None:
        """Refuse a state saved at another batch layout: its batches taken in the phase are
        counted in that layout's batches, and its transitions fall in that layout's
        iterations. A run at another layout restarts at an iteration, as Megatron-LM's does. (A
        loader state of a version that records no layout is checked by the phase's loader.)"""
        saved = loader_state.get("layout")
        if not isinstance(saved, Mapping):
            return
        for field in ("global_batch_size", "micro_batch_size", "data_parallel_size"):
            mine = getattr(self.config, field)
            if field in saved and saved[field] != mine:
                raise ResumeError(
                    f"phased loader state['loader']['layout']['{field}'] is {saved[field]!r}, "
                    f"this loader's {field} is {mine!r}: a phased state resumes at the layout "
                    "it was saved at (its batches taken in the phase are that layout's); at "
                    "another layout, restart the run at an iteration, with consumed_samples = "
                    "iteration x global_batch_size"
                )

    def _check_counts(self, phase: int, taken: int, loader_state: Mapping[str, Any]) -> None:
        """Refuse a state whose counts no run of these phases reaches: more batches taken than
        the phase has, or a loader position that is not where those batches end (the run would
        move into the next phase early, or read the phase from the wrong sample)."""
        limit = self._phase_batches(phase)
        if limit is not None and taken > limit:
            raise LoaderStateError(
                f"phased loader state['taken_in_phase'] is {taken}; phase {phase} gives each "
                f"rank {limit} batches (iterations {self.starts[phase]} to "
                f"{self.starts[phase + 1] - 1})"
            )
        check_state(loader_state, {"consumed_samples": COUNT}, "phased loader state['loader']")
        expected = taken * self._samples_per_batch
        if loader_state["consumed_samples"] != expected:
            raise LoaderStateError(
                f"phased loader state['loader']['consumed_samples'] is "
                f"{loader_state['consumed_samples']}; {taken} batches taken in phase {phase} "
                f"(state['taken_in_phase']) end at sample {expected} of that phase"
            )
