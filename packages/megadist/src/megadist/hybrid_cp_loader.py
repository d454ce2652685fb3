"""``HybridCPDataLoaderWrapper``: the loader of hybrid context parallelism, step by step.

Each data-parallel rank's loader (megaload's ``hybrid_cp`` sampler) hands it the samples of its
share of a global batch, uncollated. Per step the wrapper, like the seed commit's
(``megatron/core/datasets/data_schedule.py``):

1. cuts every packed sample at its ``cu_seqlens`` into sub-sequences (empty ones dropped);
2. gathers their lengths over the data-parallel group, numbering them globally in DP-rank
   order (global id = the DP rank's offset + its local position), after one all-gather of
   each rank's header (:mod:`megadist.hybrid_cp_checks`): an exhausted iterator, malformed
   ``cu_seqlens`` or tensors that differ between ranks stop every rank at once;
3. deals them to the DPxCP ranks with the ``megadist.hybrid_cp_schedulers`` scheduler (the
   same on every rank: it sees the same lengths);
4. sends each sub-sequence's tensors to the ranks it was dealt to, one all-to-all per key (in
   key order, the same on every rank) over the DPxCP group (a rank sends only to the ranks of
   its own DP group's CP column, which lack its data);

and returns ``(sub-sequences by global id, the schedule)``. The collectives run on the groups
of the :class:`~megadist.topology.BatchTopology` (``hybrid_cp``), not on global state. Ranks
that do not read data (TP rank > 0) pass None and get ``(None, None)``.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from megadist import collectives
from megadist.errors import TopologyError
from megadist.hybrid_cp import HYBRID_CP_SCHEDULERS, HybridCPScheduler
from megadist.hybrid_cp_checks import (
    PACKING_KEYS,
    Status,
    check_headers,
    packed_problem,
    schema_digest,
    tensor_schema,
)
from megadist.topology import BatchTopology, device_for_group

SubSequences = dict[int, dict[str, torch.Tensor]]
Schedule = list[list[list[int]]]


def sub_sequence_lengths(samples: list[Mapping[str, Any]]) -> list[int]:
    """The lengths of the packed sub-sequences of ``samples``, in order, empty ones dropped."""
    lengths = []
    for sample in samples:
        bounds = torch.as_tensor(sample["cu_seqlens"]).reshape(-1).tolist()
        lengths += [int(end - start) for start, end in itertools.pairwise(bounds)]
    return [length for length in lengths if length != 0]


def unpack(samples: list[Mapping[str, Any]]) -> list[dict[str, torch.Tensor]]:
    """Every non-empty sub-sequence of ``samples`` as a dict of its slices of each per-token
    tensor (the packing keys left out), in :func:`sub_sequence_lengths` order."""
    pieces = []
    for sample in samples:
        bounds = torch.as_tensor(sample["cu_seqlens"]).reshape(-1).tolist()
        for start, end in itertools.pairwise(bounds):
            if end != start:
                pieces.append({k: v[start:end] for k, v in sample.items() if k not in PACKING_KEYS})
    return pieces


def cp_sizes(schedule: Schedule, group: int) -> dict[int, int]:
    """How many ranks share each global id in ``group`` of ``schedule``: the ``local_cp_size``
    the seed commit gives its micro-batch."""
    counts: dict[int, int] = {}
    for ids in schedule[group]:
        for gid in set(ids):
            counts[gid] = counts.get(gid, 0) + 1
    return counts


class HybridCPDataLoaderWrapper:
    """Per step, the sub-sequences this rank trains on (by global id) and the schedule.

    ``max_seqlen_per_dp_cp_rank`` is Megatron's budget of tokens per rank for one sequence;
    ``scheduler`` names a ``megadist.hybrid_cp_schedulers`` plugin.
    """

    def __init__(
        self,
        data_iterator: Iterator[list[Mapping[str, Any]]] | None,
        topology: BatchTopology,
        max_seqlen_per_dp_cp_rank: int,
        *,
        scheduler: str = "balanced",
    ) -> None:
        if topology.hybrid_cp is None:
            raise TopologyError(
                "HybridCPDataLoaderWrapper needs a BatchTopology built with hybrid_cp groups "
                "(build_parallel_groups(..., hybrid_cp=True) makes them)"
            )
        self.data_iterator = data_iterator
        self.topology = topology
        self.groups = topology.hybrid_cp
        self.total_ranks = self.groups.dp_cp_size
        self.device = device_for_group(self.groups.dp_cp_group)
        made = HYBRID_CP_SCHEDULERS.get(scheduler)(max_seqlen_per_dp_cp_rank, self.total_ranks)
        if not isinstance(made, HybridCPScheduler):
            raise TopologyError(
                f"hybrid CP scheduler {scheduler!r} built a {type(made).__qualname__}, which has "
                "no schedule(sub_sequences) method"
            )
        self.scheduler = made
        #: the DPxCP rank of each member of this rank's DP group, in DP order
        self.dp_members = [
            dist.get_group_rank(self.groups.dp_cp_group, rank)
            for rank in dist.get_process_group_ranks(self.groups.dp_group)
        ]

    def __iter__(self) -> HybridCPDataLoaderWrapper:
        return self

    def __next__(self) -> tuple[SubSequences | None, Schedule | None]:
        if self.data_iterator is None:
            return None, None
        try:
            samples = list(next(self.data_iterator))
        except StopIteration:
            samples, status, problem = [], Status.EXHAUSTED, None
        else:
            problem = packed_problem(samples)
            status = Status.MALFORMED if problem else Status.READY
        lengths = sub_sequence_lengths(samples) if status == Status.READY else []
        counts = self._agree(status, len(lengths), samples, problem)
        everyone, offsets = self._gather_lengths(lengths, counts)
        dp_rank = dist.get_rank(self.groups.dp_group)
        mine = range(offsets[dp_rank], offsets[dp_rank] + len(lengths))
        schedule = self.scheduler.schedule(list(enumerate(everyone)))
        return self._reroute(unpack(samples), mine, everyone, schedule, offsets), schedule

    def _agree(
        self, status: Status, count: int, samples: list[Mapping[str, Any]], problem: str | None
    ) -> list[int]:
        """Share this rank's header with its DP group; raise on every rank alike when any rank
        cannot go on (:func:`~megadist.hybrid_cp_checks.check_headers`). Returns every DP
        rank's sub-sequence count, in DP order: the header carries it, so the lengths need no
        all-gather of their own for it."""
        schema = tensor_schema(samples[0]) if samples else []
        digest = schema_digest(schema) if status == Status.READY else 0
        header = torch.tensor([int(status), count, digest], dtype=torch.int64, device=self.device)
        headers = collectives.all_gather(header, self.groups.dp_group, "DP").tolist()
        check_headers(headers, dist.get_rank(self.groups.dp_group), problem, schema)
        return [header[1] for header in headers]

    def _gather_lengths(self, lengths: list[int], counts: list[int]) -> tuple[list[int], list[int]]:
        """Every DP rank's lengths (``counts`` of them each, from the headers), concatenated in
        DP order, and where each rank's start."""
        group = self.groups.dp_group
        padded = torch.zeros(max(counts), dtype=torch.int32, device=self.device)
        padded[: len(lengths)] = torch.tensor(lengths, dtype=torch.int32)
        rows = collectives.all_gather(padded, group, "DP").tolist()
        everyone = [length for row, n in zip(rows, counts, strict=True) for length in row[:n]]
        offsets = [0, *itertools.accumulate(counts)][:-1]
        return everyone, offsets

    def _source(self, gid: int, offsets: list[int]) -> int:
        """The DPxCP rank of the DP-group member that holds global id ``gid``."""
        return self.dp_members[bisect.bisect_right(offsets, gid) - 1]

    def _reroute(
        self,
        pieces: list[dict[str, torch.Tensor]],
        mine: range,
        lengths: list[int],
        schedule: Schedule,
        offsets: list[int],
    ) -> SubSequences:
        dealt = [
            sorted(itertools.chain.from_iterable(g[r] for g in schedule))
            for r in range(self.total_ranks)
        ]
        columns = set(self.dp_members)
        sends = [
            [g for g in dealt[r] if g in mine] if r in columns else []
            for r in range(self.total_ranks)
        ]
        me = dist.get_rank(self.groups.dp_cp_group)
        receives: list[list[int]] = [[] for _ in range(self.total_ranks)]
        for gid in dealt[me]:
            receives[self._source(gid, offsets)].append(gid)
        sent_sizes = [sum(lengths[g] for g in ids) for ids in sends]
        received_sizes = [sum(lengths[g] for g in ids) for ids in receives]
        order = list(itertools.chain.from_iterable(sends))
        arriving = list(itertools.chain.from_iterable(receives))
        result: SubSequences = {gid: {} for gid in arriving}
        for key, first in sorted(pieces[0].items()):
            parts = [pieces[gid - mine.start][key] for gid in order]
            sent = (
                torch.cat(parts).to(self.device)
                if parts
                else torch.empty(0, dtype=first.dtype, device=self.device)
            )
            received = torch.empty(sum(received_sizes), dtype=sent.dtype, device=self.device)
            collectives.all_to_all(
                received,
                sent,
                received_sizes,
                sent_sizes,
                self.groups.dp_cp_group,
                "DPxCP",
            )
            cursor = 0
            for gid in arriving:
                result[gid][key] = received[cursor : cursor + lengths[gid]]
                cursor += lengths[gid]
        # sent in the agreed (sorted) key order; handed back in this rank's, as the seed's
        return {gid: {key: piece[key] for key in pieces[0]} for gid, piece in result.items()}
