"""``broadcast_batch``: the TP source's micro-batch, copied to every rank of its TP group.

Before any data moves, the ranks of the group agree on what is sent (``megadist.agreement``: one
all-reduce of a small fixed-size header carrying each rank's description of the micro-batch and
the source's status), so ranks configured differently all raise the same ``AgreementError``
instead of exchanging garbage, and a source whose loader is exhausted or whose batch is
malformed stops the others at once. Then one of two wire protocols gives the same tensors:

- ``per_tensor``: Megatron's get_batch_on_this_tp_rank, one broadcast per tensor and two per
  packed-sequence boundary tensor (its length, then its values): 2 to 10 collectives.
- ``packed``: the micro-batch's tensors in one flat byte buffer, one collective. Boundaries get
  their largest possible size (seq_length + 1 entries) so the buffer size is known in advance
  (and agreed on); their real lengths come with the header. An attention mask ([mbs, 1, S, S],
  larger than everything else together) follows in a second broadcast of its own, because
  copying it into the buffer costs more than the broadcast it saves.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from megadist import collectives
from megadist.agreement import EXHAUSTED, FAILED, Description, agree, sizes_sent
from megadist.errors import BatchError
from megadist.keys import BATCH_KEYS, BOUNDARY_KEYS, KEY_DTYPES
from megadist.payload import boundary_capacity, fixed_shapes, prepare_source_batch
from megadist.topology import BatchTopology

Protocol = Literal["packed", "per_tensor"]
PROTOCOLS: tuple[str, ...] = ("packed", "per_tensor")

_ALIGN = 8
#: sent after the packed buffer by themselves, without a copy (their size is O(S^2))
_UNPACKED = ("attention_mask",)
#: a source's payload: the keys its position needs, as tensors (None: an absent boundary)
Payload = dict[str, torch.Tensor | None]


def _broadcast(tensor: torch.Tensor, topology: BatchTopology) -> None:
    collectives.broadcast(tensor, topology.tp_src_rank, topology.tp_group, "TP")


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
    """The packed buffer's sections, and its size in bytes."""
    offset = 0
    sections = []
    for key in topology.payload_keys:
        if key in _UNPACKED:
            continue
        shape = (1, boundary_capacity(topology)) if key in BOUNDARY_KEYS else shapes[key]
        section = _Section(key, offset, shape, KEY_DTYPES[key])
        sections.append(section)
        offset += -(-section.nbytes // _ALIGN) * _ALIGN
    return sections, offset


@functools.lru_cache(maxsize=256)
def describe(
    topology: BatchTopology, protocol: str, split: str | None, transfers: bool
) -> Description:
    """What this rank sends or expects with ``topology`` and ``protocol``, the source having
    applied the built-in CP ``split`` (None: none), the call moving data or not (``transfers``).
    Computed once per distinct topology: a new but equal topology per call costs a lookup."""
    shapes = fixed_shapes(topology, split)
    _, size = _layout(topology, shapes)
    sent = [(key, shapes.get(key), str(KEY_DTYPES[key])) for key in topology.payload_keys]
    digest = hashlib.blake2b(repr(sent).encode(), digest_size=7).digest()
    return Description.of(
        topology, PROTOCOLS, protocol, split, transfers, size, int.from_bytes(digest, "little")
    )


def _send_packed(
    payload: Mapping[str, torch.Tensor | None],
    topology: BatchTopology,
    shapes: dict[str, tuple[int, ...]],
) -> None:
    sections, size = _layout(topology, shapes)
    buffer = torch.empty(size, dtype=torch.uint8, device=topology.device)  # padding unread
    for section in sections:
        tensor = payload[section.key]
        if tensor is not None:
            section.view(buffer, tuple(tensor.shape)).copy_(tensor)
    _broadcast(buffer, topology)
    for key in _UNPACKED:
        if key in topology.payload_keys:
            _broadcast(payload[key].contiguous(), topology)


def _receive_packed(
    topology: BatchTopology, shapes: dict[str, tuple[int, ...]], counts: tuple[int, int, int]
) -> Payload:
    sections, size = _layout(topology, shapes)
    buffer = torch.empty(size, dtype=torch.uint8, device=topology.device)
    _broadcast(buffer, topology)
    batch: Payload = dict.fromkeys(BATCH_KEYS)
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


def share_batch(
    prepare: Callable[[], Payload],
    topology: BatchTopology,
    protocol: Protocol,
    *,
    split: str | None = None,
    transfers: bool = True,
) -> Payload:
    """The source's payload on every rank of its TP group: the source calls ``prepare`` (its
    payload of ``topology.payload_keys``, CP-split by the built-in ``split`` when one is named,
    so in the shapes ``fixed_shapes(topology, split)`` gives), the group agrees, then the source
    sends and the others receive. ``transfers`` False: the call moves no data (a middle pipeline
    stage), but the group still agrees that it does not. Nothing is exchanged in a TP group of
    one."""
    if topology.tp_size == 1:
        return prepare() if transfers else {}
    description = describe(topology, protocol, split, transfers)
    if not topology.is_source:
        counts = agree(topology, description, PROTOCOLS)
        if not transfers:
            return {}
        shapes = fixed_shapes(topology, split, counts[2] or None)
        if protocol == "packed":
            return _receive_packed(topology, shapes, counts)
        return _receive_per_tensor(topology, shapes)
    try:
        payload = prepare() if transfers else {}
    except Exception as error:  # the waiting ranks must hear of it, whatever it is
        status = EXHAUSTED if isinstance(error, StopIteration) else FAILED
        message = f"{type(error).__name__}: {error}"
        agree(topology, description, PROTOCOLS, status=status, message=message)
        raise
    counts = sizes_sent(payload, topology.hybrid_cp is not None)
    agree(topology, description, PROTOCOLS, counts=counts)
    shapes = fixed_shapes(topology, split, counts[2] or None)
    if transfers and protocol == "packed":
        _send_packed(payload, topology, shapes)
    elif transfers:
        _send_per_tensor(payload, topology)
    return payload


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
    Ranks whose topologies or protocols differ raise ``AgreementError``; when the source's
    batch is malformed it raises ``BatchError`` and the others ``SourceError``.
    """
    check_protocol(protocol)
    payload = share_batch(
        lambda: prepare_source_batch(_require(batch, topology), topology),
        topology,
        protocol,
        transfers=topology.reads_data,
    )
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
