"""The collectives megadist issues, and counting them.

``broadcast``, ``all_reduce_max``, ``all_gather`` and ``all_to_all`` run torch's collectives on
a group and turn their failures (a peer that never sends within the group's timeout, a peer that
left) into a
:class:`~megadist.errors.CollectiveError` naming the group, its ranks, this rank and the rank
waited for. ``counting_collectives`` is how tests and the benchmark check how many collectives
a micro-batch costs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from megadist.errors import CollectiveError


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    """The global ranks of ``group`` (the default group for None)."""
    return dist.get_process_group_ranks(group or dist.group.WORLD)


def _others(group: dist.ProcessGroup | None) -> list[int]:
    return [rank for rank in group_ranks(group) if rank != dist.get_rank()]


def _failed(
    what: str, waited: list[int], name: str, group: dist.ProcessGroup | None, error: Exception
) -> None:
    raise CollectiveError(
        f"{what} in the {name} group of global ranks {group_ranks(group)} failed on global rank "
        f"{dist.get_rank()}, waiting for global rank{'s' if len(waited) > 1 else ''} "
        f"{', '.join(map(str, waited))} (stalled past the group's timeout, or gone): {error}"
    ) from error


def broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None, name: str) -> None:
    """``tensor`` from global rank ``src`` to every rank of ``group`` (``name`` in errors)."""
    try:
        dist.broadcast(tensor, src=src, group=group)
    except RuntimeError as error:
        _failed("a broadcast", [src], name, group, error)


def all_reduce_max(tensor: torch.Tensor, group: dist.ProcessGroup | None, name: str) -> None:
    """``tensor``, in place, as its elementwise maximum over every rank of ``group``."""
    try:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    except RuntimeError as error:
        _failed("an all-reduce", _others(group), name, group, error)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None, name: str) -> torch.Tensor:
    """Every rank's ``tensor`` of ``group``, stacked in group order."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    try:
        dist.all_gather(gathered, tensor, group=group)
    except RuntimeError as error:
        _failed("an all-gather", _others(group), name, group, error)
    return torch.stack(gathered)


def all_to_all(
    received: torch.Tensor,
    sent: torch.Tensor,
    received_sizes: list[int],
    sent_sizes: list[int],
    group: dist.ProcessGroup | None,
    name: str,
) -> None:
    """``sent`` cut into ``sent_sizes`` pieces, piece i to rank i of ``group``; ``received``
    filled with the pieces from each rank in group order, ``received_sizes`` long."""
    try:
        dist.all_to_all_single(
            received,
            sent,
            output_split_sizes=received_sizes,
            input_split_sizes=sent_sizes,
            group=group,
        )
    except RuntimeError as error:
        _failed("an all-to-all", _others(group), name, group, error)


@contextmanager
def counting_collectives() -> Iterator[list[tuple[str, int]]]:
    """Within the block, every ``torch.distributed`` broadcast, all-reduce, all-gather and
    all-to-all of this process appends (its name, the byte size of this rank's tensor: the one it
    sends, for the last two) to the yielded list."""
    calls: list[tuple[str, int]] = []
    originals = {
        "broadcast": dist.broadcast,
        "all_reduce": dist.all_reduce,
        "all_gather": dist.all_gather,
        "all_to_all_single": dist.all_to_all_single,
    }

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            tensor = args[1] if name in ("all_gather", "all_to_all_single") else args[0]
            calls.append((name, tensor.numel() * tensor.element_size()))
            return originals[name](*args, **kwargs)

        return call

    for name in originals:
        setattr(dist, name, counting(name))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
