"""Small shared pieces with megatron-core's names: the split enum, weight normalisation,
``compile_helpers`` for scripts that call it before building datasets, and a split's indices
made an array when used."""

from __future__ import annotations

import numbers
from enum import Enum
from typing import Any

import numpy


class Split(Enum):
    """The three splits a dataset is carved into, in order.

    A member equals the member of the same name and value of any other enum called ``Split``
    (megatron-core's ``megatron.core.datasets.utils.Split``), and hashes as it does, so code
    that compares or looks up a dataset's split with Megatron's enum (``split ==
    Split.valid``, ``split in (Split.valid, Split.test)``) finds ours.
    """

    train = 0
    valid = 1
    test = 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum) and type(other).__name__ == "Split":
            return (self.name, self.value) == (other.name, other.value)
        return NotImplemented

    __hash__ = Enum.__hash__


def is_count(value: Any) -> bool:
    """Whether ``value`` is an integer >= 0 (numpy's too), not a bool nor a float of integral
    value: what a count read back from a saved state or a sidecar must be."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def normalize(weights: list[float]) -> list[float]:
    """``weights`` scaled to sum to 1 (computed as megatron-core does, to the last bit)."""
    array = numpy.array(weights, dtype=numpy.float64)
    return (array / numpy.sum(array)).tolist()


def index_array(indices: numpy.ndarray | range | None) -> numpy.ndarray | None:
    """A dataset's sequence indices as megatron-core holds them: an int32 array (or None, all
    sequences). The builder gives each split as a ``range``, made an array only here, when
    something uses it: opening a cache never does, and the train split of a 146M-document
    corpus is 570 MB of int32 for every process that opens it."""
    if isinstance(indices, range):
        return numpy.arange(indices.start, indices.stop, dtype=numpy.int32)
    return indices


def compile_helpers() -> None:
    """megatron-core compiles its C++ index builders here, at run time. megaindex's are built
    when the package is installed and never compiled at run time: this loads the builders the
    environment chooses (:mod:`megaindex.backends`), so a script that calls it first still fails
    early, naming the cause, when ``MEGAINDEX_BACKEND=cpp`` asks for a missing extension."""
    from megaindex.backends import implementation

    implementation()
