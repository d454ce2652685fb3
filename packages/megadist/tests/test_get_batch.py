"""get_batch on real gloo layouts: TP=2 x CP=2 (zigzag and THD, both protocols, with and
without masks) and TP=2 x CP=2 x PP=2. Every rank's tensors are compared with slices of the
full micro-batch, the slices' positions listed by hand from the zigzag rule."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from megadist import (
    CP_PARTITIONERS,
    BatchError,
    SourceError,
    TopologyError,
    build_parallel_groups,
    get_batch,
)
from megadist.spawn import run_distributed
from megadist.topology import BatchTopology, PipelinePosition

pytestmark = pytest.mark.distributed

SEQ = 16
DOCUMENTS = [
    0,
    4,
    12,
    16,
]  # packed rows: documents of 4, 8 and 4 tokens, padded (cu_seqlens_padded)
UNPADDED = [
    0,
    3,
    10,
    16,
]  # their cu_seqlens: not multiples of 2 x cp, so the split must not use them
STEPS = 2


def loader_batch(step: int, micro_batch_size: int, mask: bool, packed: bool) -> dict:
    """What a data loader yields at ``step``: random, the same on every process."""
    generator = torch.Generator().manual_seed(100 * step + 10 * mask + packed)
    shape = (micro_batch_size, SEQ)
    batch = {
        "tokens": torch.randint(0, 1000, shape, generator=generator, dtype=torch.int32),
        "labels": torch.randint(0, 1000, shape, generator=generator),
        "loss_mask": torch.rand(shape, generator=generator),
        "position_ids": torch.randint(0, SEQ, shape, generator=generator),
        "dataset_id": torch.full((micro_batch_size,), step),
    }
    if mask:
        mask_shape = (micro_batch_size, 1, SEQ, SEQ)
        batch["attention_mask"] = torch.rand(mask_shape, generator=generator) > 0.5
    if packed:
        batch["cu_seqlens"] = torch.tensor([UNPADDED], dtype=torch.int32)
        batch["cu_seqlens_padded"] = torch.tensor([DOCUMENTS], dtype=torch.int32)
        batch["max_seqlen"] = torch.tensor([8], dtype=torch.int32)
    return batch


def zigzag_positions(length: int, rank: int, size: int) -> list[int]:
    chunk = length // (2 * size)
    mirror = 2 * size - 1 - rank
    return [*range(rank * chunk, (rank + 1) * chunk), *range(mirror * chunk, (mirror + 1) * chunk)]


def thd_positions(rank: int, size: int) -> list[int]:
    positions: list[int] = []
    for start, end in itertools.pairwise(DOCUMENTS):
        positions += [start + p for p in zigzag_positions(end - start, rank, size)]
    return positions


def expected_share(full: dict, keys: set[str], rank: int, size: int, packed: bool) -> dict:
    positions = thd_positions(rank, size) if packed else zigzag_positions(SEQ, rank, size)
    share = {}
    for key in keys:
        value = full[key]
        if key == "attention_mask":
            share[key] = value if packed else value[:, :, positions, :]
        elif key in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen"):
            share[key] = value
        else:
            share[key] = value[:, positions]
    return share


def portable(batch: dict) -> dict:
    return {k: None if v is None else v.numpy().copy() for k, v in batch.items()}


def get_batches_on_rank(tp: int, cp: int, pp: int, cases: list[dict]) -> dict:
    layout = build_parallel_groups(tp=tp, cp=cp, pp=pp)
    runs = []
    for case in cases:
        mbs = 1 if case["packed"] else 2
        topology = layout.topology(
            mbs, SEQ, attention_mask=case["mask"], packed_sequences=case["packed"]
        )
        loader = (loader_batch(step, mbs, case["mask"], case["packed"]) for step in range(STEPS))
        source = loader if topology.is_source else None
        steps = [get_batch(source, topology, protocol=case["protocol"]) for _ in range(STEPS)]
        runs.append([portable(batch._asdict()) for batch in steps])
    return {"coordinates": layout.coordinates, "position": layout.pipeline_position, "runs": runs}


RECEIVES = {
    PipelinePosition.SINGLE: {"tokens", "labels", "loss_mask", "position_ids"},
    PipelinePosition.FIRST: {"tokens", "position_ids"},
    PipelinePosition.LAST: {"labels", "loss_mask"},
}


def check(reports: list[dict], cases: list[dict], dtypes: dict[str, torch.dtype]) -> None:
    for report in reports:
        cp_rank = report["coordinates"]["cp"]
        for case, run in zip(cases, report["runs"], strict=True):
            mbs = 1 if case["packed"] else 2
            keys = set(RECEIVES[report["position"]])
            keys |= {"attention_mask"} if case["mask"] else set()
            keys |= {"cu_seqlens", "cu_seqlens_padded", "max_seqlen"} if case["packed"] else set()
            for step, received in enumerate(run):
                full = loader_batch(step, mbs, case["mask"], case["packed"])
                expected = expected_share(full, keys, cp_rank, 2, case["packed"])
                where = (case, report["coordinates"], step)
                assert {k for k, v in received.items() if v is not None} == keys, where
                for key, value in expected.items():
                    got = torch.from_numpy(received[key])
                    assert got.dtype == dtypes[key], (where, key)
                    assert torch.equal(got, value.to(dtypes[key])), (where, key)


TP2_CP2_CASES = [
    {"mask": mask, "packed": packed, "protocol": protocol}
    for mask, packed, protocol in itertools.product(
        [False, True], [False, True], ["packed", "per_tensor"]
    )
]


def test_tp2_cp2_every_rank_holds_its_share_of_the_same_batches(
    megatron_dtypes: dict[str, torch.dtype],
) -> None:
    reports = run_distributed(get_batches_on_rank, 4, 2, 2, 1, TP2_CP2_CASES)
    check(reports, TP2_CP2_CASES, megatron_dtypes)


def test_tp2_cp2_pp2_first_and_last_stages_hold_their_keys(
    megatron_dtypes: dict[str, torch.dtype],
) -> None:
    cases = [{"mask": True, "packed": False, "protocol": "packed"}]
    reports = run_distributed(get_batches_on_rank, 8, 2, 2, 2, cases)
    assert {r["position"] for r in reports} == {PipelinePosition.FIRST, PipelinePosition.LAST}
    check(reports, cases, megatron_dtypes)


def stop_and_fail(protocol: str) -> list[str]:
    """One batch, then an exhausted loader; then a loader that yields a malformed batch."""
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ, tp_group=dist.group.WORLD)
    source = dist.get_rank() == 0
    seen = []
    loader = iter([loader_batch(0, 2, False, False)])
    for _ in range(2):
        try:
            get_batch(loader if source else None, topology, protocol=protocol)
            seen.append("batch")
        except StopIteration:
            seen.append("StopIteration")
    bad = {"tokens": torch.zeros(2, SEQ)}
    try:
        get_batch(iter([bad]) if source else None, topology, protocol=protocol)
    except (BatchError, SourceError) as error:
        seen.append(type(error).__name__)
    return seen


@pytest.mark.parametrize("protocol", ["packed", "per_tensor"])
def test_an_exhausted_or_failing_source_stops_every_rank_of_its_group(protocol: str) -> None:
    assert run_distributed(stop_and_fail, 2, protocol) == [
        ["batch", "StopIteration", "BatchError"],
        ["batch", "StopIteration", "SourceError"],
    ]


def halves(batch: dict, cp_rank: int, cp_size: int) -> dict:
    """A third-party split: contiguous pieces of the tokens (other keys dropped)."""
    piece = SEQ // cp_size
    return {"tokens": batch["tokens"][:, cp_rank * piece : (cp_rank + 1) * piece]}


def split_by_plugins() -> list[list[int]]:
    """TP2 x CP2 with a partitioner registered under a new name, then one registered in place of
    ``zigzag``: both run after the broadcast, on full batches."""
    layout = build_parallel_groups(tp=2, cp=2)
    CP_PARTITIONERS.register("halves", halves)
    CP_PARTITIONERS.register("zigzag", halves, replace=True)
    rows = []
    for name in ("halves", "zigzag"):
        topology = layout.topology(2, SEQ, cp_partitioner=name)
        loader = iter([loader_batch(0, 2, False, False)])
        batch = get_batch(loader if topology.is_source else None, topology)
        rows.append(batch.tokens[0].tolist())
    return rows


def test_plugin_partitioners_split_after_the_broadcast() -> None:
    tokens = loader_batch(0, 2, False, False)["tokens"][0].tolist()
    reports = run_distributed(split_by_plugins, 4)
    for rank, rows in enumerate(reports):
        cp_rank = rank // 2
        assert rows == [tokens[cp_rank * 8 : (cp_rank + 1) * 8]] * 2, rank


def middle_stage_with_packed_sequences() -> dict:
    topology = BatchTopology(
        micro_batch_size=1,
        seq_length=SEQ,
        tp_group=dist.group.WORLD,
        pipeline=PipelinePosition.MIDDLE,
        packed_sequences=True,
    )
    loader = iter([loader_batch(0, 1, False, True)])
    batch = get_batch(loader if topology.is_source else None, topology)
    return portable(batch._asdict())


def test_a_middle_stage_with_packed_sequences_gets_only_their_boundaries() -> None:
    full = loader_batch(0, 1, False, True)
    for batch in run_distributed(middle_stage_with_packed_sequences, 2):
        assert {k for k, v in batch.items() if v is not None} == {
            "cu_seqlens",
            "cu_seqlens_padded",
            "max_seqlen",
        }
        assert batch["cu_seqlens"].tolist() == [UNPADDED]
        assert batch["cu_seqlens_padded"].tolist() == [DOCUMENTS]
        assert torch.equal(torch.from_numpy(batch["max_seqlen"]), full["max_seqlen"])


class Untouchable:
    def __next__(self) -> dict:
        raise AssertionError("a middle stage must not read the loader")


def test_a_middle_stage_without_packed_sequences_does_not_read_the_loader() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ, pipeline=PipelinePosition.MIDDLE)
    assert tuple(get_batch(Untouchable(), topology)) == (None,) * 10


def test_one_rank_without_groups_gets_the_batch_minus_extra_keys() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ, attention_mask=True)
    full = loader_batch(0, 2, True, False)
    batch = get_batch(iter([full]), topology)
    assert torch.equal(batch.tokens, full["tokens"])
    assert torch.equal(batch.attention_mask, full["attention_mask"])
    assert batch.cu_seqlens is None and "dataset_id" not in batch._fields


def test_the_source_needs_a_loader() -> None:
    with pytest.raises(BatchError, match="TP rank 0 .* needs a data iterator"):
        get_batch(None, BatchTopology(micro_batch_size=2, seq_length=SEQ))


@pytest.mark.parametrize(
    ("pipeline", "vp_stage", "at_an_end"),
    [
        (PipelinePosition.FIRST, 0, True),
        (PipelinePosition.FIRST, 1, False),
        (PipelinePosition.FIRST, 2, False),
        (PipelinePosition.LAST, 0, False),
        (PipelinePosition.LAST, 2, True),
        (PipelinePosition.MIDDLE, 0, False),
        (PipelinePosition.SINGLE, 1, False),
        (PipelinePosition.SINGLE, 2, True),
    ],
)
def test_a_virtual_chunk_reads_data_only_at_an_end_of_the_model(
    pipeline: PipelinePosition, vp_stage: int, at_an_end: bool
) -> None:
    # Megatron's is_first_or_last_pipeline_stage(vp_stage): the first chunk of the first rank,
    # the last chunk of the last rank
    topology = BatchTopology(
        micro_batch_size=2, seq_length=SEQ, pipeline=pipeline, virtual_pipeline_size=3
    )
    assert topology.chunk_at_an_end(vp_stage) is at_an_end
    full = loader_batch(0, 2, False, False)
    batch = get_batch(iter([full]) if at_an_end else Untouchable(), topology, vp_stage=vp_stage)
    present = {key for key, value in batch._asdict().items() if value is not None}
    assert present == (set(topology.payload_keys) if at_an_end else set())


def test_a_packed_inner_chunk_gets_only_the_boundaries_of_its_rank_s_batch() -> None:
    topology = BatchTopology(
        micro_batch_size=1,
        seq_length=SEQ,
        pipeline=PipelinePosition.FIRST,
        packed_sequences=True,
        virtual_pipeline_size=2,
    )
    full = loader_batch(0, 1, False, True)
    batch = get_batch(iter([full]), topology, vp_stage=1)
    present = {key for key, value in batch._asdict().items() if value is not None}
    assert present == {"cu_seqlens", "cu_seqlens_padded", "max_seqlen"}
    assert batch.cu_seqlens.tolist() == [UNPADDED]


def test_a_virtual_pipeline_needs_the_chunk() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ, virtual_pipeline_size=2)
    with pytest.raises(TopologyError, match="needs the asking chunk's vp_stage"):
        get_batch(iter([]), topology)
    with pytest.raises(TopologyError, match="vp_stage 2 is outside the 2 model chunks"):
        get_batch(iter([]), topology, vp_stage=2)
