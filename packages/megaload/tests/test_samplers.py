"""Samplers against Megatron-LM's documented behaviour (data_samplers.py), transcribed below as
plain loops, and on small cases worked out by hand."""

import itertools

import pytest
import torch

from megaload import (
    SAMPLERS,
    MegatronFullValidationSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    SamplerError,
)


def reference_single(total, consumed, mbs, rank, dp, drop_last):
    """Fill a global batch of mbs * dp consecutive indices, hand each rank its slice."""
    out, batch = [], []
    for index in range(consumed, total):
        batch.append(index)
        if len(batch) == mbs * dp:
            out.append(batch[rank * mbs : (rank + 1) * mbs])
            batch = []
    if batch and not drop_last:
        out.append(batch[rank * mbs : (rank + 1) * mbs])
    return out


def reference_cyclic(total, consumed, mbs, rank, dp, sharding, epochs):
    """One permutation per epoch, seeded by the epoch; sharded: within the rank's bucket."""
    out = []
    width = mbs * dp
    active = total - total % width
    for _ in range(epochs):
        epoch, into = divmod(consumed, active)
        generator = torch.Generator()
        generator.manual_seed(epoch)
        if sharding:
            bucket = total // width * mbs
            order = torch.randperm(bucket, generator=generator).tolist()[into // dp :]
            indices = [rank * bucket + i for i in order]
        else:
            bucket = total // mbs * mbs
            indices = torch.randperm(bucket, generator=generator).tolist()[into:][rank::dp]
        batch = []
        for index in indices:
            batch.append(index)
            if len(batch) == mbs:
                consumed += width
                out.append(batch)
                batch = []
    return out


def flat(batches):
    return [index for batch in batches for index in batch]


SINGLE_CASES = [
    (total, consumed, mbs, dp, drop_last)
    for total, consumed, mbs, dp, drop_last in itertools.product(
        [1, 7, 10, 33], [0, 3, 8], [1, 2, 3], [1, 2, 4], [True, False]
    )
    if consumed <= total
]


@pytest.mark.parametrize("total,consumed,mbs,dp,drop_last", SINGLE_CASES)
def test_single_matches_megatron(total, consumed, mbs, dp, drop_last):
    for rank in range(dp):
        sampler = MegatronPretrainingSampler(total, consumed, mbs, rank, dp, drop_last)
        assert list(sampler) == reference_single(total, consumed, mbs, rank, dp, drop_last)


CYCLIC_CASES = [
    (total, mbs, dp, sharding)
    for total, mbs, dp, sharding in itertools.product(
        [8, 13, 40], [1, 2, 3], [1, 2, 4], [True, False]
    )
    if total >= mbs * dp
]


@pytest.mark.parametrize("total,mbs,dp,sharding", CYCLIC_CASES)
def test_cyclic_matches_megatron_over_several_epochs(total, mbs, dp, sharding):
    width = mbs * dp
    for consumed in (0, width, 3 * width):
        for rank in range(dp):
            sampler = MegatronPretrainingRandomSampler(
                None, total, consumed, mbs, rank, dp, sharding
            )
            got = [batch for _ in range(3) for batch in sampler]  # three passes: three epochs
            assert got == reference_cyclic(total, consumed, mbs, rank, dp, sharding, 3)


def test_hand_worked_single():
    # 10 samples, 2 ranks of 2: global batches [0..3], [4..7]; [8, 9] is partial
    assert list(MegatronPretrainingSampler(10, 0, 2, 0, 2)) == [[0, 1], [4, 5]]
    assert list(MegatronPretrainingSampler(10, 0, 2, 1, 2)) == [[2, 3], [6, 7]]
    assert list(MegatronPretrainingSampler(10, 0, 2, 1, 2, drop_last=False)) == [
        [2, 3],
        [6, 7],
        [],
    ]  # Megatron-LM's empty last batch on the higher rank
    assert list(MegatronPretrainingSampler(10, 0, 2, 1, 2, False, pad_last_batch=True)) == [
        [2, 3],
        [6, 7],
        [None, None],
    ]
    assert list(MegatronPretrainingSampler(10, 3, 2, 1, 2)) == [[5, 6]]  # resume at sample 3


def test_hand_worked_cyclic():
    # Worked through Megatron-LM's data_samplers.py by hand. The permutations are torch's:
    # randperm(4) seeded 0 is [0, 1, 3, 2], seeded 1 is [1, 3, 2, 0]; randperm(10) seeded 0 is
    # [4, 1, 7, 5, 3, 9, 0, 8, 6, 2].
    def batches(consumed, rank, sharding, passes=1):
        sampler = MegatronPretrainingRandomSampler(None, 10, consumed, 2, rank, 2, sharding)
        return [batch for _ in range(passes) for batch in sampler]

    # sharded: 10 samples, 2 ranks of 2; 8 are active per epoch, each rank's bucket holds 4
    # (rank 1's starts at 4), shuffled by the epoch's randperm(4)
    assert batches(0, 0, True) == [[0, 1], [3, 2]]
    assert batches(0, 1, True) == [[4, 5], [7, 6]]
    assert batches(4, 1, True) == [[7, 6]]  # resume: 4 consumed, 2 of rank 1's bucket used
    assert batches(0, 1, True, passes=2) == [[4, 5], [7, 6], [5, 7], [6, 4]]  # epoch 1
    assert batches(8, 0, True) == [[1, 3], [2, 0]]
    # unsharded: randperm(10) dealt to the ranks in turn; each rank's fifth index is dropped
    assert batches(0, 0, False) == [[4, 7], [3, 0]]
    assert batches(0, 1, False) == [[1, 5], [9, 8]]


def test_hand_worked_cyclic_shapes():
    # 14 samples, micro-batch 2, 4 ranks, no sharding: a 14-sample permutation dealt out, so
    # ranks 0 and 1 get 4 indices (2 batches) and ranks 2 and 3 get 3 (1 batch)
    counts = [
        len(list(MegatronPretrainingRandomSampler(None, 14, 0, 2, r, 4, False))) for r in range(4)
    ]
    assert counts == [2, 2, 1, 1]
    balanced = [
        len(list(MegatronPretrainingRandomSampler(None, 14, 0, 2, r, 4, False, balanced=True)))
        for r in range(4)
    ]
    assert balanced == [1, 1, 1, 1]
    # sharded: rank 1's bucket is (14 // 8) * 2 = 2 indices starting at 2
    assert sorted(flat(MegatronPretrainingRandomSampler(None, 14, 0, 2, 1, 4, True))) == [2, 3]


def test_cyclic_seed_changes_the_permutation_only_when_asked():
    default = list(MegatronPretrainingRandomSampler(None, 40, 0, 2, 0, 1, False))
    seeded = list(MegatronPretrainingRandomSampler(None, 40, 0, 2, 0, 1, False, seed=17))
    assert seeded != default
    assert sorted(flat(seeded)) == sorted(flat(default))


def test_cyclic_sets_the_epoch_of_a_seeded_dataset():
    class Seeded:
        epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    dataset = Seeded()
    sampler = MegatronPretrainingRandomSampler(dataset, 8, 16, 2, 0, 2, True)
    list(sampler)
    assert dataset.epochs == [2]


def test_full_validation_deals_one_sample_per_rank():
    assert list(MegatronFullValidationSampler(5, 1, 2)) == [[1], [3]]
    assert len(MegatronFullValidationSampler(5, 0, 2)) == 3
    assert list(MegatronFullValidationSampler(1, 1, 4)) == []
    # from a resume point: 2 samples (one global batch of 2 ranks) read
    resumed = MegatronFullValidationSampler(5, 0, 2, consumed_samples=2)
    assert list(resumed) == [[2], [4]] and len(resumed) == 2
    assert [resumed.next_consumed(c) for c in (0, 2, 4)] == [2, 4, 5]  # never past the data


def test_end_of_data_is_a_clean_empty_iteration(caplog):
    with caplog.at_level("INFO"):
        assert list(MegatronPretrainingSampler(10, 10, 2, 0, 1)) == []
    assert "all 10 samples are consumed" in caplog.text


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: MegatronPretrainingSampler(10, 11, 2, 0, 1), "outside the dataset's 0..10"),
        (lambda: MegatronPretrainingSampler(0, 0, 2, 0, 1), "no sample to consume"),
        (lambda: MegatronPretrainingSampler(10, 0, 2, 2, 2), "rank 2 is outside the data-par"),
        (
            lambda: MegatronFullValidationSampler(10, 0, 2, consumed_samples=12),
            "consumed_samples 12 is outside the dataset's 0..10",
        ),
        (
            lambda: MegatronPretrainingRandomSampler(None, 5, 0, 2, 0, 4, True),
            "holds 5 samples, fewer than one global batch of micro_batch_size 2 x "
            "data_parallel_size 4 = 8",
        ),
        (
            lambda: list(MegatronPretrainingRandomSampler(None, 16, 3, 2, 0, 2, True)),
            "consumed_samples 3 does not end a global batch of 4",
        ),
    ],
)
def test_impossible_cases_are_clear_errors(build, message):
    with pytest.raises(SamplerError, match=message):
        build()


def test_samplers_are_plugins():
    assert SAMPLERS.available() == ["cyclic", "full_validation", "hybrid_cp", "single"]


@pytest.mark.parametrize("seed", range(10))
def test_the_single_sampler_s_batches_from_counts_what_it_yields(seed):
    rng = torch.Generator().manual_seed(seed)

    def draw(low, high):
        return int(torch.randint(low, high, (1,), generator=rng))

    for _ in range(30):
        total, mbs, dp = draw(1, 60), draw(1, 5), draw(1, 4)
        consumed, rank, drop_last = draw(0, total + 1), draw(0, dp), bool(draw(0, 2))
        sampler = MegatronPretrainingSampler(total, consumed, mbs, rank, dp, drop_last)
        assert sampler.batches_from(consumed) == len(list(sampler))
