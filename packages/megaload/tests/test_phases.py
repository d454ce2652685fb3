"""PhasedDataLoader on plain datasets: where phases change, where a resume lands, what it
refuses. Samples are their own index, tagged with the phase, so every batch says where it
came from."""

from __future__ import annotations

import pytest

from megaload import DataLoaderConfig, ResumeError, SamplerError
from megaload.phases import PhasedDataLoader


class Tagged:
    def __init__(self, phase: int, length: int) -> None:
        self.phase, self.length = phase, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return 1000 * self.phase + index


CONFIG = DataLoaderConfig(
    micro_batch_size=2, global_batch_size=8, data_parallel_rank=1, data_parallel_size=2,
    num_workers=0,
)  # fmt: skip


def phases() -> list[tuple[int, Tagged]]:
    return [(0, Tagged(0, 100)), (3, Tagged(1, 100)), (5, Tagged(2, 40))]


def test_each_phase_gives_its_iterations_from_its_first_sample() -> None:
    batches = [batch.tolist() for batch in PhasedDataLoader(phases(), 0, CONFIG)]
    # 2 micro-batches per iteration per rank; rank 1 reads samples 2-3 of each 4
    assert batches[:6] == [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [22, 23]]
    assert batches[6:10] == [[1002, 1003], [1006, 1007], [1010, 1011], [1014, 1015]]
    # the last phase runs to the end of its data: 40 samples, 5 iterations
    assert batches[10:] == [[2000 + i, 2000 + i + 1] for i in range(2, 40, 4)]


def test_a_restart_at_a_transition_and_a_resume_inside_a_phase() -> None:
    whole = [batch.tolist() for batch in PhasedDataLoader(phases(), 0, CONFIG)]
    assert [b.tolist() for b in PhasedDataLoader(phases(), 3 * 8, CONFIG)] == whole[6:]
    loader = PhasedDataLoader(phases(), 0, CONFIG)
    iterator = iter(loader)
    before = [next(iterator).tolist() for _ in range(7)]
    assert loader.consumed_samples == 3 * 8 + 4
    resumed = PhasedDataLoader(phases(), 0, CONFIG)
    resumed.load_state_dict(loader.state_dict())
    assert before + [b.tolist() for b in resumed] == whole


def test_bad_schedules_and_states_are_refused() -> None:
    with pytest.raises(SamplerError, match="phases start at iteration 0"):
        PhasedDataLoader([(1, Tagged(0, 10))], 0, CONFIG)
    with pytest.raises(SamplerError, match="phases start at iteration 0"):
        PhasedDataLoader([(0, Tagged(0, 10)), (0, Tagged(1, 10))], 0, CONFIG)
    with pytest.raises(ResumeError, match="not a whole number of global batches"):
        PhasedDataLoader(phases(), 4, CONFIG)
    state = PhasedDataLoader(phases(), 0, CONFIG).state_dict()
    other = PhasedDataLoader([(0, Tagged(0, 100)), (4, Tagged(1, 100))], 0, CONFIG)
    with pytest.raises(ResumeError, match="phases starting at \\[0, 3, 5\\]"):
        other.load_state_dict(state)
