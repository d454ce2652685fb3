"""Packing one SFT line's conversations into a sample of ``sequence_length`` tokens.

The rule is Megatron-LM's SFT dataset's (seed commit): conversations are appended in order;
with context parallelism (cp > 1) each is followed by pad tokens up to a multiple of 2 x cp
(their positions continue the conversation's); ``cu_seqlens`` gains the pack's length after
each. Once the pack holds ``sequence_length + 1`` tokens or more, it is cut to
``sequence_length`` tokens plus one pad, the last boundary set to ``sequence_length``, and the
line's remaining conversations are left out. A shorter pack is padded to ``sequence_length + 1``
(positions continuing) and its last boundary moved to ``sequence_length``. The sample is the
pack shifted by one: tokens ``pack[:-1]``, labels ``targets[1:]``.

Unlike Megatron, what packing cuts is counted (:class:`PackReport`): a conversation cut short
and the conversations left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy

from megaindex.errors import ConfigError

IGNORE_INDEX = -100


@dataclass
class Pack:
    """A packed row before the shift: ``sequence_length + 1`` tokens, targets and positions,
    and the boundaries of the conversations in it."""

    tokens: numpy.ndarray
    targets: numpy.ndarray
    positions: numpy.ndarray
    cu_seqlens: list[int]
    cut_tokens: int = 0
    """tokens of the last conversation that did not fit"""
    left_out: int = 0
    """conversations after the cut that were not packed at all"""


def pack_conversations(
    conversations: Sequence[tuple[numpy.ndarray, numpy.ndarray]],
    sequence_length: int,
    pad: int,
    context_parallel_size: int = 1,
) -> Pack:
    """Pack ``conversations`` (ids and targets each) as Megatron-LM's SFT dataset does."""
    granularity = 2 * context_parallel_size if context_parallel_size > 1 else 0
    row = sequence_length + 1
    tokens: list[numpy.ndarray] = []
    targets: list[numpy.ndarray] = []
    positions: list[numpy.ndarray] = []
    length, last_position = 0, None
    cu_seqlens = [0]

    def add_padding(count: int) -> None:
        nonlocal length, last_position
        if last_position is None:
            raise ConfigError("an SFT line whose conversations have no tokens cannot be packed")
        tokens.append(numpy.full(count, pad, numpy.int64))
        targets.append(numpy.full(count, pad, numpy.int64))
        positions.append(numpy.arange(last_position + 1, last_position + 1 + count))
        length += count
        last_position += count

    cut = left_out = 0
    for number, (ids, target) in enumerate(conversations):
        count = len(ids)
        tokens.append(numpy.asarray(ids, numpy.int64))
        targets.append(numpy.asarray(target, numpy.int64))
        positions.append(numpy.arange(count))
        length += count
        if count:
            last_position = count - 1
        if granularity and length % granularity:
            add_padding(granularity - length % granularity)
        cu_seqlens.append(length)
        if length >= row:
            cut = length - sequence_length
            left_out = len(conversations) - number - 1
            break
    if length < row:
        add_padding(row - length)
    all_tokens = numpy.concatenate(tokens)[:row]
    all_targets = numpy.concatenate(targets)[:row]
    if cut:
        all_tokens[sequence_length] = pad
        all_targets[sequence_length] = pad
    cu_seqlens[-1] = sequence_length
    return Pack(
        all_tokens,
        all_targets,
        numpy.concatenate(positions)[:row],
        cu_seqlens,
        cut_tokens=cut,
        left_out=left_out,
    )
