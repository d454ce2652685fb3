"""Merging batches row by row: how a blend turns the rows each of its parts read into its batch.

A blend groups a batch's rows by the part they come from, asks each part for its rows with
``__getitems__`` (a :class:`~megafmt.protocols.CollatedBatch`) and has the parts' class merge
them in the blend's order (``merge_batches``, of :class:`~megafmt.protocols.BatchAssembly`).
:func:`merge_rows` is that merge for samples whose values stack (every row the same shape);
a class whose rows differ in shape (SFT's ``cu_seqlens``) merges :func:`in_row_order`'s samples
its own way.

A class that can read a blend's whole batch faster than part by part (GPT windows gathered
across corpora in one native call) declares :class:`BlendGathering`; the blend then asks it
once for a gatherer of its batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy
import torch

from megafmt.protocols import CollatedBatch


@runtime_checkable
class BlendGatherer(Protocol):
    """Reads a blend's batches whole: ``gather(positions, padding)`` returns the collated
    values (a mapping of key to batch) of blend samples ``positions``, ``padding[i]`` marking
    a padding row (its sample's tokens, no loss)."""

    def gather(self, positions: list[int], padding: list[bool]) -> dict[str, Any]: ...


@runtime_checkable
class BlendGathering(Protocol):
    """A dataset class that reads a blend of its datasets' batches in one pass."""

    def blend_gatherer(
        self,
        parts: Sequence[Any],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> BlendGatherer | None:
        """A gatherer of the blend of ``parts`` (this dataset among them) whose tables are
        ``dataset_index`` and ``dataset_sample_index``; None where ``parts`` do not allow one
        (then the blend reads part by part and merges)."""
        ...


def in_row_order(
    batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
) -> list[dict[str, Any]]:
    """The samples of ``batches`` as one list, row ``j`` of ``batches[i]`` at ``rows[i][j]``."""
    _check_rows(batches, rows)
    samples: list[Any] = [None] * sum(len(where) for where in rows)
    for batch, where in zip(batches, rows, strict=True):
        for sample, row in zip(batch, where, strict=True):
            samples[row] = sample
    return samples


def merge_rows(batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]) -> CollatedBatch:
    """``batches`` merged into one, row ``j`` of ``batches[i]`` at row ``rows[i][j]``: each
    key's values concatenated and put in row order (tensors along their first dimension, lists
    item by item). The batches must have the same keys, and tensors of equal row shape."""
    _check_rows(batches, rows)
    if len(batches) == 1 and list(rows[0]) == list(range(len(rows[0]))):
        return batches[0]
    order = numpy.argsort(numpy.concatenate([numpy.asarray(r, numpy.int64) for r in rows]))
    keys = list(batches[0].collated)
    merged: dict[str, Any] = {}
    for key in keys:
        values = [_value(batch, key, number) for number, batch in enumerate(batches)]
        if all(isinstance(value, torch.Tensor) for value in values):
            try:
                merged[key] = torch.cat(values)[torch.from_numpy(order)]
            except RuntimeError as error:
                shapes = [tuple(value.shape) for value in values]
                raise ValueError(
                    f"cannot merge the parts' batches: their {key!r} has shapes {shapes} (rows "
                    "of one shape expected: the parts must share their sample configuration)"
                ) from error
        elif all(isinstance(value, list) for value in values):
            joined = [item for value in values for item in value]
            merged[key] = [joined[i] for i in order.tolist()]
        else:
            kinds = sorted({type(value).__name__ for value in values})
            raise TypeError(f"cannot merge the parts' batches: {key!r} holds {kinds}")
    return CollatedBatch(merged)


def _value(batch: CollatedBatch, key: str, number: int) -> Any:
    try:
        return batch.collated[key]
    except KeyError:
        raise ValueError(
            f"cannot merge the parts' batches: batch {number} has keys "
            f"{list(batch.collated)}, without {key!r}"
        ) from None


def _check_rows(batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]) -> None:
    if len(batches) != len(rows) or not batches:
        raise ValueError(f"{len(batches)} batches but {len(rows)} lists of rows (one each, >= 1)")
    for number, (batch, where) in enumerate(zip(batches, rows, strict=True)):
        if len(batch) != len(where):
            raise ValueError(f"batch {number} has {len(batch)} rows but {len(where)} are placed")
