"""PhasedDataLoader on plain datasets: where phases change, where a resume lands, what it
refuses. Samples are their own index, tagged with the phase, so every batch says where it
came from."""

from __future__ import annotations

import copy
import dataclasses
import logging
import random

import pytest

from megaload import (
    SAMPLERS,
    DataLoaderConfig,
    HybridCPMegatronPretrainingSampler,
    LoaderStateError,
    PhaseDataError,
    ResumeError,
    SamplerError,
)
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
    for start in (2.5, 2.0, True, "2"):
        with pytest.raises(SamplerError, match="phases start at whole iterations"):
            PhasedDataLoader([(0, Tagged(0, 10)), (start, Tagged(1, 10))], 0, CONFIG)
    with pytest.raises(ResumeError, match="not a whole number of global batches"):
        PhasedDataLoader(phases(), 4, CONFIG)
    state = PhasedDataLoader(phases(), 0, CONFIG).state_dict()
    other = PhasedDataLoader([(0, Tagged(0, 100)), (4, Tagged(1, 100))], 0, CONFIG)
    with pytest.raises(ResumeError, match="phases starting at \\[0, 3, 5\\]"):
        other.load_state_dict(state)


def test_a_middle_phase_out_of_data_is_an_error_naming_it(caplog) -> None:
    # phase 1 owes iterations 3-4 (16 samples, all ranks) but holds 12
    short = [(0, Tagged(0, 100)), (3, Tagged(1, 12)), (5, Tagged(2, 40))]
    batches = []
    with caplog.at_level(logging.WARNING, logger="megaload.phases"):
        loader = PhasedDataLoader(short, 0, CONFIG)
    # said when the loader is made, not only when the run gets there
    assert "phase 1 (iterations 3 to 4) runs out of data at iteration 4" in caplog.text
    assert "at least 16 samples" in caplog.text and "PhaseDataError" in caplog.text
    with pytest.raises(PhaseDataError, match="phase 1 \\(iterations 3 to 4\\) runs out") as error:
        batches.extend(loader)
    assert "at iteration 4" in str(error.value) and "at least 16 samples" in str(error.value)
    assert len(batches) == 6 + 3  # phase 0 whole, then what phase 1 had
    # the last phase may end: that is the end of the run
    assert len(list(PhasedDataLoader(phases(), 0, CONFIG))) == 6 + 4 + 10


@pytest.mark.parametrize(
    ("length", "consumed", "kind", "warned"),
    [
        (12, 0, "single", True),  # 3 of the 4 batches phase 1 owes this rank
        (12, 4 * 8, "single", True),  # restarted inside phase 1: still one short
        (16, 0, "single", False),  # exactly enough
        (12, 5 * 8, "single", False),  # restarted past phase 1: nothing more is read of it
        (12, 0, "cyclic", False),  # the cyclic sampler deals out epoch after epoch
    ],
)
def test_a_short_middle_phase_is_told_when_the_loader_is_made(
    caplog, length, consumed, kind, warned
) -> None:
    config = dataclasses.replace(CONFIG, dataloader_type=kind)
    short = [(0, Tagged(0, 100)), (3, Tagged(1, length)), (5, Tagged(2, 40))]
    with caplog.at_level(logging.WARNING, logger="megaload.phases"):
        PhasedDataLoader(short, consumed, config)
    assert ("phase 1 (iterations 3 to 4) runs out of data at iteration 4" in caplog.text) == warned


@pytest.mark.parametrize("seed", range(20))
def test_saved_states_with_impossible_counts_are_refused(seed: int) -> None:
    rng = random.Random(seed)
    loader = PhasedDataLoader(phases(), 0, CONFIG)
    iterator = iter(loader)
    for _ in range(rng.randrange(0, 20)):
        next(iterator)
    state = copy.deepcopy(loader.state_dict())
    limit = loader._phase_batches(state["phase"])
    fresh = PhasedDataLoader(phases(), 0, CONFIG)
    fresh.load_state_dict(copy.deepcopy(state))  # the true state resumes
    assert fresh.phase == state["phase"]
    bad = copy.deepcopy(state)
    if limit is not None and rng.random() < 0.5:
        bad["taken_in_phase"] = limit + rng.randrange(1, 10)
        match = "taken_in_phase'\\] is .*gives each rank"
    else:
        bad["loader"]["consumed_samples"] += 4 * rng.choice([-1, 1]) * rng.randrange(1, 3)
        if bad["loader"]["consumed_samples"] < 0:
            bad["loader"]["consumed_samples"] = 4 * (state["taken_in_phase"] + 1)
        match = "consumed_samples'\\] is .* end at sample"
    with pytest.raises(LoaderStateError, match=match):
        PhasedDataLoader(phases(), 0, CONFIG).load_state_dict(bad)


@pytest.mark.parametrize("name", ["hybrid_cp", "global_share"])
def test_a_global_batch_sampler_gives_one_batch_per_iteration_whatever_its_name(
    request, name
) -> None:
    """Phases ask the sampler whether it is a GlobalBatchSampler, not its name: under any name,
    a batch is the rank's share of a whole global batch, one per iteration."""
    if name == "global_share":
        SAMPLERS.register(name, HybridCPMegatronPretrainingSampler.from_config)
        request.addfinalizer(lambda: SAMPLERS.unregister(name))
    loader = PhasedDataLoader(phases(), 0, dataclasses.replace(CONFIG, dataloader_type=name))
    assert loader.batches_per_iteration == 1
    batches = list(loader)
    # rank 1's slices (samples 2-3 of each 4) of both micro-batches of each global batch of 8
    assert batches[:4] == [
        [2, 3, 6, 7],
        [10, 11, 14, 15],
        [18, 19, 22, 23],
        [1002, 1003, 1006, 1007],
    ]
    assert len(batches) == 3 + 2 + 5


def test_a_state_its_phase_s_loader_refuses_leaves_the_phased_loader_where_it_was() -> None:
    saver = PhasedDataLoader(phases(), 0, CONFIG)
    iterator = iter(saver)
    for _ in range(7):  # into phase 1
        next(iterator)
    state = copy.deepcopy(saver.state_dict())
    state["loader"]["options"]["drop_last"] = not state["loader"]["options"]["drop_last"]
    loader = PhasedDataLoader(phases(), 0, CONFIG)
    with pytest.raises(ResumeError, match="drop_last"):
        loader.load_state_dict(state)
    assert (loader.phase, loader.taken_in_phase, loader.consumed_samples) == (0, 0, 0)
    whole = [batch.tolist() for batch in PhasedDataLoader(phases(), 0, CONFIG)]
    assert [batch.tolist() for batch in loader] == whole


@pytest.mark.parametrize(
    "field,value",
    [("global_batch_size", 16), ("micro_batch_size", 1), ("data_parallel_size", 4)],
)
def test_a_phased_state_saved_at_another_layout_is_refused_naming_the_field(field, value) -> None:
    saver = PhasedDataLoader(phases(), 0, CONFIG)
    iterator = iter(saver)
    for _ in range(7):
        next(iterator)
    other = dataclasses.replace(CONFIG, **{field: value, "data_parallel_rank": 0})
    loader = PhasedDataLoader(phases(), 0, other)
    saved = getattr(CONFIG, field)
    with pytest.raises(ResumeError, match=f"\\['{field}'\\] is {saved}, this loader's {field}"):
        loader.load_state_dict(saver.state_dict())
    assert (loader.phase, loader.taken_in_phase) == (0, 0)
