"""Runs inside a seed worker (testing/seedref.py), one worker per rank: pretrain_gpt.py's
get_batch under ``--sft`` (TP rank 0 reads the batch, ``get_batch_on_this_tp_rank`` shares it,
``get_batch_on_this_cp_rank`` keeps this CP rank's THD share), with the seed commit's two
functions, on CPU tensors over gloo.

Two stand-ins make that run without a GPU: ``torch.cuda.current_device`` answers ``"cpu"`` (the
seed allocates its receive buffers there), and TransformerEngine's
``thd_get_partitioned_indices``, which is not installable here, is ``te_thd_indices`` below.
"""

from __future__ import annotations

import itertools
import types

BATCH_KEYS = [
    "attention_mask",
    "cu_seqlens",
    "cu_seqlens_padded",
    "hybrid_cp_group",
    "labels",
    "local_cp_size",
    "loss_mask",
    "max_seqlen",
    "position_ids",
    "tokens",
]


def te_thd_indices(cu_seqlens, total_tokens: int, world_size: int, rank: int):
    """The positions CP rank ``rank`` keeps of a packed row, by TransformerEngine's rule
    (``thd_partition_indices_kernel`` in transformer_engine/common/fused_attn/context_parallel.cu,
    reached through ``thd_get_partitioned_indices``): each sequence, its length a multiple of
    2 x world_size, is cut into 2 x world_size equal chunks, and the rank keeps chunks ``rank``
    and ``2 x world_size - 1 - rank`` of every sequence, in order. Written here sequence by
    sequence, apart from megadist's vectorised version, for rows the sequences fill exactly."""
    import torch

    bounds = [int(b) for b in cu_seqlens.reshape(-1)]
    assert bounds[-1] == total_tokens, "this stand-in covers rows the sequences fill"
    kept = []
    for start, end in itertools.pairwise(bounds):
        assert (end - start) % (2 * world_size) == 0
        chunk = (end - start) // (2 * world_size)
        for piece in (rank, 2 * world_size - 1 - rank):
            kept.extend(range(start + piece * chunk, start + (piece + 1) * chunk))
    return torch.tensor(kept, dtype=torch.int32)


def read_on_source(loaded: dict, tp_rank: int) -> dict:
    """What pretrain_gpt.get_batch hands get_batch_on_this_tp_rank: on TP rank 0 the loader's
    batch (numpy here) as tensors, its BATCH_KEYS only; elsewhere an empty dict."""
    import torch

    if tp_rank != 0:
        return {}
    batch = {k: torch.from_numpy(v) for k, v in loaded.items()}
    return {k: batch.get(k) for k in BATCH_KEYS}


def shares(
    rank: int, world: int, rendezvous: str, tp: int, cp: int, seq_length: int, batches: list
) -> list:
    """This rank's tensors for each batch (numpy, None for keys it has none of)."""
    import megatron.core.utils as core_utils
    import torch
    import torch.distributed as dist

    torch.cuda.current_device = lambda: "cpu"
    core_utils.tex = types.SimpleNamespace(thd_get_partitioned_indices=te_thd_indices)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        tp_groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, world, tp)]
        cp_groups = [dist.new_group(list(range(t, world, tp))) for t in range(tp)]
        tp_rank, tp_group = rank % tp, tp_groups[rank // tp]
        cp_group = cp_groups[rank % tp]
        answers = []
        for loaded in batches:
            batch = core_utils.get_batch_on_this_tp_rank(
                read_on_source(loaded, tp_rank),
                is_sft=True,
                is_hybrid_cp=False,
                create_attention_mask_in_dataloader=False,
                broadcast_src_rank=rank - tp_rank,
                broadcast_group=tp_group,
                cp_size=cp,
                tp_rank=tp_rank,
                micro_batch_size=1,
                seq_length=seq_length,
                mtp_on_this_rank=False,
                pipeline_model_parallel_size=1,
                is_pipeline_first_stage=True,
                is_pipeline_last_stage=True,
            )
            batch = core_utils.get_batch_on_this_cp_rank(
                batch, is_hybrid_cp=False, cp_group=cp_group
            )
            answers.append(
                {
                    k: None if batch[k] is None else batch[k].numpy().copy()
                    for k in BATCH_KEYS
                    if k != "hybrid_cp_group"
                }
            )
        dist.barrier()
        return answers
    finally:
        dist.destroy_process_group()
