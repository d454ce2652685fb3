"""Batches from DataLoader workers through shared memory that is set up once.

torch hands every batch a worker makes to the trainer in new shared memory: for each tensor of
each batch a segment is created, sized, mapped, sent as a descriptor and mapped again, which on
a small machine costs more than making the batch. Here each worker maps one file in
``/dev/shm`` of a few fixed slots, once; it writes a batch into its next slot and sends only
where the tensors lie, and the loader copies them out at once into one ordinary buffer (one
copy, a few hundred KiB for a micro-batch of 4 x 4096).

Why a slot is never overwritten before it is copied: a worker fills its slots in turn, and the
DataLoader hands a worker a new batch only after the trainer took an earlier one, so a worker
never has more than ``prefetch_factor`` batches under way; the loader copies each batch out as
it arrives, and ``prefetch_factor + 2`` slots leave a margin.

Tensors that are not contiguous (a causal mask expanded over the batch, whose storage torch
shares once and then only names) travel torch's way beside the slot. Batches that are not a
mapping, that outgrow the slots, or that find no room in /dev/shm take torch's way whole.

Why nothing is left in /dev/shm: the loader removes a worker's file when it first maps it, and a
worker that ends removes its own. A file the loader never mapped (a batch prefetched, never
read) of a worker torch ended with SIGTERM (at the trainer's exit its daemonic workers are
terminated, and end without their exit handlers) is removed by the trainer's process at its own
exit: each file is named for the process that reads it (:func:`reader_name`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import util
from typing import Any

import numpy
import torch
from torch.utils.data import default_collate, get_worker_info

from megafmt.protocols import CollatedBatch

SHM_DIR = "/dev/shm"
ALIGN = 64
#: slots are made for batches up to this size; larger ones (dense S x S masks) go torch's way
MAX_SLOT_BYTES = 32 << 20


@dataclass(frozen=True)
class SlotBatch:
    """Where a worker wrote a batch: the file, the slot's offset and bytes used; for each
    tensor written its dtype, shape and offset within the slot; the other values (tensors among
    them travel torch's way), and the keys in order."""

    path: str
    offset: int
    nbytes: int
    tensors: dict[str, tuple[torch.dtype, tuple[int, ...], int]]
    others: dict[str, Any]
    keys: tuple[str, ...]


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _layout(batch: Any) -> tuple[list[tuple[str, torch.Tensor, int]], int] | None:
    """The contiguous tensors of ``batch`` in memory, each with its offset in a slot, and the
    bytes used; None when the batch is not a mapping or has no such tensor with any bytes."""
    if not isinstance(batch, Mapping):
        return None
    placed, used = [], 0
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.is_contiguous():
            placed.append((key, value, used))
            used += _aligned(value.numel() * value.element_size())
    return (placed, used) if used else None


class SlotWriter:
    """A worker's slots: made on the first batch, sized for it, reused in turn. Where they
    cannot be made (no room in /dev/shm), every batch takes torch's way."""

    def __init__(self, slots: int, max_slot_bytes: int = MAX_SLOT_BYTES) -> None:
        self.slots = slots
        self.max_slot_bytes = max_slot_bytes
        #: who reads the slots: the process making the writer (the loader's), which the
        #: workers' copies keep (a worker's parent is a fork server under forkserver)
        self.reader = reader_name()
        self.pid = -1
        self.map: mmap.mmap | None = None

    def _open(self, slot_bytes: int) -> None:
        self.pid = os.getpid()
        self.map = None
        if slot_bytes > self.max_slot_bytes:
            return
        # named for the reader, which removes at its exit what is left
        path = os.path.join(
            SHM_DIR, f"{slot_file_prefix(self.reader)}{self.pid}-{uuid.uuid4().hex}"
        )
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return
        # the loader removes the file when it first maps it; this covers a worker that ends first
        util.Finalize(self, _remove, args=(path,), exitpriority=10)
        try:
            # reserved now: a full /dev/shm is an error here, not a SIGBUS on a later write
            os.posix_fallocate(descriptor, 0, slot_bytes * self.slots)
            self.map = mmap.mmap(descriptor, slot_bytes * self.slots)
        except OSError:
            _remove(path)
            return
        finally:
            os.close(descriptor)
        self.path, self.slot_bytes, self.next = path, slot_bytes, 0

    def write(self, batch: Any) -> Any:
        """``batch`` as a :class:`SlotBatch` written into the next slot, or unchanged."""
        layout = _layout(batch)
        if layout is None:
            return batch
        placed, used = layout
        if self.pid != os.getpid():
            self._open(_aligned(used))
        if self.map is None or used > self.slot_bytes:
            return batch
        offset = self.next * self.slot_bytes
        self.next = (self.next + 1) % self.slots
        slot = torch.frombuffer(self.map, dtype=torch.uint8, count=used, offset=offset)
        tensors = {}
        for key, tensor, start in placed:
            size = tensor.numel() * tensor.element_size()
            slot[start : start + size].copy_(tensor.reshape(-1).view(torch.uint8))
            tensors[key] = (tensor.dtype, tuple(tensor.shape), start)
        others = {key: value for key, value in batch.items() if key not in tensors}
        return SlotBatch(self.path, offset, used, tensors, others, tuple(batch))


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


#: each process's name in the slot files it reads (:func:`reader_name`), by pid
_reader_names: dict[int, str] = {}


def reader_name() -> str:
    """This process's name in the slot files it reads: its pid and a random part, so that a
    process of the same pid in another pid namespace sharing /dev/shm (containers given the
    host's IPC) never takes another's files for its own. The first call in a process
    registers the removal, at its exit, of the files left for it to read."""
    pid = os.getpid()
    name = _reader_names.get(pid)
    if name is None:
        name = _reader_names[pid] = f"{pid}-{uuid.uuid4().hex[:16]}"
        # a negative priority runs after multiprocessing ended the daemonic workers
        # (util._exit_function runs priorities >= 0, terminates and joins those children,
        # then runs the rest)
        util.Finalize(None, _remove_left_for, args=(pid, name), exitpriority=-10)
    return name


def slot_file_prefix(reader: str) -> str:
    """How the names of the slot files read by ``reader`` (a :func:`reader_name`) start."""
    return f"megaload-{reader}-"


def _remove_left_for(pid: int, reader: str) -> None:
    """Remove the slot files left for ``reader``, the process ``pid``, to read: run at its
    exit, after its workers ended; nothing in a forked child, which inherits the handler."""
    if os.getpid() != pid:
        return
    prefix = slot_file_prefix(reader)
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(prefix):
                _remove(os.path.join(SHM_DIR, name))


class SlotReader:
    """The loader's side: maps each worker's file once and copies each batch out."""

    def __init__(self, pin_memory: bool) -> None:
        #: copy batches out into pinned memory (batches that went torch's way are pinned by the
        #: DataLoader)
        self.pin_memory = pin_memory
        self.maps: dict[str, mmap.mmap] = {}
        reader_name()  # the files left for this process are removed at its exit

    def read(self, item: Any) -> Any:
        """The batch ``item`` stands for (``item`` itself unless it is a :class:`SlotBatch`)."""
        if not isinstance(item, SlotBatch):
            return item
        mapped = self.maps.get(item.path)
        if mapped is None:
            descriptor = os.open(item.path, os.O_RDONLY)
            try:
                mapped = self.maps[item.path] = mmap.mmap(
                    descriptor, 0, mmap.MAP_SHARED, mmap.PROT_READ
                )
            finally:
                os.close(descriptor)
            _remove(item.path)  # mapped on both sides: nothing is left behind when they end
        buffer = torch.empty(item.nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)
        buffer.numpy()[:] = numpy.frombuffer(mapped, numpy.uint8, item.nbytes, item.offset)
        batch: dict[str, Any] = {}
        for key in item.keys:
            if key in item.tensors:
                dtype, shape, start = item.tensors[key]
                size = torch.Size(shape).numel() * dtype.itemsize
                batch[key] = buffer[start : start + size].view(dtype).view(shape)
            else:
                value = item.others[key]
                pin = self.pin_memory and isinstance(value, torch.Tensor)
                batch[key] = value.pin_memory() if pin else value
        return batch

    def close(self) -> None:
        for mapped in self.maps.values():
            mapped.close()
        self.maps.clear()


def available() -> bool:
    """Whether this system has the shared-memory folder the slots live in."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class Collate:
    """torch's default collation, except for a batch the dataset already collated: a mapping
    its ``__getitems__`` returned, or a ``megafmt.protocols.CollatedBatch`` (what megaindex's
    datasets return), whose ``collated`` is taken as it is. With ``slots``, a batch made in a
    worker is then written into that worker's shared slots."""

    def __init__(self, slots: int | None = None) -> None:
        self.writer = SlotWriter(slots) if slots else None

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, CollatedBatch):
            batch = batch.collated
        elif not isinstance(batch, Mapping):
            batch = default_collate(batch)
        if self.writer is not None and get_worker_info() is not None:
            return self.writer.write(batch)
        return batch
