"""Counting the broadcasts a piece of code issues: how tests and the benchmark check how many
collectives a micro-batch costs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist


@contextmanager
def counting_broadcasts() -> Iterator[list[int]]:
    """Within the block, every ``torch.distributed.broadcast`` of this process appends the byte
    size of its tensor to the yielded list."""
    sizes: list[int] = []
    original = dist.broadcast

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sizes.append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

    dist.broadcast = counting
    try:
        yield sizes
    finally:
        dist.broadcast = original
