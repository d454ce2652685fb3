"""What a TP group sends for one micro-batch: which keys, in what shapes and dtypes, and the
checks the source's batch must pass before anything is sent.

Receivers allocate their buffers from the topology alone, so a source batch of another shape
or dtype would corrupt or hang the broadcast; it is refused on the source, with the key, the
expected and the found shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from megadist.errors import BatchError
from megadist.keys import BOUNDARY_KEYS, KEY_DTYPES
from megadist.topology import BatchTopology


def fixed_shapes(
    topology: BatchTopology, split: str | None = None, length: int | None = None
) -> dict[str, tuple[int, ...]]:
    """The shape of every payload key but the variable-length boundaries; ``split`` None gives
    the full micro-batch, ``"zigzag"`` or ``"thd"`` one CP rank's share of it. ``length`` is
    the row length of a hybrid-CP micro-batch (default: ``seq_length``), which is one row: one
    scheduled sub-sequence, whatever the micro-batch size (the sampler's)."""
    mbs = 1 if topology.hybrid_cp is not None else topology.micro_batch_size
    full = length or topology.seq_length
    rows = full if split is None else topology.local_seq_length
    mask_rows = rows if split == "zigzag" or split is None else full
    shapes = {}
    for key in topology.payload_keys:
        if key == "attention_mask":
            shapes[key] = (mbs, 1, mask_rows, full)
        elif key in ("max_seqlen", "local_cp_size"):
            shapes[key] = (1,)
        elif key not in BOUNDARY_KEYS:
            shapes[key] = (mbs, rows)
    return shapes


#: keys a source may leave None: the THD split falls back to ``cu_seqlens``; a hybrid-CP
#: micro-batch without boundaries is split over the plain CP group, and one without a mask
#: (a sub-sequence has none) gets None, as in Megatron
OPTIONAL_KEYS: dict[bool, tuple[str, ...]] = {
    False: ("cu_seqlens_padded",),
    True: ("cu_seqlens_padded", "cu_seqlens", "attention_mask"),
}


def hybrid_row_length(batch: Mapping[str, Any], topology: BatchTopology) -> int | None:
    """The row length of a hybrid-CP micro-batch (its tokens' second dimension), checked
    against ``seq_length``; None without hybrid context parallelism."""
    if topology.hybrid_cp is None:
        return None
    tokens = batch.get("tokens")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        found = list(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise BatchError(f"a hybrid-CP micro-batch needs 'tokens' of shape [1, L], found {found}")
    length = tokens.shape[1]
    if not 1 <= length <= topology.seq_length:
        raise BatchError(
            f"the hybrid-CP micro-batch's rows hold {length} tokens; expected 1 to seq_length "
            f"{topology.seq_length}"
        )
    return length


def boundary_capacity(topology: BatchTopology) -> int:
    """The most ``cu_seqlens`` entries a packed row can have: one sequence per token, plus 0."""
    return topology.seq_length + 1


def _as_tensor(key: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise BatchError(f"{key!r} is a {type(value).__name__}, not a tensor: {error}") from None


def prepare_source_batch(
    batch: Mapping[str, Any], topology: BatchTopology
) -> dict[str, torch.Tensor | None]:
    """The source's payload: the keys this position needs, on the topology's device, in the
    dtypes receivers expect, checked against the topology's shapes; all other keys None."""
    position = topology.pipeline.value
    needed = topology.payload_keys
    carried = {
        "attention_mask": ("attention_mask", topology.attention_mask),
        "cu_seqlens": ("packed_sequences", topology.packed_sequences or topology.hybrid_cp),
    }
    for key, (setting, configured) in carried.items():
        if batch.get(key) is not None and not configured and needed:
            raise BatchError(
                f"the batch carries {key!r} but the topology was built with {setting}=False; "
                f"the other TP ranks would not receive it"
            )
    shapes = fixed_shapes(topology, length=hybrid_row_length(batch, topology))
    prepared: dict[str, torch.Tensor | None] = {}
    for key in needed:
        value = batch.get(key)
        if value is None:
            if key in OPTIONAL_KEYS[topology.hybrid_cp is not None]:
                prepared[key] = None
                continue
            raise BatchError(
                f"the batch has no {key!r}, which the {position} pipeline stage needs "
                f"(it has {sorted(k for k, v in batch.items() if v is not None)})"
            )
        tensor = _as_tensor(key, value)
        if key in BOUNDARY_KEYS:
            if tensor.dim() == 2 and tensor.shape[0] == 1:
                tensor = tensor[0]
            if tensor.dim() != 1 or not 2 <= tensor.numel() <= boundary_capacity(topology):
                raise BatchError(
                    f"{key!r} has shape {list(tensor.shape)}; expected [1, n] or [n] with "
                    f"2 <= n <= seq_length + 1 = {boundary_capacity(topology)}"
                )
            tensor = tensor.reshape(1, -1)
        elif key in ("max_seqlen", "local_cp_size"):
            if tensor.numel() != 1:
                raise BatchError(f"{key!r} has {tensor.numel()} values; expected one")
            tensor = tensor.reshape(1)
        elif tuple(tensor.shape) != shapes[key]:
            raise BatchError(
                f"{key!r} has shape {list(tensor.shape)}; the topology expects "
                f"{list(shapes[key])} (micro_batch_size {topology.micro_batch_size}, "
                f"seq_length {topology.seq_length})"
            )
        if tensor.is_floating_point() and not KEY_DTYPES[key].is_floating_point:
            raise BatchError(
                f"{key!r} has dtype {tensor.dtype}; expected {KEY_DTYPES[key]} (or another "
                f"integer type): a floating-point value would be truncated"
            )
        prepared[key] = tensor.to(
            device=topology.device, dtype=KEY_DTYPES[key], non_blocking=tensor.is_pinned()
        )
    return prepared
