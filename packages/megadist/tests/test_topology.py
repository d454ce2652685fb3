"""The topology object, the payload each pipeline position receives, and the group layout."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from megadist import (
    BATCH_KEYS,
    Batch,
    BatchTopology,
    PipelinePosition,
    TopologyError,
    build_parallel_groups,
)
from megadist.layout import coordinates_of, rank_of
from megadist.spawn import run_distributed

FIRST, MIDDLE, LAST, SINGLE = (
    PipelinePosition.FIRST,
    PipelinePosition.MIDDLE,
    PipelinePosition.LAST,
    PipelinePosition.SINGLE,
)


def test_pipeline_positions() -> None:
    assert PipelinePosition.of(0, 1) is SINGLE
    assert [PipelinePosition.of(r, 3) for r in range(3)] == [FIRST, MIDDLE, LAST]
    with pytest.raises(TopologyError, match="pipeline rank 2 is outside a pipeline of 2"):
        PipelinePosition.of(2, 2)


# Megatron-LM's get_batch_on_this_tp_rank: single stage (or MTP) everything, first stage the
# embedding's inputs, last stage the loss's inputs, the mask to both, boundaries to every stage
@pytest.mark.parametrize(
    ("pipeline", "mtp", "mask", "packed", "keys"),
    [
        (SINGLE, False, False, False, "tokens labels loss_mask position_ids"),
        (SINGLE, False, True, False, "tokens labels loss_mask attention_mask position_ids"),
        (FIRST, False, True, False, "tokens attention_mask position_ids"),
        (FIRST, False, False, True, "tokens position_ids cu_seqlens cu_seqlens_padded max_seqlen"),
        (LAST, False, True, False, "labels loss_mask attention_mask"),
        (LAST, True, False, False, "tokens labels loss_mask position_ids"),
        (MIDDLE, False, True, False, ""),
        (MIDDLE, False, False, True, "cu_seqlens cu_seqlens_padded max_seqlen"),
    ],
)
def test_payload_keys_per_pipeline_position(
    pipeline: PipelinePosition, mtp: bool, mask: bool, packed: bool, keys: str
) -> None:
    topology = BatchTopology(
        micro_batch_size=1,
        seq_length=8,
        pipeline=pipeline,
        mtp_on_this_rank=mtp,
        attention_mask=mask,
        packed_sequences=packed,
    )
    assert topology.payload_keys == tuple(sorted(keys.split()))
    assert topology.reads_data == bool(keys)


def test_a_topology_without_groups_is_one_rank_on_the_cpu() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=8)
    assert (topology.tp_rank, topology.tp_size, topology.cp_rank, topology.cp_size) == (0, 1, 0, 1)
    assert topology.is_source and topology.device == torch.device("cpu")
    assert topology.partitioner_name == "zigzag"
    packed = BatchTopology(micro_batch_size=1, seq_length=8, packed_sequences=True)
    assert packed.partitioner_name == "thd"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"micro_batch_size": 0, "seq_length": 8}, "must be positive, found 0 and 8"),
        (
            {"micro_batch_size": 2, "seq_length": 8, "packed_sequences": True},
            "packed sequences need micro_batch_size 1",
        ),
    ],
)
def test_inconsistent_settings_are_refused(options: dict, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        BatchTopology(**options)


def test_batch_is_a_named_tuple_in_batch_keys_order() -> None:
    assert Batch._fields == BATCH_KEYS
    batch = Batch.from_mapping({"labels": 1, "tokens": 0, "dataset_id": 9})
    # the seed commit's pretrain_gpt.get_batch returns its BATCH_KEYS: alphabetical, ten
    assert list(BATCH_KEYS) == sorted(BATCH_KEYS) and len(BATCH_KEYS) == 10
    *_, labels, _, _, _, _, tokens = batch
    assert (tokens, labels) == (0, 1)
    assert [value for value in batch if value is not None] == [1, 0]


def test_ranks_follow_megatrons_tp_cp_dp_pp_order() -> None:
    sizes = {"tp": 2, "cp": 2, "dp": 3, "pp": 2}
    # tensor-parallel neighbours are adjacent, pipeline stages the farthest apart
    assert rank_of({"tp": 1, "cp": 0, "dp": 0, "pp": 0}, sizes) == 1
    assert rank_of({"tp": 0, "cp": 1, "dp": 0, "pp": 0}, sizes) == 2
    assert rank_of({"tp": 0, "cp": 0, "dp": 1, "pp": 0}, sizes) == 4
    assert rank_of({"tp": 0, "cp": 0, "dp": 0, "pp": 1}, sizes) == 12
    assert all(rank_of(coordinates_of(r, sizes), sizes) == r for r in range(24))


def layout_on_rank() -> dict:
    layout = build_parallel_groups(tp=2, cp=2, pp=2)
    topology = layout.topology(micro_batch_size=1, seq_length=8)
    return {
        "coordinates": layout.coordinates,
        "members": {name: dist.get_process_group_ranks(g) for name, g in layout.groups.items()},
        "pipeline": topology.pipeline,
        "tp_src_rank": topology.tp_src_rank,
        "ranks": (topology.tp_rank, topology.cp_rank),
    }


@pytest.mark.distributed
def test_build_parallel_groups_on_eight_ranks() -> None:
    reports = run_distributed(layout_on_rank, 8)
    for rank, report in enumerate(reports):
        c = report["coordinates"]
        assert rank == c["tp"] + 2 * c["cp"] + 4 * c["pp"]  # dp is 1
        assert report["members"]["tp"] == [rank - c["tp"], rank - c["tp"] + 1]
        assert report["members"]["cp"] == [rank - 2 * c["cp"], rank - 2 * c["cp"] + 2]
        assert report["members"]["pp"] == [rank - 4 * c["pp"], rank - 4 * c["pp"] + 4]
        assert report["members"]["dp"] == [rank]
        assert report["pipeline"] is (FIRST if c["pp"] == 0 else LAST)
        assert report["tp_src_rank"] == rank - c["tp"]
        assert report["ranks"] == (c["tp"], c["cp"])


def layout_error(tp: int) -> str:
    try:
        build_parallel_groups(tp=tp)
    except TopologyError as error:
        return str(error)
    return "no error"


@pytest.mark.distributed
def test_a_layout_that_does_not_fill_the_world_is_refused() -> None:
    assert (
        run_distributed(layout_error, 2, 4)
        == ["world size 2 is not a multiple of tp x cp x pp = 4 x 1 x 1"] * 2
    )
