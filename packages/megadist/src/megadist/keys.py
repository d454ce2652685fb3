"""The keys of a training micro-batch: their order, their dtypes, and which ones are metadata.

Megatron's ``get_batch`` hands the model a fixed list of tensors; anything else a dataset puts
in its samples (``dataset_id`` from a blend, say) is dropped there. The order below is the
order ``get_batch`` returns them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

#: what ``get_batch`` returns, in this order: the seed commit's ``BATCH_KEYS`` (pretrain_gpt.py),
#: alphabetical, so a caller unpacks ours as it unpacks Megatron-LM's list
BATCH_KEYS: tuple[str, ...] = (
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
)

#: describe the packing of a micro-batch rather than its tokens: never split across CP ranks
#: (``local_cp_size`` comes with Megatron's hybrid-CP batches, which a user may split here)
METADATA_KEYS: frozenset[str] = frozenset(
    {"cu_seqlens", "cu_seqlens_padded", "max_seqlen", "local_cp_size"}
)

#: the per-token keys, [micro_batch_size, sequence length] each
ROW_KEYS: tuple[str, ...] = ("tokens", "labels", "loss_mask", "position_ids")

#: variable-length boundaries of packed sequences, sent with a length prefix
BOUNDARY_KEYS: tuple[str, ...] = ("cu_seqlens", "cu_seqlens_padded")

#: the dtype each key travels and arrives in (Megatron's receive buffers)
KEY_DTYPES: dict[str, torch.dtype] = {
    "tokens": torch.int64,
    "labels": torch.int64,
    "loss_mask": torch.float32,
    "attention_mask": torch.bool,
    "position_ids": torch.int64,
    "cu_seqlens": torch.int32,
    "cu_seqlens_padded": torch.int32,
    "max_seqlen": torch.int32,
    "local_cp_size": torch.int32,
}


class Batch(NamedTuple):
    """One rank's share of a micro-batch, in ``BATCH_KEYS`` order; keys this rank does not
    need are None. Unpacks positionally like the list Megatron-LM's ``get_batch`` returns.
    ``hybrid_cp_group`` (a process group) and ``local_cp_size`` come only with hybrid
    context parallelism, and are None otherwise."""

    attention_mask: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    cu_seqlens_padded: torch.Tensor | None
    hybrid_cp_group: Any
    labels: torch.Tensor | None
    local_cp_size: torch.Tensor | None
    loss_mask: torch.Tensor | None
    max_seqlen: torch.Tensor | None
    position_ids: torch.Tensor | None
    tokens: torch.Tensor | None

    @classmethod
    def from_mapping(cls, batch: Mapping[str, Any]) -> Batch:
        """The ``BATCH_KEYS`` of ``batch``; missing keys are None, extra keys are dropped."""
        return cls(*(batch.get(key) for key in BATCH_KEYS))
