"""``broadcast_batch``: the TP source's micro-batch, copied to every rank of its TP group.

Two wire protocols give the same tensors:

- ``per_tensor``: Megatron's get_batch_on_this_tp_rank, one broadcast per tensor and two per
  packed-sequence boundary tensor (its length, then its values): 2 to 10 collectives.
- ``packed``: the micro-batch's tensors in one flat byte buffer behind a small header, one
  collective. Boundaries get their largest possible size (seq_length + 1 entries) so the
  buffer size is known in advance. An attention mask ([mbs, 1, S, S], larger than everything
  else together) follows in a second broadcast of its own, because copying it into the buffer
  costs more than the broadcast it saves. The header also carries the source's status: when
  the source's loader is exhausted or its batch is malformed, the other ranks raise too
  instead of waiting for a broadcast that never comes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from megadist.errors import BatchError, SourceError
from megadist.keys import BATCH_KEYS, BOUNDARY_KEYS, KEY_DTYPES
from megadist.payload import boundary_capacity, fixed_shapes, prepare_source_batch
from megadist.topology import BatchTopology

Protocol = Literal["packed", "per_tensor"]
PROTOCOLS: tuple[str, ...] = ("packed", "per_tensor")

#: header status codes of the packed protocol
OK, FAILED, EXHAUSTED = 0, 1, 2
_HEADER = 4  # int64: status, number of cu_seqlens, number of cu_seqlens_padded, message bytes
_ALIGN = 8
#: sent after the packed buffer by themselves, without a copy (their size is O(S^2))
_UNPACKED = ("attention_mask",)


def _broadcast(tensor: torch.Tensor, topology: BatchTopology) -> None:
    dist.broadcast(tensor, src=topology.tp_src_rank, group=topology.tp_group)


def check_protocol(protocol: str) -> None:
    """Refuse an unknown protocol name."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown broadcast protocol {protocol!r}; choose one of {PROTOCOLS}")


@dataclass(frozen=True)
class _Section:
    key: str
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def view(self, buffer: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """This section of ``buffer`` as a tensor of ``shape`` (default: the whole section)."""
        shape = self.shape if shape is None else shape
        size = math.prod(shape) * self.dtype.itemsize
        return buffer[self.offset : self.offset + size].view(self.dtype).view(shape)


def _layout(
    topology: BatchTopology, shapes: dict[str, tuple[int, ...]]
) -> tuple[list[_Section], int]:
    """The packed buffer's sections after the header, and its size in bytes."""
    offset = _HEADER * 8
    sections = []
    for key in topology.payload_keys:
        if key in _UNPACKED:
            continue
        shape = (1, boundary_capacity(topology)) if key in BOUNDARY_KEYS else shapes[key]
        section = _Section(key, offset, shape, KEY_DTYPES[key])
        sections.append(section)
        offset += -(-section.nbytes // _ALIGN) * _ALIGN
    return sections, offset


def _send_packed(
    payload: Mapping[str, torch.Tensor | None],
    topology: BatchTopology,
    shapes: dict[str, tuple[int, ...]],
    status: int = OK,
    message: str = "",
) -> None:
    sections, size = _layout(topology, shapes)
    buffer = torch.empty(size, dtype=torch.uint8, device=topology.device)  # padding unread
    header = buffer[: _HEADER * 8].view(torch.int64)
    text = message.encode("utf-8")[: size - _HEADER * 8]
    values = [status, 0, 0, len(text)]
    if status == OK:
        for section in sections:
            tensor = payload[section.key]
            if tensor is None:
                continue
            if section.key in BOUNDARY_KEYS:
                values[1 + BOUNDARY_KEYS.index(section.key)] = tensor.numel()
            section.view(buffer, tuple(tensor.shape)).copy_(tensor)
    else:
        buffer[_HEADER * 8 : _HEADER * 8 + len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    header.copy_(torch.tensor(values, dtype=torch.int64))
    _broadcast(buffer, topology)
    if status == OK:
        for key in _UNPACKED:
            if key in topology.payload_keys:
                _broadcast(payload[key].contiguous(), topology)


def _receive_packed(
    topology: BatchTopology, shapes: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor | None]:
    sections, size = _layout(topology, shapes)
    buffer = torch.empty(size, dtype=torch.uint8, device=topology.device)
    _broadcast(buffer, topology)
    status, *counts, length = buffer[: _HEADER * 8].view(torch.int64).tolist()
    if status == EXHAUSTED:
        raise StopIteration
    if status != OK:
        text = bytes(buffer[_HEADER * 8 : _HEADER * 8 + length].tolist()).decode("utf-8", "replace")
        raise SourceError(f"TP source rank {topology.tp_src_rank} could not send its batch: {text}")
    batch: dict[str, torch.Tensor | None] = dict.fromkeys(BATCH_KEYS)
    for section in sections:
        if section.key in BOUNDARY_KEYS:
            count = counts[BOUNDARY_KEYS.index(section.key)]
            batch[section.key] = section.view(buffer, (1, count)) if count else None
        else:
            batch[section.key] = section.view(buffer)
    for key in _UNPACKED:
        if key in topology.payload_keys:
            batch[key] = torch.empty(shapes[key], dtype=KEY_DTYPES[key], device=topology.device)
            _broadcast(batch[key], topology)
    return batch


def _send_per_tensor(payload: Mapping[str, torch.Tensor | None], topology: BatchTopology) -> None:
    for key in topology.payload_keys:
        tensor = payload[key]
        if key in BOUNDARY_KEYS:
            count = 0 if tensor is None else tensor.numel()
            _broadcast(torch.tensor(count, dtype=torch.int64, device=topology.device), topology)
            if count == 0:
                continue
        _broadcast(tensor.contiguous(), topology)


def _receive_per_tensor(
    topology: BatchTopology, shapes: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor | None]:
    batch: dict[str, torch.Tensor | None] = dict.fromkeys(BATCH_KEYS)
    for key in topology.payload_keys:
        shape = shapes.get(key)
        if key in BOUNDARY_KEYS:
            count = torch.empty((), dtype=torch.int64, device=topology.device)
            _broadcast(count, topology)
            if int(count) == 0:
                continue
            shape = (1, int(count))
        tensor = torch.empty(shape, dtype=KEY_DTYPES[key], device=topology.device)
        _broadcast(tensor, topology)
        batch[key] = tensor
    return batch


def send_payload(
    payload: Mapping[str, torch.Tensor | None],
    topology: BatchTopology,
    shapes: dict[str, tuple[int, ...]],
    protocol: Protocol,
) -> None:
    """Broadcast a prepared payload (``prepare_source_batch``, maybe split by a built-in
    partitioner) whose fixed keys have ``shapes``. Source side; the ranks waiting in
    ``receive_payload`` must pass the same ``shapes`` and ``protocol``."""
    if protocol == "packed":
        _send_packed(payload, topology, shapes)
    else:
        _send_per_tensor(payload, topology)


def send_failure(
    topology: BatchTopology,
    shapes: dict[str, tuple[int, ...]],
    protocol: Protocol,
    error: BaseException,
) -> None:
    """Tell the waiting ranks that no batch comes: they raise ``StopIteration`` if ``error`` is
    one, else ``SourceError`` with its message. Only the packed protocol can carry this; with
    ``per_tensor`` the other ranks wait until the group's timeout, as in Megatron."""
    if protocol == "packed":
        status = EXHAUSTED if isinstance(error, StopIteration) else FAILED
        _send_packed({}, topology, shapes, status, f"{type(error).__name__}: {error}")


def receive_payload(
    topology: BatchTopology, shapes: dict[str, tuple[int, ...]], protocol: Protocol
) -> dict[str, torch.Tensor | None]:
    """The source's payload, on a rank other than the source."""
    if protocol == "packed":
        return _receive_packed(topology, shapes)
    return _receive_per_tensor(topology, shapes)


def broadcast_batch(
    batch: Mapping[str, Any] | None,
    topology: BatchTopology,
    *,
    protocol: Protocol = "packed",
) -> dict[str, torch.Tensor | None]:
    """Megatron's get_batch_on_this_tp_rank: the source (TP rank 0) passes its loader's batch,
    the other TP ranks pass None, and every rank gets the same dict of ``BATCH_KEYS``: the keys
    its pipeline position needs (``topology.payload_keys``) as tensors on the topology's device,
    the others None (the source's too, unlike Megatron, so a TP group agrees on what it holds).
    """
    check_protocol(protocol)
    if not topology.payload_keys:
        return dict.fromkeys(BATCH_KEYS)
    shapes = fixed_shapes(topology)
    if not topology.is_source:
        return receive_payload(topology, shapes, protocol)
    try:
        payload = prepare_source_batch(_require(batch, topology), topology)
    except Exception as error:  # the waiting ranks must hear of it, whatever it is
        if topology.tp_size > 1:
            send_failure(topology, shapes, protocol, error)
        raise
    if topology.tp_size > 1:
        send_payload(payload, topology, shapes, protocol)
    return complete(payload)


def _require(batch: Mapping[str, Any] | None, topology: BatchTopology) -> Mapping[str, Any]:
    if batch is None:
        raise BatchError(
            f"TP rank {topology.tp_rank} is the source of its group and must pass a batch"
        )
    return batch


def complete(payload: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """``payload`` with every ``BATCH_KEYS`` entry present."""
    return {key: payload.get(key) for key in BATCH_KEYS}
