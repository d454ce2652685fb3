"""Small shared pieces with megatron-core's names: the split enum and weight normalisation."""

from __future__ import annotations

from enum import Enum

import numpy


class Split(Enum):
    """The three splits a dataset is carved into, in order."""

    train = 0
    valid = 1
    test = 2


def normalize(weights: list[float]) -> list[float]:
    """``weights`` scaled to sum to 1 (computed as megatron-core does, to the last bit)."""
    array = numpy.array(weights, dtype=numpy.float64)
    return (array / numpy.sum(array)).tolist()
