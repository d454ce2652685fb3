"""broadcast_batch on a real two-rank gloo TP group: every pipeline position, with and without
attention masks and packed-sequence boundaries, both wire protocols, and failures on the source.
The expected tensors are the full batch's, computed on one process."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from megadist import BatchError, BatchTopology, PipelinePosition, SourceError, broadcast_batch
from megadist.collectives import counting_collectives
from megadist.spawn import run_distributed

pytestmark = pytest.mark.distributed

SEQ = 16
# what each position receives (Megatron-LM's get_batch_on_this_tp_rank), listed by hand
RECEIVES = {
    "single": {"tokens", "labels", "loss_mask", "position_ids"},
    "first": {"tokens", "position_ids"},
    "last": {"labels", "loss_mask"},
    "middle": set(),
}
BOUNDARIES = {"cu_seqlens", "cu_seqlens_padded", "max_seqlen"}


def full_batch(micro_batch_size: int, mask: bool, packed: bool) -> dict[str, torch.Tensor]:
    """A loader's micro-batch, random but the same on every process; tokens deliberately int32
    and the loss mask float64, which the source must convert to what receivers allocate."""
    generator = torch.Generator().manual_seed(micro_batch_size * 10 + mask * 2 + packed)
    shape = (micro_batch_size, SEQ)
    batch = {
        "tokens": torch.randint(0, 50_000, shape, generator=generator, dtype=torch.int32),
        "labels": torch.randint(0, 50_000, shape, generator=generator),
        "loss_mask": torch.randint(0, 2, shape, generator=generator).to(torch.float64),
        "position_ids": torch.randint(0, SEQ, shape, generator=generator),
        "dataset_id": torch.zeros(micro_batch_size, dtype=torch.int64),
    }
    if mask:
        batch["attention_mask"] = torch.randint(
            0, 2, (*shape[:1], 1, SEQ, SEQ), generator=generator
        ).bool()
    if packed:
        batch["cu_seqlens"] = torch.tensor([[0, 3, 9, 16]], dtype=torch.int32)
        batch["cu_seqlens_padded"] = torch.tensor([[0, 4, 10, 16]], dtype=torch.int32)
        batch["max_seqlen"] = torch.tensor([[6]], dtype=torch.int32)
    return batch


CASES = [
    {"position": p, "mtp": mtp, "mask": m, "packed": k, "protocol": proto}
    for p, mtp, m, k, proto in itertools.product(
        ["single", "first", "middle", "last"],
        [False, True],
        [False, True],
        [False, True],
        ["packed", "per_tensor"],
    )
    if not (mtp and p in ("single", "middle"))
]


def topology_for(case: dict) -> BatchTopology:
    return BatchTopology(
        micro_batch_size=1 if case["packed"] else 2,
        seq_length=SEQ,
        tp_group=dist.group.WORLD,
        pipeline=PipelinePosition(case["position"]),
        mtp_on_this_rank=case["mtp"],
        attention_mask=case["mask"],
        packed_sequences=case["packed"],
    )


def portable(batch: dict) -> dict:
    """``batch`` with its tensors as (numpy array, torch dtype): tensors sent back from a
    spawned rank would travel as shared-memory handles that die with the rank."""
    return {k: None if v is None else (v.numpy().copy(), v.dtype) for k, v in batch.items()}


def unpack(value: tuple | None) -> torch.Tensor | None:
    return None if value is None else torch.from_numpy(value[0]).to(value[1])


def broadcast_every_case(cases: list[dict]) -> list[dict]:
    results = []
    for case in cases:
        topology = topology_for(case)
        batch = full_batch(topology.micro_batch_size, case["mask"], case["packed"])
        source = batch if dist.get_rank() == 0 else None
        with counting_collectives() as calls:
            received = broadcast_batch(source, topology, protocol=case["protocol"])
        results.append({"batch": portable(received), "collectives": len(calls)})
    return results


def expected_keys(case: dict) -> set[str]:
    keys = set(RECEIVES["single" if case["mtp"] else case["position"]])
    if case["mask"] and keys:
        keys.add("attention_mask")
    if case["packed"]:
        keys |= BOUNDARIES
    return keys


@pytest.fixture(scope="module")
def reports() -> list[list[dict]]:
    """Every case, broadcast once on two ranks."""
    return run_distributed(broadcast_every_case, 2, CASES)


def test_every_position_receives_exactly_its_keys_equal_to_the_source_batch(
    reports: list[list[dict]], megatron_dtypes: dict[str, torch.dtype]
) -> None:
    for index, case in enumerate(CASES):
        full = full_batch(1 if case["packed"] else 2, case["mask"], case["packed"])
        keys = expected_keys(case)
        for rank in (0, 1):
            received = {k: unpack(v) for k, v in reports[rank][index]["batch"].items()}
            # the seed commit's dict also carries the hybrid-CP group (not a tensor)
            assert set(received) == {*megatron_dtypes, "hybrid_cp_group"}, case
            for key, value in received.items():
                if key not in keys:
                    assert value is None, (case, rank, key)
                    continue
                expected = full[key].to(megatron_dtypes[key])
                if key in BOUNDARIES:
                    expected = (
                        expected.reshape(1, -1) if key != "max_seqlen" else expected.reshape(1)
                    )
                assert value.dtype == megatron_dtypes[key], (case, rank, key)
                assert torch.equal(value, expected), (case, rank, key)


def test_collective_counts_per_micro_batch(reports: list[list[dict]]) -> None:
    for index, case in enumerate(CASES):
        keys = expected_keys(case)
        tensors = len(keys - {"cu_seqlens", "cu_seqlens_padded"})
        boundaries = 2 * len(keys & {"cu_seqlens", "cu_seqlens_padded"})  # length, then values
        if not keys:  # the agreement that nothing moves
            expected = 1
        elif case["protocol"] == "packed":  # agreement, the buffer, then the mask by itself
            expected = 2 + ("attention_mask" in keys)
        else:
            expected = 1 + tensors + boundaries
        assert [r[index]["collectives"] for r in reports] == [expected, expected], case


def test_a_single_stage_without_masks_sends_four_tensors_or_one_buffer_after_agreeing() -> None:
    case = {"position": "single", "mtp": False, "mask": False, "packed": False}
    reports = run_distributed(
        broadcast_every_case,
        2,
        [{**case, "protocol": "per_tensor"}, {**case, "protocol": "packed"}],
    )
    assert [r["collectives"] for r in reports[1]] == [5, 2]


def send_bad_batches(protocol: str) -> list[str]:
    """The source offers a batch of the wrong shape, then none at all; what each rank sees."""
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ, tp_group=dist.group.WORLD)
    bad = full_batch(2, False, False)
    bad["tokens"] = bad["tokens"][:, :8]
    seen = []
    for batch in (bad, None):
        with counting_collectives() as calls:
            try:
                broadcast_batch(
                    batch if dist.get_rank() == 0 else None, topology, protocol=protocol
                )
                seen.append("no error")
            except (BatchError, SourceError) as error:
                seen.append(f"{type(error).__name__}: {error}")
        seen[-1] += f" ({[name for name, _ in calls]})"
    return seen


@pytest.mark.parametrize("protocol", ["packed", "per_tensor"])
def test_a_malformed_source_batch_fails_on_every_rank(protocol: str) -> None:
    """The header every rank exchanges first carries the source's status, then its message
    comes: with either protocol, no rank waits for a batch that never comes."""
    source, receiver = run_distributed(send_bad_batches, 2, protocol)
    calls = " (['all_reduce', 'broadcast'])"
    assert source[0] == (
        "BatchError: 'tokens' has shape [2, 8]; the topology expects [2, 16] "
        "(micro_batch_size 2, seq_length 16)" + calls
    )
    assert receiver[0] == (
        "SourceError: TP source rank 0 could not send its batch: BatchError: 'tokens' has "
        "shape [2, 8]; the topology expects [2, 16] (micro_batch_size 2, seq_length 16)" + calls
    )
    assert source[1] == (
        "BatchError: TP rank 0 is the source of its group and must pass a batch" + calls
    )
    assert receiver[1].startswith("SourceError") and "must pass a batch" in receiver[1]


def test_keys_the_topology_does_not_carry_are_refused() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ)
    with pytest.raises(BatchError, match="carries 'attention_mask' but .* attention_mask=False"):
        broadcast_batch(full_batch(2, True, False), topology)
    with pytest.raises(BatchError, match="carries 'cu_seqlens' but .* packed_sequences=False"):
        broadcast_batch(
            full_batch(1, False, True), BatchTopology(micro_batch_size=1, seq_length=SEQ)
        )
    floats = {**full_batch(2, False, False), "tokens": torch.zeros(2, SEQ)}
    with pytest.raises(BatchError, match="'tokens' has dtype torch.float32; expected torch.int64"):
        broadcast_batch(floats, topology)
    with pytest.raises(BatchError, match="has no 'labels', which the single pipeline stage needs"):
        broadcast_batch({"tokens": torch.zeros(2, SEQ, dtype=torch.int64)}, topology)
