"""Hybrid context parallelism on 4 gloo ranks: the groups by size, get_batch's variable-length
micro-batches with ``local_cp_size`` and ``hybrid_cp_group``, and the loader wrapper's routing
with a scheduler registered here (megaload's, the seed commit's rule, is compared with the seed
in tests/compat/test_hybrid_cp_compat.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hybridcptesting import EveryIdAlone

from megadist import (
    HYBRID_CP_SCHEDULERS,
    HybridCPDataLoaderWrapper,
    TopologyError,
    build_parallel_groups,
    cp_sizes,
    get_batch,
    zigzag_split,
)
from megadist.spawn import run_distributed

pytestmark = pytest.mark.distributed

SEQ = 16


def micro_batch(length: int, cp: int) -> dict:
    return {
        "tokens": torch.arange(length).reshape(1, length),
        "labels": torch.arange(length).reshape(1, length) + 100,
        "loss_mask": torch.ones(1, length),
        "position_ids": torch.arange(length).reshape(1, length),
        "cu_seqlens": torch.tensor([[0, length]], dtype=torch.int32),
        "max_seqlen": torch.tensor([length], dtype=torch.int32),
        "local_cp_size": torch.tensor([cp], dtype=torch.int32),
    }


def on_rank() -> tuple:
    """Both checks in one spawn of 4 ranks."""
    return shares_on_rank(), routed_on_rank()


def shares_on_rank() -> dict:
    layout = build_parallel_groups(tp=2, hybrid_cp=True)  # DPxCP groups of 2 per TP rank
    topology = layout.topology(1, SEQ)
    feed = iter([micro_batch(12, 2), micro_batch(6, 1)])
    shares = [get_batch(feed if topology.is_source else None, topology) for _ in range(2)]
    group = shares[0].hybrid_cp_group
    with pytest.raises(TopologyError, match="no hybrid CP group of 4 ranks"):
        topology.hybrid_cp.group(4)
    # packed conversations (--sft) two a micro-batch: at TP 2 the seed's broadcast would size
    # the other TP rank's buffers for two rows where a sub-sequence is one
    with pytest.raises(TopologyError, match="--micro-batch-size 2 at tensor-parallel size 2"):
        layout.topology(2, SEQ, packed_sequences=True)
    return {
        "dp_rank": layout.coordinates["dp"],
        "group": dist.get_process_group_ranks(group),
        "tokens": [share.tokens.tolist() for share in shares],
        "local_cp_size": [int(share.local_cp_size) for share in shares],
        "second_group": shares[1].hybrid_cp_group,
    }


@pytest.fixture(scope="module")
def reports() -> list:
    return run_distributed(on_rank, 4)


def test_get_batch_splits_each_sub_sequence_over_its_hybrid_group(reports):
    for rank, (report, _) in enumerate(reports):
        assert report["group"] == [rank % 2, rank % 2 + 2]
        full = micro_batch(12, 2)
        expected = zigzag_split(full, report["dp_rank"], 2)["tokens"].tolist()
        assert report["tokens"] == [expected, [list(range(6))]]
        assert report["local_cp_size"] == [2, 1]
        assert report["second_group"] is None  # one rank: not split, no group


def routed_on_rank() -> dict:
    HYBRID_CP_SCHEDULERS.register("every_id_alone", EveryIdAlone)
    layout = build_parallel_groups(cp=2, hybrid_cp=True)
    topology = layout.topology(1, SEQ)
    # at TP 1 packed conversations (--sft) two a micro-batch run: a micro-batch is one
    # sub-sequence whatever the sampler's size, as at the seed commit
    assert layout.topology(2, SEQ, packed_sequences=True).micro_batch_size == 2
    dp_rank = layout.coordinates["dp"]
    # DP rank d packs sub-sequences of 2 + d, 0 (empty) and 3 tokens, valued 10 d + position
    sample = {
        "tokens": torch.arange(5 + dp_rank) + 10 * dp_rank,
        "cu_seqlens": torch.tensor([0, 2 + dp_rank, 2 + dp_rank, 5 + dp_rank]),
    }
    wrapper = HybridCPDataLoaderWrapper(iter([[sample]]), topology, 8, scheduler="every_id_alone")
    received, schedule = next(wrapper)
    return {gid: piece["tokens"].tolist() for gid, piece in received.items()}, schedule


def test_the_wrapper_routes_each_sub_sequence_to_its_rank(reports):
    # global ids: DP rank 0 holds 0 (2 tokens) and 1 (3); DP rank 1 holds 2 (3) and 3 (3)
    pieces = {0: [0, 1], 1: [2, 3, 4], 2: [10, 11, 12], 3: [13, 14, 15]}
    for rank, (_, (received, schedule)) in enumerate(reports):
        assert schedule == [[[0], [1], [2], [3]]]
        assert cp_sizes(schedule, 0) == {0: 1, 1: 1, 2: 1, 3: 1}
        assert received == {rank: pieces[rank]}


def test_a_sub_sequence_s_cp_size_is_the_number_of_ranks_sharing_it():
    schedule = [[[0, 1], [0, 2], [0], [0]], [[3], [3], [4], [5]]]
    assert cp_sizes(schedule, 0) == {0: 4, 1: 1, 2: 1}
    assert cp_sizes(schedule, 1) == {3: 2, 4: 1, 5: 1}
