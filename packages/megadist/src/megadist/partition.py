"""Context-parallel splits of a micro-batch: each CP rank keeps its share of every sequence.

With causal attention the cost of a token grows with its position, so a plain split into CP
contiguous pieces leaves the last rank the most work. Both splits here cut each sequence into
2 x cp chunks and give rank r chunks r and 2cp-1-r, one cheap and one expensive:

- ``zigzag`` (Megatron's get_batch_on_this_cp_rank): the whole row is one sequence.
- ``thd`` (packed sequences; TransformerEngine's ``thd_get_partitioned_indices``): every
  packed document is cut that way on its own, so each rank holds a share of each document.

Both are plugins of the entry-point group ``megadist.cp_partitioners``: a callable
``(batch, cp_rank, cp_size) -> batch`` that returns a new dict and leaves ``batch`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from megadist.errors import PartitionError
from megadist.keys import METADATA_KEYS
from megafmt.registry import Registry

Partitioner = Callable[[Mapping[str, Any], int, int], dict[str, Any]]

CP_PARTITIONERS: Registry[Partitioner] = Registry(
    "megadist.cp_partitioners", "context-parallel partitioner", home="megadist"
)


def _check_rank(cp_rank: int, cp_size: int) -> None:
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise PartitionError(f"CP rank {cp_rank} is outside a CP group of size {cp_size}")


def _is_split(key: str, value: Any) -> bool:
    """Whether ``value`` is a per-token tensor that CP ranks divide."""
    return isinstance(value, torch.Tensor) and key not in METADATA_KEYS


def zigzag_split(batch: Mapping[str, Any], cp_rank: int, cp_size: int) -> dict[str, Any]:
    """Rank ``cp_rank``'s zigzag share of ``batch``: the sequence dimension (1, or 2 for
    ``attention_mask``) cut into 2 x cp_size chunks, chunks cp_rank and 2cp_size-1-cp_rank
    kept in that order. Metadata keys, None and non-tensors are passed through."""
    _check_rank(cp_rank, cp_size)
    if cp_size == 1:
        return dict(batch)
    pieces = 2 * cp_size
    split = {}
    for key, value in batch.items():
        if not _is_split(key, value):
            split[key] = value
            continue
        dim = 2 if key == "attention_mask" else 1
        if value.dim() <= dim:
            raise PartitionError(
                f"{key!r} has shape {list(value.shape)}: no sequence dimension {dim} to split "
                f"across {cp_size} CP ranks"
            )
        length = value.shape[dim]
        if length % pieces:
            raise PartitionError(
                f"{key!r} has sequence length {length} (dimension {dim}), which is not divisible "
                f"by 2 x cp_size = {pieces}"
            )
        chunk = length // pieces
        split[key] = torch.cat(
            [
                value.narrow(dim, cp_rank * chunk, chunk),
                value.narrow(dim, (pieces - 1 - cp_rank) * chunk, chunk),
            ],
            dim=dim,
        )
    return split


def thd_partitioned_indices(
    cu_seqlens: torch.Tensor, total_tokens: int, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """The token positions CP rank ``cp_rank`` keeps of a packed row, as int32, in order.

    ``cu_seqlens`` holds the packed sequences' boundaries (``[0, end_0, end_1, ...]``), each a
    multiple of 2 x cp_size. Sequence i contributes its chunks cp_rank and 2cp_size-1-cp_rank of
    size len_i / (2 cp_size). ``total_tokens / cp_size`` positions are returned; positions past
    the last boundary continue the last sequence's second chunk, exactly as TransformerEngine's
    ``thd_get_partitioned_indices`` does.
    """
    _check_rank(cp_rank, cp_size)
    boundaries = cu_seqlens.reshape(-1).to(torch.int64)
    if boundaries.numel() < 2:
        raise PartitionError(
            f"cu_seqlens needs at least 2 entries (start and end of one sequence), found "
            f"{boundaries.tolist()}"
        )
    uneven = torch.nonzero(boundaries % (2 * cp_size)).flatten()
    if uneven.numel():
        i = int(uneven[0])
        raise PartitionError(
            f"cu_seqlens[{i}] = {int(boundaries[i])} is not a multiple of 2 x cp_size = "
            f"{2 * cp_size}: every packed sequence must be padded to a multiple of it"
        )
    if total_tokens % cp_size:
        raise PartitionError(f"total_tokens {total_tokens} is not divisible by cp_size {cp_size}")
    local = boundaries // cp_size
    sequences = boundaries.numel() - 1
    token = torch.arange(total_tokens // cp_size, device=boundaries.device)
    sequence = torch.searchsorted(local[1:sequences].contiguous(), token, right=True)
    start = local[sequence]
    half = (local[sequence + 1] - start) // 2
    within = token - start
    chunk = torch.where(within < half, cp_rank, 2 * cp_size - 2 - cp_rank)
    return (within + start * cp_size + half * chunk).to(torch.int32)


def thd_split(batch: Mapping[str, Any], cp_rank: int, cp_size: int) -> dict[str, Any]:
    """Rank ``cp_rank``'s share of a packed (THD) micro-batch: every packed sequence split like
    ``zigzag_split`` splits a row, using ``cu_seqlens_padded`` (else ``cu_seqlens``).
    ``attention_mask``, metadata keys, None and non-tensors are passed through.

    Unlike TransformerEngine, the boundaries must end exactly at the row's length: positions past
    them would hand the same tokens to two ranks and train on them twice.
    """
    _check_rank(cp_rank, cp_size)
    if cp_size == 1:
        return dict(batch)
    boundaries = batch.get("cu_seqlens_padded")
    if boundaries is None:
        boundaries = batch.get("cu_seqlens")
    if boundaries is None:
        raise PartitionError("the thd split needs 'cu_seqlens' or 'cu_seqlens_padded' in the batch")
    split_keys = [k for k, v in batch.items() if _is_split(k, v) and k != "attention_mask"]
    lengths = {key: batch[key].shape[1] for key in split_keys if batch[key].dim() >= 2}
    if len(lengths) != len(split_keys) or len(set(lengths.values())) > 1:
        shapes = {key: list(batch[key].shape) for key in split_keys}
        raise PartitionError(f"packed tensors must be [1, T] with one T, found {shapes}")
    split = dict(batch)
    if not split_keys:
        return split
    total = next(iter(lengths.values()))
    end = int(boundaries.reshape(-1)[-1])
    if end != total:
        raise PartitionError(
            f"the packed sequences end at {end} but the row has {total} tokens; pad the last "
            f"sequence (cu_seqlens_padded) to the row's end"
        )
    index = thd_partitioned_indices(boundaries, total, cp_size, cp_rank)
    for key in split_keys:
        split[key] = batch[key].index_select(1, index.to(batch[key].device))
    return split


#: the built-in splits, by function, with the name ``fixed_shapes`` knows their per-rank shapes
#: by: ``get_batch`` lets the source split first only for these (a plugin registered under one
#: of their names is another function, and is run after the broadcast)
LOCAL_SPLITS: dict[Partitioner, str] = {zigzag_split: "zigzag", thd_split: "thd"}
