"""Turning what callers hand the builder into arrays of the corpus dtype, refusing values that
would not survive the trip (megatron-core wraps 70000 into a uint16 4464 without a word).

Messages say what is wrong and where in the value; the builder prefixes the file and sequence.
"""

from __future__ import annotations

from typing import Any

import numpy

from megafmt.errors import TokenValueError


def as_token_array(value: Any, dtype: numpy.dtype) -> numpy.ndarray:
    """``value`` (an array, a sequence, a torch tensor) as a flat contiguous array of ``dtype``."""
    if isinstance(value, numpy.ndarray):
        tokens = value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor, torch not imported
        tokens = value.detach().cpu().numpy()
    else:
        try:
            tokens = numpy.asarray(value)
        except (OverflowError, ValueError, TypeError) as error:
            raise TokenValueError(f"cannot convert to {dtype.name}: {error}") from None
    if tokens.dtype != dtype:
        tokens = _cast_checked(tokens, dtype)
    if tokens.ndim != 1 or not tokens.flags.c_contiguous:
        tokens = numpy.ascontiguousarray(tokens).reshape(-1)
    return tokens


def _cast_checked(tokens: numpy.ndarray, dtype: numpy.dtype) -> numpy.ndarray:
    if tokens.dtype.kind == "O":  # Python ints too large for int64, or mixed objects
        _check_objects(tokens, dtype)
        tokens = tokens.astype(numpy.float64 if dtype.kind == "f" else numpy.int64)
    if tokens.dtype.kind not in "biuf":
        raise TokenValueError(f"expected numbers for {dtype.name}, got {tokens.dtype}")
    if tokens.size == 0 or numpy.can_cast(
        tokens.dtype, dtype, "same_kind" if dtype.kind == "f" else "safe"
    ):
        return tokens.astype(dtype)
    if tokens.dtype.kind == "f":  # into an integer dtype: only whole numbers
        whole = numpy.isfinite(tokens) & (tokens == numpy.trunc(tokens))
        if not whole.all():
            bad = int(numpy.argmin(whole))
            raise TokenValueError(
                f"value {tokens.flat[bad]} at position {bad} is not an integer, expected "
                f"{dtype.name} token ids"
            )
    info = numpy.iinfo(dtype)
    for extreme, position in ((tokens.min(), numpy.argmin), (tokens.max(), numpy.argmax)):
        if not info.min <= int(extreme) <= info.max:
            bad = int(position(tokens))
            raise TokenValueError(
                f"value {tokens.flat[bad]} at position {bad} does not fit {dtype.name} "
                f"(range {info.min}..{info.max})"
            )
    return tokens.astype(dtype)


def _check_objects(tokens: numpy.ndarray, dtype: numpy.dtype) -> None:
    for position, value in enumerate(tokens.flat):
        if not isinstance(value, (int, float, numpy.number)) or isinstance(value, bool):
            raise TokenValueError(
                f"value {value!r} at position {position} is not a number, expected {dtype.name} "
                "token ids"
            )
        if dtype.kind in "iu" and not numpy.iinfo(dtype).min <= value <= numpy.iinfo(dtype).max:
            raise TokenValueError(f"value {value} at position {position} does not fit {dtype.name}")


def as_bounded_ints(values: Any, what: str, low: int, high: int) -> list[int]:
    """``values`` (integers, as a sequence or an array) as a list, each checked to lie in
    ``low..high``. Short lists of Python ints, the usual case, take a fast path."""
    if type(values) is list and len(values) == 1 and type(values[0]) is int:
        if low <= values[0] <= high:  # one sequence per document: the common case, kept cheap
            return values
        raise TokenValueError(f"{what} must be integers in {low}..{high}, got {values!r}")
    if isinstance(values, (list, tuple)) and all(type(v) is int for v in values):
        ints = list(values)
    else:
        array = numpy.asarray(values).reshape(-1)
        if array.size and array.dtype.kind not in "iub":
            raise TokenValueError(f"{what} must be integers in {low}..{high}, got {values!r}")
        ints = array.tolist()
    if ints and (min(ints) < low or max(ints) > high):
        raise TokenValueError(f"{what} must be integers in {low}..{high}, got {values!r}")
    return ints
