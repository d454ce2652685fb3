"""The hybrid-CP sampler and balancing scheduler: hand-picked cases (the seed commit's own code
is compared in tests/compat/test_hybrid_cp_compat.py)."""

from __future__ import annotations

import random

import pytest

from megaload import (
    BalancedCPScheduler,
    DataLoaderConfig,
    HybridCPMegatronPretrainingSampler,
    SamplerError,
    SchedulingError,
    build_pretraining_data_loader,
)


def test_each_rank_takes_its_slice_of_every_micro_batch_block() -> None:
    shares = [list(HybridCPMegatronPretrainingSampler(20, 0, 2, 8, rank, 2)) for rank in range(2)]
    assert shares[0] == [[0, 1, 4, 5], [8, 9, 12, 13]]
    assert shares[1] == [[2, 3, 6, 7], [10, 11, 14, 15]]
    last = list(HybridCPMegatronPretrainingSampler(20, 8, 2, 8, 0, 2, drop_last=False))
    assert last == [[8, 9, 12, 13], [16, 17]]


def test_the_loader_hands_a_share_over_as_a_list_of_samples() -> None:
    config = DataLoaderConfig(
        micro_batch_size=1, global_batch_size=4, dataloader_type="hybrid_cp", num_workers=0
    )
    loader = build_pretraining_data_loader([{"x": i} for i in range(12)], 4, config)
    assert next(iter(loader)) == [{"x": 4}, {"x": 5}, {"x": 6}, {"x": 7}]
    assert loader.consumed_samples == 8
    with pytest.raises(SamplerError, match="needs global_batch_size"):
        build_pretraining_data_loader(
            list(range(8)), 0, DataLoaderConfig(micro_batch_size=1, dataloader_type="hybrid_cp")
        )


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_every_sub_sequence_is_dealt_once_to_a_group_of_its_size(ranks: int) -> None:
    rng = random.Random(ranks)
    scheduler = BalancedCPScheduler(16, ranks)
    for _ in range(50):
        lengths = [rng.randint(1, 16 * ranks) for _ in range(rng.randint(1, 30))]
        schedule = scheduler.schedule(list(enumerate(lengths)))
        dealt = []
        for group in schedule:
            assert all(group), "every rank works in every group"
            holders: dict[int, list[int]] = {}
            for rank, ids in enumerate(group):
                for gid in ids:
                    holders.setdefault(gid, []).append(rank)
            for gid, sharing in holders.items():
                # a contiguous CP group, at least as large as the sub-sequence needs
                assert sharing == list(range(sharing[0], sharing[-1] + 1))
                assert len(sharing) >= scheduler.ranks_needed(lengths[gid])
            dealt += holders
        assert sorted(dealt) == list(range(len(lengths)))


def test_the_cp_size_a_sub_sequence_needs_is_a_power_of_two() -> None:
    scheduler = BalancedCPScheduler(10, 8)
    assert [scheduler.ranks_needed(n) for n in (1, 10, 11, 20, 21, 40, 41)] == [1, 1, 2, 2, 4, 4, 8]


def test_a_sub_sequence_longer_than_all_ranks_hold_is_refused() -> None:
    with pytest.raises(SchedulingError, match="raise max_seqlen_per_dp_cp_rank"):
        BalancedCPScheduler(8, 2).schedule([(0, 17)])
