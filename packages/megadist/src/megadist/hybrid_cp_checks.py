"""What each DP rank of hybrid context parallelism checks on its own share of a global batch
before any collective, and how the ranks tell each other the outcome.

A rank alone cannot stop: the others would wait in the next collective until the group's
timeout, and then blame a stalled peer. So every rank first shares one small header (its
:class:`Status`, its sub-sequence count, a digest of its samples' tensors) in one all-gather,
and all of them stop together when any header says so: all loaders exhausted is the end
(``StopIteration`` everywhere), one exhausted, one malformed share, or shares whose tensors
differ (keys, dtypes, trailing shapes: the all-to-all sends them key by key in one agreed
order) are a :class:`~megadist.errors.BatchError` on every rank, naming the DP ranks.
"""

from __future__ import annotations

import enum
import itertools
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from megadist.errors import BatchError

#: the keys of a packed sample that describe its packing and are not cut into sub-sequences
PACKING_KEYS = ("cu_seqlens", "batch_idx", "max_seqlen")


class Status(enum.IntEnum):
    """What a DP rank found when it read its share of the step."""

    READY = 0
    EXHAUSTED = 1
    MALFORMED = 2


def packed_problem(samples: Sequence[Mapping[str, Any]]) -> str | None:
    """Why ``samples`` cannot be cut at their ``cu_seqlens`` (None when they can): the
    boundaries must be integers from 0, never decreasing, ending within every per-token tensor,
    and every sample must hold the same tensors."""
    if not samples:
        return None  # no sub-sequence: the counts say so to every rank
    schema = tensor_schema(samples[0])
    for index, sample in enumerate(samples):
        if "cu_seqlens" not in sample:
            return f"sample {index} has no 'cu_seqlens' (keys {sorted(sample)})"
        bounds = torch.as_tensor(sample["cu_seqlens"]).reshape(-1)
        if bounds.dtype.is_floating_point or bounds.dtype == torch.bool:
            return f"sample {index}'s cu_seqlens are {bounds.dtype}; expected integers"
        values = bounds.tolist()
        if not values or values[0] != 0:
            return f"sample {index}'s cu_seqlens {values} do not start at 0"
        for position, (start, end) in enumerate(itertools.pairwise(values), start=1):
            if end < start:
                return (
                    f"sample {index}'s cu_seqlens {values} decrease at position {position} "
                    f"({start} then {end})"
                )
        held = tensor_schema(sample) if index else schema
        if held != schema:
            return f"sample {index} holds tensors {held}; sample 0 holds {schema}"
        for key, value in sample.items():
            if key in PACKING_KEYS:
                continue
            tokens = torch.as_tensor(value).shape[:1]
            if not tokens or tokens[0] < values[-1]:
                return (
                    f"sample {index}'s cu_seqlens end at token {values[-1]}, past its "
                    f"'{key}' of shape {tuple(torch.as_tensor(value).shape)}"
                )
    return None


def tensor_schema(sample: Mapping[str, Any]) -> list[str]:
    """The per-token tensors of ``sample`` as ``key:dtype:trailing shape``, sorted by key."""
    described = []
    for key in sorted(sample):
        if key not in PACKING_KEYS:
            value = torch.as_tensor(sample[key])
            described.append(f"{key}:{value.dtype}:{tuple(value.shape[1:])}")
    return described


def schema_digest(schema: list[str]) -> int:
    """A number that equals another rank's exactly when its :func:`tensor_schema` is the same."""
    return zlib.crc32(";".join(schema).encode())


def check_headers(
    headers: list[list[int]], dp_rank: int, problem: str | None, schema: list[str]
) -> None:
    """Stop this rank as every rank stops, from the gathered ``[status, count, digest]`` of
    each DP rank (``problem`` and ``schema`` are this rank's own, for its message)."""
    statuses = [Status(header[0]) for header in headers]
    exhausted = [rank for rank, status in enumerate(statuses) if status == Status.EXHAUSTED]
    if len(exhausted) == len(headers):
        raise StopIteration
    if exhausted:
        reading = [rank for rank in range(len(headers)) if rank not in exhausted]
        raise BatchError(
            f"hybrid CP: the data iterators of DP ranks {exhausted} are exhausted while DP ranks "
            f"{reading} still read batches; every DP rank stops at this step (give every rank "
            "the same number of steps)"
        )
    malformed = [rank for rank, status in enumerate(statuses) if status == Status.MALFORMED]
    if malformed:
        own = f"; here (DP rank {dp_rank}): {problem}" if problem else ""
        raise BatchError(
            f"hybrid CP: the shares of the global batch of DP ranks {malformed} cannot be cut "
            f"into sub-sequences (each names its problem); every DP rank stops at this step{own}"
        )
    empty = [rank for rank, header in enumerate(headers) if header[1] == 0]
    if empty:
        raise BatchError(
            f"hybrid CP: DP ranks {empty} have no non-empty sub-sequence in their share of the "
            "global batch; the seed commit cannot route that either"
        )
    digests = [header[2] for header in headers]
    if len(set(digests)) > 1:
        groups = {digest: [r for r, d in enumerate(digests) if d == digest] for digest in digests}
        raise BatchError(
            f"hybrid CP: DP ranks' samples hold different tensors (keys, dtypes or trailing "
            f"shapes), DP ranks grouped by what they hold: {sorted(groups.values())}; here (DP "
            f"rank {dp_rank}): {schema}"
        )
