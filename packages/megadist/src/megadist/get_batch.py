"""``get_batch``: the whole path from the data loader to the tensors one rank trains on.

TP rank 0 of each TP group takes the next micro-batch from its loader and moves it to the
device; the group agrees on what moves, then shares it in one broadcast (two with an attention
mask; ``megadist.broadcast``), each rank keeps its
context-parallel share, and the tensors come back in ``BATCH_KEYS`` order with the loader's
extra keys (``dataset_id``) dropped: Megatron-LM's pretrain_gpt.get_batch.

Unlike Megatron, the source splits the batch for its CP rank before sending it when the split
is a built-in one (every rank of a TP group has the same CP rank): the other ranks receive
1/cp of the bytes and do no splitting, with the same result.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from megadist.broadcast import Protocol, check_protocol, share_batch
from megadist.errors import BatchError, TopologyError
from megadist.hybrid_cp import hybrid_split
from megadist.keys import BOUNDARY_KEYS, Batch
from megadist.partition import CP_PARTITIONERS, LOCAL_SPLITS
from megadist.payload import prepare_source_batch
from megadist.topology import BatchTopology


def get_batch(
    data_iterator: Iterator[Mapping[str, Any]] | None,
    topology: BatchTopology,
    *,
    protocol: Protocol = "packed",
    vp_stage: int | None = None,
) -> Batch:
    """This rank's share of the next micro-batch. Only the TP source rank touches
    ``data_iterator`` (the others may pass None); middle pipeline stages without packed
    sequences or MTP get all None without touching it, as in Megatron.

    ``vp_stage`` is the model chunk asking, with a virtual pipeline: as at the seed commit, a
    chunk that holds neither the model's first nor its last layers gets all None, or with
    packed sequences only their boundaries (``cu_seqlens``, ``cu_seqlens_padded``,
    ``max_seqlen``, unsplit); the others get what their rank's stage gets.

    The ranks of a TP group first agree on what moves (``megadist.agreement``): ranks built
    or called differently (sequence length, micro-batch size, attention mask, packed sequences,
    protocol, pipeline stage, vp_stage) all raise ``AgreementError`` naming the fields and
    ranks. When the source's loader is exhausted, every rank of the group raises
    ``StopIteration``; when its batch is malformed, the source raises ``BatchError`` and the
    others ``SourceError`` naming it.

    With ``topology.hybrid_cp`` each micro-batch is one scheduled sub-sequence of any length up
    to ``seq_length`` (the source's length travels in the agreement), and it comes back with
    ``local_cp_size`` and, where it is split across several ranks, ``hybrid_cp_group``: the
    seed commit's get_batch under ``--hybrid-context-parallel`` (``megadist.hybrid_cp``).
    """
    check_protocol(protocol)
    if topology.virtual_pipeline_size is not None and vp_stage is None:
        raise TopologyError(
            f"the topology has a virtual pipeline of {topology.virtual_pipeline_size} chunks: "
            f"get_batch needs the asking chunk's vp_stage"
        )
    at_an_end = topology.mtp_on_this_rank or topology.chunk_at_an_end(vp_stage)
    transfers = topology.reads_data and (at_an_end or topology.packed_sequences)
    hybrid = topology.hybrid_cp is not None
    split = None
    if topology.cp_size > 1 and transfers and not hybrid:
        split = CP_PARTITIONERS.get(topology.partitioner_name)
    split_first = split is not None and split in LOCAL_SPLITS

    def prepare() -> dict:
        if data_iterator is None:
            raise BatchError(
                f"TP rank 0 (global rank {topology.tp_src_rank}) reads the data and needs a "
                f"data iterator, not None"
            )
        payload = prepare_source_batch(next(data_iterator), topology)
        # built-in splits give the agreed shapes by construction
        return split(payload, topology.cp_rank, topology.cp_size) if split_first else payload

    local = LOCAL_SPLITS[split] if split_first else None
    payload = share_batch(prepare, topology, protocol, split=local, transfers=transfers)
    if not transfers:
        return Batch.from_mapping({})
    if not at_an_end:
        return Batch.from_mapping({key: payload.get(key) for key in (*BOUNDARY_KEYS, "max_seqlen")})
    if hybrid:
        return Batch.from_mapping(hybrid_split(payload, topology))
    if split is not None and not split_first:
        payload = split(payload, topology.cp_rank, topology.cp_size)
    return Batch.from_mapping(payload)
