"""Blend weights that test the blending rule's ties.

Test support, not part of any package (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import numpy


def dyadic_weights(rng: numpy.random.Generator, datasets: int) -> numpy.ndarray:
    """Weights of 1, 2 and 4 parts in a power of two, shuffled, summing to exactly 1: every lag
    is exact, so corpora of different weights tie, and the lowest id must win (megatron-core
    scans the corpora in id order; a tree that holds them otherwise must break ties by id)."""
    parts = rng.permutation(numpy.resize([1.0, 2.0, 4.0], datasets))
    whole = 2.0 ** numpy.ceil(numpy.log2(parts.sum() + 1))
    parts[int(rng.integers(datasets))] += whole - parts.sum()
    return parts / whole


def deciding_ties(weights: numpy.ndarray, size: int) -> int:
    """How many of the first ``size`` samples megatron-core's rule decides between corpora of
    different weights whose lags are equal (the lowest id wins): a test of the tie-break is one
    only where this is not 0."""
    taken = numpy.zeros(len(weights))
    ties = 0
    for sample in range(size):
        lags = weights * max(sample, 1) - taken
        tied = numpy.flatnonzero(lags == lags.max())
        ties += int(len(numpy.unique(weights[tied])) > 1)
        taken[tied[0]] += 1
    return ties
