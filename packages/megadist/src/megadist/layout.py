"""Process groups for a (tp, cp, pp, dp) layout, ranked the way Megatron ranks them.

Megatron's default order is ``tp-cp-ep-dp-pp``: tensor-parallel neighbours have consecutive
global ranks, then context parallelism, then data parallelism, and pipeline stages are the
outermost. With expert parallelism left out, global rank
``r = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))``.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from megadist.errors import TopologyError
from megadist.topology import BatchTopology, HybridCPGroups, PipelinePosition

logger = logging.getLogger(__name__)

#: the layout's dimensions, innermost first
DIMENSIONS = ("tp", "cp", "dp", "pp")
#: how long a collective of a group waits for a peer: Megatron-LM's
#: ``--distributed-timeout-minutes`` default (10 minutes at the seed commit)
DEFAULT_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's coordinates in a (tp, cp, dp, pp) layout and the groups it belongs to."""

    sizes: dict[str, int]
    coordinates: dict[str, int]
    groups: dict[str, dist.ProcessGroup]
    timeout: timedelta = DEFAULT_TIMEOUT
    """how long each group's collectives wait for a peer before failing"""
    hybrid_cp: HybridCPGroups | None = None
    """the groups of hybrid context parallelism, when they were built"""

    @property
    def pipeline_position(self) -> PipelinePosition:
        return PipelinePosition.of(self.coordinates["pp"], self.sizes["pp"])

    def topology(self, micro_batch_size: int, seq_length: int, **options: Any) -> BatchTopology:
        """A ``BatchTopology`` for this rank; ``options`` are BatchTopology's other fields."""
        options.setdefault("pipeline", self.pipeline_position)
        options.setdefault("hybrid_cp", self.hybrid_cp)
        return BatchTopology(
            micro_batch_size=micro_batch_size,
            seq_length=seq_length,
            tp_group=self.groups["tp"],
            cp_group=self.groups["cp"],
            **options,
        )

    def describe(self) -> str:
        """``tp 1/2 cp 0/2 dp 0/1 pp 1/2 (last)``."""
        parts = [f"{name} {self.coordinates[name]}/{self.sizes[name]}" for name in DIMENSIONS]
        return " ".join(parts) + f" ({self.pipeline_position.value})"


def rank_of(coordinates: dict[str, int], sizes: dict[str, int]) -> int:
    """The global rank at ``coordinates``."""
    rank = 0
    for name in reversed(DIMENSIONS):
        rank = rank * sizes[name] + coordinates[name]
    return rank


def coordinates_of(rank: int, sizes: dict[str, int]) -> dict[str, int]:
    """The coordinates of global rank ``rank``."""
    coordinates = {}
    for name in DIMENSIONS:
        rank, coordinates[name] = divmod(rank, sizes[name])
    return coordinates


def job_timeout() -> timedelta:
    """The timeout the job gave ``init_process_group`` (the default group's; the longest of its
    backends', which are the same unless set apart): Megatron-LM gives its groups the same
    ``--distributed-timeout-minutes`` as the world, and torch's ``new_group`` without one would
    take torch's own default (30 minutes for gloo) instead.

    torch has no public reader of a group's timeout, so this is the one place that reads its
    private backend options; where they are missing (another torch release, a backend without
    them) it falls back to :data:`DEFAULT_TIMEOUT`, Megatron-LM's default, and logs that."""
    world = dist.group.WORLD
    try:
        return max(world._get_backend(device).options._timeout for device in world._device_types)
    except (AttributeError, RuntimeError, ValueError) as error:
        logger.warning(
            "cannot read the job's process-group timeout from torch %s (%s); the groups wait "
            "%s, Megatron-LM's default: pass build_parallel_groups(timeout=...) to choose",
            torch.__version__,
            error,
            DEFAULT_TIMEOUT,
        )
        return DEFAULT_TIMEOUT


def as_timeout(timeout: timedelta | float | None) -> timedelta:
    """``timeout`` (a timedelta, or seconds; None: the job's) as a positive timedelta."""
    if timeout is None:
        return job_timeout()
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if value <= timedelta(0):
        raise TopologyError(f"a group timeout must be positive, found {value}")
    return value


def build_parallel_groups(
    tp: int = 1,
    cp: int = 1,
    pp: int = 1,
    dp: int | None = None,
    *,
    timeout: timedelta | float | None = None,
    hybrid_cp: bool = False,
) -> ParallelLayout:
    """Create every tensor-, context-, data- and pipeline-parallel group of the default world
    and return this rank's. Every rank must call it (``new_group`` is collective). ``dp`` None
    takes what the world size leaves. Each group's collectives wait at most ``timeout`` (a
    timedelta or seconds; None, the default: the job's, as ``init_process_group`` was given it)
    for a peer: a stalled peer ends in a ``CollectiveError`` naming the group and the ranks,
    not in torch's 30 minute wait.
    ``hybrid_cp`` also builds the groups of hybrid context parallelism (``HybridCPGroups``)."""
    timeout = as_timeout(timeout)
    world = dist.get_world_size()
    if min(tp, cp, pp, 1 if dp is None else dp) < 1:
        raise TopologyError(
            f"parallel sizes must be positive, found tp {tp} cp {cp} pp {pp} dp {dp}"
        )
    if dp is None:
        dp, leftover = divmod(world, tp * cp * pp)
        if leftover or dp == 0:
            raise TopologyError(
                f"world size {world} is not a multiple of tp x cp x pp = {tp} x {cp} x {pp}"
            )
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    if tp * cp * dp * pp != world:
        raise TopologyError(
            f"tp x cp x dp x pp = {tp} x {cp} x {dp} x {pp} does not equal the world size {world}"
        )
    me = coordinates_of(dist.get_rank(), sizes)
    groups = {}
    for name in DIMENSIONS:
        others = [other for other in DIMENSIONS if other != name]
        for fixed in itertools.product(*(range(sizes[other]) for other in others)):
            ranks = [
                rank_of({**dict(zip(others, fixed, strict=True)), name: index}, sizes)
                for index in range(sizes[name])
            ]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                groups[name] = group
    hybrid = _hybrid_cp_groups(sizes, me, groups["dp"], timeout) if hybrid_cp else None
    return ParallelLayout(
        sizes=sizes, coordinates=me, groups=groups, timeout=timeout, hybrid_cp=hybrid
    )


def hybrid_block_sizes(dp_cp_size: int) -> list[int]:
    """The sizes of the aligned hybrid CP blocks below a DPxCP group of ``dp_cp_size`` ranks:
    2, 4, ... up to the largest power of two below it (Megatron's create_hybrid_dp_cp_groups)."""
    return [2**power for power in range(1, int(math.log2(dp_cp_size)))]


def _hybrid_cp_groups(
    sizes: dict[str, int],
    me: dict[str, int],
    dp_group: dist.ProcessGroup,
    timeout: timedelta,
) -> HybridCPGroups:
    """Create every DPxCP group and its aligned power-of-two blocks (collective on all ranks);
    return this rank's."""
    mine_dp_cp = None
    blocks = []
    for tp_rank, pp_rank in itertools.product(range(sizes["tp"]), range(sizes["pp"])):
        ranks = sorted(
            rank_of({"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}, sizes)
            for cp_rank in range(sizes["cp"])
            for dp_rank in range(sizes["dp"])
        )
        group = dist.new_group(ranks, timeout=timeout)
        inside = (tp_rank, pp_rank) == (me["tp"], me["pp"])
        if inside:
            mine_dp_cp = group
        for size in hybrid_block_sizes(len(ranks)):
            for start in range(0, len(ranks), size):
                block = dist.new_group(ranks[start : start + size], timeout=timeout)
                if inside and dist.get_rank() in ranks[start : start + size]:
                    blocks.append((size, block))
    return HybridCPGroups(dp_group=dp_group, dp_cp_group=mine_dp_cp, blocks=tuple(blocks))
