"""Reliability: a malformed saved loader state, a fractional consumed-sample count, or a resume
at another layout that would repeat samples ends in an error naming the key or argument, the
value and what is allowed, never a KeyError/TypeError/AttributeError or a silent truncation."""

from __future__ import annotations

import itertools

import pytest

from megaload import (
    DataLoaderConfig,
    LoaderStateError,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    ResumeError,
    SamplerTypeError,
    build_pretraining_data_loader,
)
from megaload.phases import PhasedDataLoader


class Numbers:
    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": idx}


def loader(kind="single", size=40, **fields):
    fields = {"micro_batch_size": 2, "num_workers": 0, **fields}
    return build_pretraining_data_loader(
        Numbers(size), 0, DataLoaderConfig(dataloader_type=kind, **fields)
    )


def without(state, key):
    return {k: v for k, v in state.items() if k != key}


STATE = loader("cyclic", data_sharding=False).state_dict()
MALFORMED = [
    ([1, 2], "loader state is a list; expected a mapping"),
    (without(STATE, "version"), "loader state lacks version"),
    ({**STATE, "version": "3"}, r"\['version'\] is '3' \(str\); expected an integer"),
    ({**STATE, "version": 9}, r"\['version'\] is 9; expected one of 1, 2, 3"),
    (without(STATE, "layout"), "loader state lacks layout"),
    ({**STATE, "consumed_samples": 12.7}, r"\['consumed_samples'\] is 12.7 \(float\); expected an"),
    ({**STATE, "consumed_samples": "8"}, r"\['consumed_samples'\] is '8' \(str\)"),
    ({**STATE, "options": None}, r"\['options'\] is None \(NoneType\); expected a mapping"),
    ({**STATE, "layout": without(STATE["layout"], "data_parallel_size")}, "lacks data_parallel_s"),
    (
        {**STATE, "layout": {**STATE["layout"], "micro_batch_size": 0}},
        r"loader state\['layout'\]\['micro_batch_size'\] is 0 \(int\); expected an integer >= 1",
    ),
    ({**STATE, "options": {**STATE["options"], "balanced": "no"}}, r"\['balanced'\] is 'no'"),
    (
        {**STATE, "sampler_state": {**STATE["sampler_state"], "epoch_samples": "40"}},
        r"cyclic sampler state\['epoch_samples'\] is '40' \(str\); expected an integer >= 1",
    ),
    ({"version": 2, "consumed_samples": 0, "total_samples": 40}, "lacks sampler, sampler_state"),
    ({"version": 1, "consumed_samples": -4, "total_samples": 40}, r"is -4 \(int\); expected an"),
    # keys this loader does not write: an option of another version could change the order
    ({**STATE, "rng": 7}, r"loader state holds 'rng', which this loader's state_dict\(\) does no"),
    (
        {**STATE, "options": {**STATE["options"], "shuffle_each_epoch": False}},
        r"loader state\['options'\] holds 'shuffle_each_epoch', which",
    ),
    ({**STATE, "layout": {**STATE["layout"], "tp": 2}}, r"loader state\['layout'\] holds 'tp'"),
]


@pytest.mark.parametrize(("state", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_loader_states_name_the_key(state, message):
    with pytest.raises(LoaderStateError, match=message):
        loader("cyclic", data_sharding=False).load_state_dict(state)


def test_malformed_phased_states_name_the_key():
    config = DataLoaderConfig(micro_batch_size=2, global_batch_size=2, num_workers=0)
    phased = PhasedDataLoader([(0, Numbers(40)), (4, Numbers(40))], 0, config)
    state = phased.state_dict()
    for bad, message in (
        (without(state, "loader"), "phased loader state lacks loader"),
        ({**state, "phase": 1.0}, r"\['phase'\] is 1.0 \(float\); expected an integer >= 0"),
        ({**state, "phase": 2}, r"\['phase'\] is 2; this loader has phases 0 to 1"),
        ({**state, "phase_starts": ["0", 4]}, r"\['phase_starts'\] is \['0', 4\]"),
        ({**state, "version": 2}, r"\['version'\] is 2; expected 1"),
        ({**state, "skip": 3}, r"phased loader state holds 'skip', which this loader's"),
    ):
        with pytest.raises(LoaderStateError, match=message):
            phased.load_state_dict(bad)


@pytest.mark.parametrize("count", [12.7, 12.0, "12", True])
def test_a_consumed_sample_count_that_is_not_an_integer_is_refused(count):
    # Megatron-LM's samplers fail on a float there (range and slices take integers), an
    # integral one included: nothing is rounded
    expected = rf"consumed_samples must be an integer >= 0 .*got {count!r}"
    for build in (
        lambda: MegatronPretrainingSampler(40, count, 2, 0, 1),
        lambda: MegatronPretrainingRandomSampler(None, 40, count, 2, 0, 1, False),
        lambda: build_pretraining_data_loader(
            Numbers(40), count, DataLoaderConfig(micro_batch_size=2, num_workers=0)
        ),
        lambda: PhasedDataLoader(
            [(0, Numbers(40))], count, DataLoaderConfig(micro_batch_size=2, global_batch_size=2)
        ),
    ):
        with pytest.raises(SamplerTypeError, match=expected) as caught:
            build()
        assert isinstance(caught.value, TypeError)


def _lockstep(samplers, consumed, steps):
    """The global batches of ``steps`` steps of all ranks from ``consumed``, with the count
    before each; the samplers are iterated pass after pass, as the loader does."""
    batches = []
    while len(batches) < steps:
        for sampler in samplers:
            sampler.consumed_samples = consumed
        passes = [iter(sampler) for sampler in samplers]
        before = len(batches)
        for _ in range(steps - len(batches)):
            try:
                batch = [i for ranks in passes for i in next(ranks)]
            except StopIteration:
                break
            batches.append((consumed, batch))
            consumed += samplers[0].micro_batch_times_data_parallel_size
        if len(batches) == before:
            break
    return batches


def balanced_ranks(total, micro, ranks):
    return [
        MegatronPretrainingRandomSampler(None, total, 0, micro, rank, ranks, False, balanced=True)
        for rank in range(ranks)
    ]


def test_balanced_cyclic_never_repeats_a_sample_after_a_resume_at_another_layout():
    # every stop point of two epochs, between layouts of 1-4 ranks and micro-batches of 1-2:
    # the re-shard either continues without a sample of the epoch read twice, or is refused
    layouts = list(itertools.product((1, 2), (1, 2, 3, 4)))
    continued = refused = 0
    for total, (micro, ranks), (micro2, ranks2) in itertools.product((10, 13), layouts, layouts):
        if (micro, ranks) == (micro2, ranks2):
            continue
        old = balanced_ranks(total, micro, ranks)
        new = balanced_ranks(total, micro2, ranks2)
        epoch = old[0].resume_state()["epoch_samples"]
        epoch2 = new[0].resume_state()["epoch_samples"]
        for steps in range(2 * epoch // (micro * ranks) + 1):
            history = _lockstep(old, 0, steps)
            stopped = steps * micro * ranks
            try:
                start = new[0].reshard(old[0].resume_state(), stopped)
            except ResumeError as error:
                assert "re-shard at the end of an epoch" in str(error)
                refused += 1
                continue
            continued += 1
            read = [i for before, b in history if before // epoch == stopped // epoch for i in b]
            rest = _lockstep(new, start, (epoch2 - start % epoch2) // (micro2 * ranks2))
            read += [i for before, b in rest if before // epoch2 == start // epoch2 for i in b]
            assert len(read) == len(set(read)), (total, micro, ranks, micro2, ranks2, steps)
    assert continued and refused


def test_a_resume_at_another_data_parallel_size_is_named_unless_asked_to_reshard():
    saved = loader("cyclic", size=13, data_sharding=False, balanced=True).state_dict()
    other = loader("cyclic", size=13, data_sharding=False, balanced=True, data_parallel_size=3)
    with pytest.raises(ResumeError, match="data_parallel_size=1, this loader has data_parall"):
        other.load_state_dict(saved)
