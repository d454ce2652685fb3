"""Showing SFT conversations and packs to a person: runs of prompt and loss positions, decoded.

``mega dump`` shows a pre-tokenized corpus's (or a jsonl's) conversations this way and
``mega index explain --dataset sft`` a sample's pack, segment by segment: which tokens are
prompt (no loss) and which the model learns, as text when a tokenizer decodes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy

from megafmt.sft.tokenizer import IGNORE_INDEX

Decode = Callable[[numpy.ndarray], str]


def loss_runs(targets: numpy.ndarray, pad: int | None = None) -> Iterator[tuple[bool, int, int]]:
    """``(takes_loss, start, end)`` for each run of positions that take loss or do not (a
    target of ``IGNORE_INDEX`` or ``pad`` takes none)."""
    loss = targets != IGNORE_INDEX
    if pad is not None:
        loss &= targets != pad
    if not len(loss):
        return
    edges = numpy.flatnonzero(numpy.diff(loss.astype(numpy.int8))) + 1
    bounds = [0, *edges.tolist(), len(loss)]
    for start, end in itertools.pairwise(bounds):
        yield bool(loss[start]), start, end


def describe_tokens(
    tokens: numpy.ndarray,
    targets: numpy.ndarray,
    decode: Decode | None = None,
    pad: int | None = None,
    indent: str = "    ",
    first: int = 0,
) -> list[str]:
    """One line per run of ``tokens``: ``loss`` or ``prompt``, its positions (counted from
    ``first``) and its text (``decode``) or ids."""
    lines = []
    for takes_loss, start, end in loss_runs(targets, pad):
        piece = tokens[start:end]
        shown = repr(decode(piece)) if decode is not None else " ".join(map(str, piece.tolist()))
        kind = "loss  " if takes_loss else "prompt"
        lines.append(f"{indent}{kind} [{first + start:>5}, {first + end:>5}) {shown}")
    return lines
