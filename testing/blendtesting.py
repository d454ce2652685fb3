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
