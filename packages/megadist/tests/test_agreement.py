"""Ranks of one TP group configured differently, on a real two-rank gloo group: every rank
raises the same AgreementError naming the field and the ranks, before any data moves and within
a fraction of the group's (short) timeout: no garbage, no abort inside gloo, no hang."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from megadist import (
    AgreementError,
    BatchTopology,
    ParallelLayout,
    PipelinePosition,
    build_parallel_groups,
    get_batch,
)
from megadist.agreement import FIELDS, HEADER_SLOTS, disagreement
from megadist.broadcast import PROTOCOLS
from megadist.collectives import counting_collectives
from megadist.spawn import run_distributed

pytestmark = pytest.mark.distributed

SEQ = 16
#: seconds a collective of the test's TP group waits: a disagreement must end long before
TIMEOUT = 20.0

#: (name, rank 0's settings, rank 1's settings, the field the error must name, rank 0's value
#: as shown, rank 1's value as shown)
DISAGREEMENTS = [
    ("sequence length", {}, {"seq_length": 32}, "seq_length", "16", "32"),
    ("micro-batch size", {}, {"micro_batch_size": 4}, "micro_batch_size", "2", "4"),
    ("mask on one side", {}, {"attention_mask": True}, "attention_mask", "False", "True"),
    (
        "packed vs not",
        {"micro_batch_size": 1},
        {"micro_batch_size": 1, "packed_sequences": True},
        "packed_sequences",
        "False",
        "True",
    ),
    ("protocol", {}, {"protocol": "per_tensor"}, "protocol", "'packed'", "'per_tensor'"),
    *(
        (
            f"{role} stage vs first",
            {"pipeline": PipelinePosition.FIRST},
            {"pipeline": PipelinePosition(role)},
            "pipeline stage",
            "first",
            role,
        )
        for role in ("last", "middle")
    ),
]


def loader_batch(micro_batch_size: int, seq_length: int, mask: bool, packed: bool) -> dict:
    shape = (micro_batch_size, seq_length)
    batch = {
        "tokens": torch.arange(micro_batch_size * seq_length).reshape(shape),
        "labels": torch.ones(shape, dtype=torch.int64),
        "loss_mask": torch.ones(shape),
        "position_ids": torch.zeros(shape, dtype=torch.int64),
    }
    if mask:
        batch["attention_mask"] = torch.ones(micro_batch_size, 1, seq_length, seq_length).bool()
    if packed:
        batch["cu_seqlens"] = torch.tensor([[0, seq_length]], dtype=torch.int32)
        batch["max_seqlen"] = torch.tensor([seq_length], dtype=torch.int32)
    return batch


def one_call(layout: ParallelLayout, settings: dict) -> tuple[str, str, float]:
    """get_batch with ``settings``: the error (class, message) and the seconds it took."""
    settings = {"micro_batch_size": 2, "seq_length": SEQ, **settings}
    protocol = settings.pop("protocol", "packed")
    topology = layout.topology(
        settings.pop("micro_batch_size"), settings.pop("seq_length"), **settings
    )
    batch = loader_batch(
        topology.micro_batch_size,
        topology.seq_length,
        topology.attention_mask,
        topology.packed_sequences,
    )
    loader = iter([batch])
    start = time.perf_counter()
    try:
        get_batch(loader if topology.is_source else None, topology, protocol=protocol)
        outcome = ("none", "")
    except AgreementError as error:
        outcome = (type(error).__name__, str(error))
    return (*outcome, time.perf_counter() - start)


def disagree_on_rank(cases: list[tuple]) -> list[tuple]:
    layout = build_parallel_groups(tp=2, timeout=TIMEOUT)
    rank = dist.get_rank()
    return [one_call(layout, case[1 + rank]) for case in cases]


@pytest.fixture(scope="module")
def outcomes() -> list[list[tuple]]:
    return run_distributed(disagree_on_rank, 2, DISAGREEMENTS)


@pytest.mark.parametrize("index", range(len(DISAGREEMENTS)), ids=[c[0] for c in DISAGREEMENTS])
def test_every_rank_raises_the_same_error_naming_the_field_and_the_ranks(
    outcomes: list[list[tuple]], index: int
) -> None:
    _, _, _, field, first, second = DISAGREEMENTS[index]
    source, receiver = outcomes[0][index], outcomes[1][index]
    assert source[0] == receiver[0] == "AgreementError"
    assert source[1] == receiver[1]
    assert source[1].startswith(
        "the TP group of global ranks [0, 1] disagrees on what get_batch sends: "
        f"{field}: {first} on global rank 0; {second} on global rank 1"
    ), source[1]
    assert max(source[2], receiver[2]) < TIMEOUT / 4  # no rank waited for the timeout


def test_the_error_names_every_differing_setting_and_hides_what_follows_from_them() -> None:
    rows = [[2, *range(len(FIELDS))] for _ in range(3)]  # the wire version, then the fields
    rows[2][1 + FIELDS.index("seq_length")] = 99
    rows[2][1 + FIELDS.index("micro_batch_size")] = 7
    rows[2][1 + FIELDS.index("packed buffer bytes")] = 12345
    assert disagreement(rows, [4, 5, 6], PROTOCOLS) == (
        "micro_batch_size: 3 on global ranks 4, 5; 7 on global rank 6; "
        "seq_length: 4 on global ranks 4, 5; 99 on global rank 6"
    )
    rows[2][1 + FIELDS.index("seq_length")] = 4
    rows[2][1 + FIELDS.index("micro_batch_size")] = 3
    assert disagreement(rows, [4, 5, 6], PROTOCOLS) == (
        "packed buffer bytes: 11 on global ranks 4, 5; 12345 on global rank 6"
    )
    rows[2][0] = 1
    assert disagreement(rows, [4, 5, 6], PROTOCOLS).startswith(
        "megadist wire version: 2 on global ranks 4, 5; 1 on global rank 6"
    )
    # the source's status, two boundary counts, the hybrid-CP row length and a message length,
    # then the view and its negation: 264 bytes per rank
    assert HEADER_SLOTS == 5 + 2 * (1 + len(FIELDS)) == 33


def change_after_agreeing() -> list[str]:
    """Two batches in agreement, then rank 1 alone switches its sequence length; the view is
    cached per topology, so an equal topology built anew costs one small all-reduce."""
    layout = build_parallel_groups(tp=2, timeout=TIMEOUT)
    seen = []
    for step, seq in enumerate((SEQ, SEQ, 32 if dist.get_rank() else SEQ)):
        topology = layout.topology(2, seq)
        loader = iter([loader_batch(2, seq, False, False)])
        with counting_collectives() as calls:
            try:
                batch = get_batch(loader if topology.is_source else None, topology)
                seen.append(f"step {step}: tokens {batch.tokens.shape[1]}")
            except AgreementError as error:
                seen.append(f"step {step}: {str(error).split(': ', 1)[1].split('.')[0]}")
        seen[-1] += f" {[name for name, _ in calls]}"
    return seen


def test_a_rank_that_changes_its_layout_later_is_caught_on_that_batch() -> None:
    first = [
        "step 0: tokens 16 ['all_reduce', 'broadcast']",
        "step 1: tokens 16 ['all_reduce', 'broadcast']",
    ]
    # only a disagreement gathers every rank's view, to name who holds what
    last = (
        "step 2: seq_length: 16 on global rank 0; 32 on global rank 1 ['all_reduce', 'all_gather']"
    )
    assert run_distributed(change_after_agreeing, 2) == [[*first, last], [*first, last]]


def test_a_group_of_one_exchanges_nothing() -> None:
    topology = BatchTopology(micro_batch_size=2, seq_length=SEQ)
    with counting_collectives() as calls:
        get_batch(iter([loader_batch(2, SEQ, False, False)]), topology)
    assert calls == []
