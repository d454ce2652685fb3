"""Hybrid context parallelism's balancing: which packed sub-sequences each DPxCP rank trains on,
in which groups of ranks, step by step. The rule of the seed commit's ``BalancedCPScheduler``
(``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``), decision for decision.

A sub-sequence of length L needs ``2 ** ceil(log2(L / max_seq_len_per_rank))`` ranks (at least
one) working on it together, and costs each of them ``L * L / ranks``. The sub-sequences of a
global batch, longest first, are dealt out in rounds ("groups"): in each round every rank gets
work, ranks that share a sub-sequence form a CP group of that size, and a round closes once the
ranks' loads are within 5% of each other. Within a round:

1. the sub-sequences are cut into as many buckets of roughly equal work as there are distinct
   CP sizes among them;
2. the first sub-sequence (in bucket order) that fits is placed: on the least loaded existing
   group of its size, or on the least loaded free ranks if they are less loaded still;
3. once a smaller CP size than the round's first one has been placed, the round ends as soon
   as the loads are balanced;
4. the last sub-sequence of the most loaded group goes back while that narrows the spread;
5. ranks left without work take a share of the smallest group's sub-sequence, whose group
   doubles (pushing the groups after it up the ranks) until every rank has work.

What the seed commit asserts (a sub-sequence longer than all ranks together can hold, a push
past the last rank, a round that loses work) is a :class:`~megaload.errors.SchedulingError`
here, in the same cases.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence

from megaload.errors import SchedulingError

#: the balance a round stops at: the spread of the loads within this share of the largest
BALANCE_SLACK = 0.05
#: a bucket closes when the next sub-sequence would take it past this share of its target
BUCKET_OVERSHOOT = 1.1

SubSequence = tuple[int, int]
"""(global id, length) of one packed sub-sequence."""


class BalancedCPScheduler:
    """Groups of sub-sequences for ``total_ranks`` DPxCP ranks that each hold at most
    ``max_seq_len_per_rank`` tokens of a sequence (Megatron's ``max_seqlen_per_dp_cp_rank``)."""

    def __init__(self, max_seq_len_per_rank: int, total_ranks: int) -> None:
        if max_seq_len_per_rank < 1:
            raise SchedulingError(
                f"max_seq_len_per_rank must be positive, found {max_seq_len_per_rank}"
            )
        if total_ranks < 1:
            raise SchedulingError(f"total_ranks must be positive, found {total_ranks}")
        self.max_seq_len_per_rank = max_seq_len_per_rank
        self.total_ranks = total_ranks

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (the scheduler lives as long as the run)
    def ranks_needed(self, length: int) -> int:
        """The CP size a sub-sequence of ``length`` tokens needs: a power of two."""
        return max(1, 2 ** math.ceil(math.log2(length / self.max_seq_len_per_rank)))

    def workload(self, length: int, cp_size: int | None = None) -> float:
        """The relative cost of a sub-sequence to each of the ``cp_size`` ranks sharing it
        (default: as many as it needs): attention grows with the square of the length."""
        return length * length / (self.ranks_needed(length) if cp_size is None else cp_size)

    def schedule(self, sub_sequences: Sequence[SubSequence]) -> list[list[list[int]]]:
        """The global ids each rank trains on, group by group: ``result[g][r]``."""
        return self.groups_and_sub_sequences(sub_sequences)[1]

    def groups_and_sub_sequences(
        self, sub_sequences: Sequence[SubSequence]
    ) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
        """Per group and rank, the lengths and the global ids of the sub-sequences it trains on
        (Megatron's ``get_groups_and_subsamples``)."""
        lengths: list[list[list[int]]] = []
        ids: list[list[list[int]]] = []
        pending = sorted(sub_sequences, key=lambda item: item[1], reverse=True)
        while pending:
            round_ = _Round(self)
            pending = round_.fill(pending)
            lengths.append(round_.lengths)
            ids.append(round_.ids)
        return lengths, ids

    def buckets(self, sub_sequences: Sequence[SubSequence]) -> list[deque[SubSequence]]:
        """``sub_sequences`` in order, cut into buckets of about equal work, one per distinct
        CP size; the last ones are kept for the buckets still to come."""
        wanted = len({self.ranks_needed(length) for _, length in sub_sequences})
        target = sum(self.workload(length) for _, length in sub_sequences) / wanted
        buckets: list[deque[SubSequence]] = []
        current: list[SubSequence] = []
        current_work = 0.0
        for position, item in enumerate(sub_sequences):
            work = self.workload(item[1])
            too_much = current_work + work > target * BUCKET_OVERSHOOT
            # the seed counts a closed bucket twice here: once in its list, once in the budget
            keep_for_rest = len(sub_sequences) - position <= wanted - 2 * len(buckets)
            if current and (too_much or keep_for_rest):
                buckets.append(deque(current))
                current, current_work = [], 0.0
            current.append(item)
            current_work += work
        if current:
            buckets.append(deque(current))
        return buckets


class _Round:
    """One group of sub-sequences dealt to every rank."""

    def __init__(self, scheduler: BalancedCPScheduler) -> None:
        self.scheduler = scheduler
        ranks = scheduler.total_ranks
        self.lengths: list[list[int]] = [[] for _ in range(ranks)]
        self.ids: list[list[int]] = [[] for _ in range(ranks)]
        self.loads = [0.0] * ranks
        self.group_of: list[int | None] = [None] * ranks
        self.members: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}

    def _free(self) -> list[int]:
        return [rank for rank, group in enumerate(self.group_of) if group is None]

    def _groups_of_size(self, size: int) -> list[int]:
        return [group for group, members in self.sizes.items() if members == size]

    def _fits(self, size: int) -> bool:
        return bool(self._groups_of_size(size)) or len(self._free()) >= size

    def fill(self, pending: list[SubSequence]) -> list[SubSequence]:
        """Deal from ``pending`` (longest first); return what this round leaves."""
        if not pending:
            return []
        needed = self.scheduler.ranks_needed
        buckets = self.scheduler.buckets(pending)
        first_size = None
        check_balance = False
        while buckets:
            found = next(
                (
                    (index, bucket[0])
                    for index, bucket in enumerate(buckets)
                    if bucket and self._fits(needed(bucket[0][1]))
                ),
                None,
            )
            if found is None:
                break
            index, (sample_id, length) = found
            size = needed(length)
            if first_size is None:
                first_size = size
            self._place(sample_id, length, self._ranks_for(size))
            buckets[index].popleft()
            while buckets and not buckets[0]:
                buckets.pop(0)
            check_balance = check_balance or size < first_size
            if check_balance and buckets and self._balanced():
                break
        leftovers = [item for bucket in buckets for item in bucket]
        self._give_back_overload(leftovers)
        before = sum(map(len, self.lengths))
        while any(not work for work in self.lengths):
            self._widen_smallest_group()
        if sum(map(len, self.lengths)) < before:
            raise SchedulingError(
                f"widening groups onto idle ranks lost sub-sequences: {before} were placed, "
                f"{sum(map(len, self.lengths))} remain (the seed commit asserts here too)"
            )
        return leftovers

    def _ranks_for(self, size: int) -> list[int]:
        """The least loaded group of ``size`` ranks, or new ranks if they are less loaded."""
        best, best_load = None, math.inf
        for group in self._groups_of_size(size):
            load = max(self.loads[rank] for rank in self.members[group])
            if load < best_load:
                best, best_load = group, load
        free = self._free()
        if len(free) >= size:
            fresh = sorted(free, key=lambda rank: self.loads[rank])[:size]
            if self.loads[fresh[-1]] < best_load:
                group = len(self.sizes)
                self.members[group], self.sizes[group] = fresh, size
                for rank in fresh:
                    self.group_of[rank] = group
                return fresh
        return self.members[best]

    def _place(self, sample_id: int, length: int, ranks: list[int]) -> None:
        cost = self.scheduler.workload(length)
        for rank in ranks:
            self.lengths[rank].append(length)
            self.ids[rank].append(sample_id)
            self.loads[rank] += cost

    def _balanced(self) -> bool:
        return max(self.loads) - min(self.loads) <= BALANCE_SLACK * max(self.loads)

    def _give_back_overload(self, leftovers: list[SubSequence]) -> None:
        """Take the last sub-sequence off the most loaded group while that narrows the spread
        (and no rank is idle: widening groups handles those)."""
        while not self._balanced() and min(self.loads) != 0:
            busiest = self.loads.index(max(self.loads))
            if len(self.lengths[busiest]) <= 1:
                return
            members = self.members[self.group_of[busiest]]
            length = self.lengths[busiest][-1]
            cost = self.scheduler.workload(length)
            after = list(self.loads)
            for rank in members:
                after[rank] -= cost
            if max(after) - min(after) >= max(self.loads) - min(self.loads):
                return
            leftovers.append((self.ids[busiest][-1], length))
            for rank in members:
                self.lengths[rank].pop()
                self.ids[rank].pop()
                self.loads[rank] -= cost

    def _widen_smallest_group(self) -> None:
        """Double the first smallest group over the next ranks, pushing the work between it and
        the first idle rank up by as many ranks."""
        if not self.sizes:
            raise SchedulingError(
                "no sub-sequence of this round fits the ranks: one needs more than all "
                f"{self.scheduler.total_ranks} DPxCP ranks of {self.scheduler.max_seq_len_per_rank}"
                " tokens each; raise max_seqlen_per_dp_cp_rank"
            )
        smallest = min(self.sizes.values())
        widened = min(2 * smallest, self.scheduler.total_ranks)
        extra = widened - smallest
        group = next(g for g, size in self.sizes.items() if size == smallest)
        first, last = self.members[group][0], self.members[group][-1]
        idle = next(rank for rank, work in enumerate(self.lengths) if not work)
        ranks = self.scheduler.total_ranks
        if idle + extra > ranks:
            raise SchedulingError(
                f"widening the CP group of ranks {first}..{last} to {widened} ranks pushes the "
                f"work of ranks {last + 1}..{idle - 1} past the last of {ranks} ranks (the seed "
                "commit fails here too)"
            )
        lengths: list[list[int]] = [[] for _ in range(ranks)]
        ids: list[list[int]] = [[] for _ in range(ranks)]
        loads = [0.0] * ranks
        moves = [(rank, rank) for rank in range(first)]
        moves += [(last, rank) for rank in range(first, last + extra + 1)]
        moves += [(rank, rank + extra) for rank in range(last + 1, idle)]
        for source, target in moves:
            lengths[target], ids[target] = self.lengths[source], self.ids[source]
            loads[target] = self.loads[source]
        shared_cost = self.scheduler.workload(self.lengths[last][0], widened)
        for rank in range(first, last + extra + 1):
            loads[rank] = shared_cost
        self.lengths, self.ids, self.loads = lengths, ids, loads
        self.sizes[group] = widened
        self.members[group] = list(range(first, last + extra + 1))
        for later in self.sizes:
            if later > group:
                self.members[later] = [rank + extra for rank in self.members[later]]
