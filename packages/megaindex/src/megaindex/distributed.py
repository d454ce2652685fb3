"""The little of torch.distributed that index building needs, usable without a process group."""

from __future__ import annotations

import torch


def global_rank() -> int | None:
    """This process's global rank, or None when no process group is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def builds_shared_files() -> bool:
    """Whether this process writes shared caches: global rank 0, or a process on its own."""
    return global_rank() in (None, 0)


def barrier() -> None:
    """Wait for every rank (a no-op without a process group)."""
    if global_rank() is not None:
        torch.distributed.barrier()
