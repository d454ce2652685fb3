"""Deterministic micro-batches in the shape a Megatron data loader yields, for the demo and the
benchmark: token ids that show where they came from, so a split can be read off them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def synthetic_batch(
    micro_batch_size: int,
    seq_length: int,
    *,
    attention_mask: bool = False,
    packed_lengths: Sequence[int] | None = None,
    step: int = 0,
) -> dict[str, torch.Tensor]:
    """One micro-batch. ``tokens[b, s] = 1000 * (step * micro_batch_size + b) + s``, so a
    token names its sample and position. ``packed_lengths`` packs documents of those lengths
    into one row (micro batch size 1) with ``cu_seqlens``, ``cu_seqlens_padded`` and
    ``max_seqlen``, positions restarting at each document. A ``dataset_id`` is added, as a
    blend's samples carry one, for ``get_batch`` to drop."""
    rows = torch.arange(micro_batch_size, dtype=torch.int64) + step * micro_batch_size
    positions = torch.arange(seq_length, dtype=torch.int64)
    tokens = rows[:, None] * 1000 + positions[None, :]
    batch = {
        "tokens": tokens,
        "labels": tokens + 1,
        "loss_mask": (positions % 7 != 6).to(torch.float32).expand(micro_batch_size, -1).clone(),
        "position_ids": positions.expand(micro_batch_size, -1).clone(),
        "dataset_id": rows % 3,
    }
    if attention_mask:
        causal = torch.ones(seq_length, seq_length, dtype=torch.bool).tril()
        batch["attention_mask"] = (~causal).expand(micro_batch_size, 1, -1, -1).clone()
    if packed_lengths is not None:
        if micro_batch_size != 1 or sum(packed_lengths) != seq_length:
            raise ValueError(
                f"packed documents fill one row of {seq_length} tokens; found micro batch size "
                f"{micro_batch_size} and lengths summing to {sum(packed_lengths)}"
            )
        lengths = torch.tensor(list(packed_lengths), dtype=torch.int32)
        boundaries = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0)])
        starts = torch.repeat_interleave(boundaries[:-1].to(torch.int64), lengths.to(torch.int64))
        batch["position_ids"] = (positions - starts)[None, :]
        batch["cu_seqlens"] = boundaries[None, :]
        batch["cu_seqlens_padded"] = boundaries[None, :].clone()
        batch["max_seqlen"] = lengths.max().reshape(1, 1)
    return batch


def synthetic_batches(
    micro_batch_size: int, seq_length: int, **options: object
) -> Iterator[dict[str, torch.Tensor]]:
    """``synthetic_batch`` for steps 0, 1, 2, ... without end."""
    step = 0
    while True:
        yield synthetic_batch(micro_batch_size, seq_length, step=step, **options)
        step += 1
