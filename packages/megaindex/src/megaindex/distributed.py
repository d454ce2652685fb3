"""The little of torch.distributed that index building needs, usable without a process group.

The barrier is a store-based one with a timeout: every rank announces itself in the process
group's key-value store and waits for the others; a rank that waits too long raises naming the
ranks that never arrived (megatron-core's plain barrier hangs forever when one rank skips the
dataset builder).
"""

from __future__ import annotations

import itertools
import time

import torch

from megaindex.errors import MegaindexError

_barriers = itertools.count()


class BarrierTimeoutError(MegaindexError, TimeoutError):
    """Some ranks did not reach a dataset-building barrier in time."""


def global_rank() -> int | None:
    """This process's global rank, or None when no process group is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def builds_shared_files() -> bool:
    """Whether this process writes shared caches: global rank 0, or a process on its own."""
    return global_rank() in (None, 0)


def _default_store() -> object | None:
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def barrier(timeout: float | None = None) -> None:
    """Wait for every rank (a no-op without a process group), at most ``timeout`` seconds."""
    rank = global_rank()
    if rank is None:
        return
    store = _default_store()
    if timeout is None or store is None:
        torch.distributed.barrier()
        return
    world = torch.distributed.get_world_size()
    key = f"megaindex/barrier/{next(_barriers)}"
    store.set(f"{key}/rank/{rank}", "1")
    arrived = store.add(f"{key}/count", 1)
    deadline = time.monotonic() + timeout
    pause = 0.001
    while arrived < world:
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([f"{key}/rank/{r}"])]
            raise BarrierTimeoutError(
                f"rank {rank} waited {timeout:g} s at a dataset-building barrier for ranks "
                f"{missing} (of {world}), which never arrived: every rank must call "
                "BlendedMegatronDatasetBuilder.build(), those that hold no data too"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        arrived = store.add(f"{key}/count", 0)
