"""Megatron-LM's ``--data-path`` words: a single prefix, ``weight prefix`` pairs, or prefixes
whose weights come from their sizes. Read alike by ``mega index`` (megaindex) and ``mega demo``.

The results equal megatron-core's ``get_blend_from_list`` for every list it accepts. Where it
would guess (a list mixing numbers and prefixes, a negative or zero weight), the error says which
item is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from megafmt.errors import MegafmtError

Blend = tuple[list[str], list[float] | None]


class BlendListError(MegafmtError, ValueError):
    """A ``--data-path`` list that is no blend."""


def _weight(item: str) -> float | None:
    try:
        return float(item)
    except ValueError:
        return None


def parse_blend_list(items: Sequence[str], argument: str = "--data-path") -> Blend:
    """``["30", "a", "70", "b"]`` -> ``(["a", "b"], [30.0, 70.0])``; ``["a", "b"]`` ->
    ``(["a", "b"], None)`` (weights from sizes); a single prefix -> ``(["a"], None)``.
    ``argument`` names the flag the list comes from in the errors."""
    items = list(items)
    if not items:
        raise BlendListError(f"{argument} is empty: give a prefix, or weight/prefix pairs")
    if len(items) % 2 == 1:
        weights = [_weight(item) for item in items]
        if all(w is not None for w in weights) or any(w is not None for w in weights[0::2]):
            numbers = [item for item, w in zip(items, weights, strict=True) if w is not None]
            raise BlendListError(
                f"{argument} has an odd number of items ({len(items)}), so it must be a list "
                f"of prefixes, but {numbers[0]!r} looks like a weight: give weight/prefix pairs"
            )
        return [item.strip() for item in items], None
    pairs = list(zip(items[0::2], items[1::2], strict=True))
    weights = [_weight(weight) for weight, _ in pairs]
    if all(w is None for w in weights):
        return [item.strip() for item in items], None
    for position, ((raw, prefix), weight) in enumerate(zip(pairs, weights, strict=True)):
        if weight is None:
            first = next(i for i, w in enumerate(weights) if w is not None)
            raise BlendListError(
                f"{argument} item {2 * position + 1} ({raw!r}) should be the weight of "
                f"{prefix!r}: item {2 * first + 1} ({pairs[first][0]!r}) is a weight, so every "
                "odd item must be one"
            )
        if not (math.isfinite(weight) and weight >= 0):
            raise BlendListError(
                f"{argument}: the weight of {prefix!r} is {raw}; weights must be finite numbers "
                ">= 0"
            )
    if sum(weights) <= 0:
        raise BlendListError(
            f"{argument}: the weights {[raw for raw, _ in pairs]} are all zero; at least one "
            "must be above 0"
        )
    return [prefix.strip() for _, prefix in pairs], weights
