"""Hybrid context parallelism (Megatron's ``--hybrid-context-parallel``): each packed
sub-sequence is trained by a CP group sized to its length, so short ones run on one rank and
long ones across several, and the DPxCP ranks stay evenly loaded.

Two pieces live here: how ``get_batch`` splits a hybrid-CP micro-batch (:func:`hybrid_split`,
the seed commit's ``get_batch_on_this_cp_rank`` with ``is_hybrid_cp``), and where the
scheduler that deals sub-sequences to ranks comes from: a ``megadist.hybrid_cp_schedulers``
plugin (megaload ships ``balanced``, the seed commit's ``BalancedCPScheduler``), built with the
per-rank sequence budget and the number of DPxCP ranks. ``megadist.hybrid_cp_loader`` moves the
sub-sequences to their ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch.distributed as dist

from megadist.errors import BatchError
from megadist.partition import zigzag_split
from megadist.topology import BatchTopology
from megafmt.registry import Registry


@runtime_checkable
class HybridCPScheduler(Protocol):
    """Deals the sub-sequences of a global batch to the DPxCP ranks, group by group."""

    def schedule(self, sub_sequences: Sequence[tuple[int, int]]) -> list[list[list[int]]]:
        """For (global id, length) pairs, the global ids each rank trains on per group:
        ``result[group][rank]``; ranks of a group sharing an id form that id's CP group."""
        ...


class HybridCPSchedulerFactory(Protocol):
    """What a ``megadist.hybrid_cp_schedulers`` entry point names."""

    def __call__(self, max_seq_len_per_rank: int, total_ranks: int) -> HybridCPScheduler: ...


HYBRID_CP_SCHEDULERS: Registry[HybridCPSchedulerFactory] = Registry(
    "megadist.hybrid_cp_schedulers",
    "hybrid CP scheduler",
    providers={"balanced": "it is provided by megaload: pip install ./packages/megaload"},
)


def hybrid_split(payload: Mapping[str, Any], topology: BatchTopology) -> dict[str, Any]:
    """This rank's share of a hybrid-CP micro-batch, with ``hybrid_cp_group`` set where it is
    split. With boundaries (``cu_seqlens``) and ``local_cp_size`` > 1, the row is split zigzag
    over the hybrid CP group of that size; with ``local_cp_size`` 1 it stays whole (no group).
    Without boundaries it is split over the plain CP group, as for pretraining."""
    if topology.hybrid_cp is None:
        raise BatchError("hybrid_split needs a topology built with hybrid_cp groups")
    if payload.get("cu_seqlens") is None:
        return zigzag_split(payload, topology.cp_rank, topology.cp_size)
    size = payload.get("local_cp_size")
    if size is None:
        raise BatchError(
            "a hybrid-CP micro-batch with cu_seqlens needs 'local_cp_size' (the CP size its "
            "sub-sequence was scheduled on)"
        )
    size = int(size.reshape(-1)[0])
    if size <= 1:
        return dict(payload)
    group = topology.hybrid_cp.group(size)
    split = zigzag_split(payload, dist.get_rank(group), size)
    split["hybrid_cp_group"] = group
    return split
