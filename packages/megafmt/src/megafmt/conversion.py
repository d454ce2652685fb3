"""Turning what callers hand the builder into tokens of the corpus dtype, refusing values that
would not survive the trip (megatron-core wraps 70000 into a uint16 4464 without a word).

A value is accepted when numpy converts it to the dtype exactly: integers in range, whole
floats, digit strings ("12") for integer dtypes; any number for float dtypes, rounded as numpy
rounds. Anything else is refused with a message that says what is wrong and where in the value;
the builder prefixes the file and sequence.

Documents average a few hundred tokens, so the cost of one call, not of one token, decides how
fast a corpus is built. :class:`TokenEncoder` picks, once per dtype, the cheapest exact
conversion for each form callers use: an array of the dtype is written as it is; a list of
Python ints (what tokenizers return) is packed by ``struct``, which range-checks each int in C
and refuses floats, in one pass; another numeric array (int64 ids, a torch tensor through
its ``__array__``) is cast with numpy's ``same_value`` casting, which refuses a changed value in
the same pass (NumPy 2.4+; older numpy checks the range first). Only a value the fast form
refuses takes the general path, which accepts it or names the culprit.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy

from megafmt.errors import TokenValueError

#: ``struct`` codes of the integer dtypes the format stores (packed in native byte order with
#: standard sizes: ``=``).
STRUCT_CODES = {
    numpy.dtype(numpy.uint8): "B",
    numpy.dtype(numpy.int8): "b",
    numpy.dtype(numpy.uint16): "H",
    numpy.dtype(numpy.int16): "h",
    numpy.dtype(numpy.int32): "i",
    numpy.dtype(numpy.int64): "q",
}
#: Arrays of these dtypes are cast by one numpy call: bool, the signed and unsigned integers of
#: each C size, half, single and double floats (numpy's one-letter codes, native byte order).
NUMERIC_DTYPES = [numpy.dtype(code) for code in "?bhilqBHILQefd"]
#: A packer is made per list length and kept; past this many the cache starts over, which
#: bounds its memory when documents have very many distinct lengths.
MAX_PACKERS = 4096


def _numpy_casts_same_value() -> bool:
    try:
        numpy.ones(1, numpy.int64).astype(numpy.int8, casting="same_value")
    except (TypeError, ValueError):
        return False
    return True


#: Whether ``astype(..., casting="same_value")`` refuses a cast that changes a value (NumPy 2.4+).
SAME_VALUE_CASTING = _numpy_casts_same_value()


@runtime_checkable
class _DeviceTensor(Protocol):
    """A tensor that numpy cannot take as it is (on an accelerator, or part of an autograd
    graph) but that copies itself to host memory: torch's, named without importing torch."""

    def detach(self) -> Any: ...

    def cpu(self) -> Any: ...


@runtime_checkable
class _ArrayExporter(Protocol):
    """An object that hands numpy its values through numpy's ``__array__`` protocol (torch
    tensors do): called directly, it skips the other protocols ``numpy.asarray`` tries first."""

    def __array__(self) -> numpy.ndarray: ...


class TokenEncoder:
    """Turns token ids of any form into a buffer of ``dtype`` tokens, exactly or not at all."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = numpy.dtype(dtype)
        self._struct_code = STRUCT_CODES.get(self.dtype)  # None: a float dtype
        self._packers: dict[int, Callable[..., bytes]] = {}
        # how a numeric array of each dtype is cast in one numpy call that refuses a change of
        # value: none such for integer dtypes on numpy before 2.4, whose arrays take the
        # general path
        if self.dtype.kind == "f":  # float corpora take any number, rounded as numpy rounds
            casting: str | None = "same_kind"
        else:
            casting = "same_value" if SAME_VALUE_CASTING else None
        self._castings = {} if casting is None else dict.fromkeys(NUMERIC_DTYPES, casting)
        self._castings.pop(self.dtype, None)  # an array of the dtype itself is written as it is
        self._exporters: dict[type, bool] = {}  # by type: does it implement __array__

    def encode(self, value: Any) -> tuple[Any, int]:
        """``value`` (an array, a sequence, a torch tensor, a scalar) as a buffer holding its
        tokens in ``dtype``, and how many tokens that is."""
        kind = type(value)
        if kind is not numpy.ndarray and kind is not list:
            exports = self._exporters.get(kind)
            if exports is None:
                exports = self._exporters[kind] = isinstance(value, _ArrayExporter)
            if exports:
                try:
                    value = value.__array__()
                    kind = type(value)
                except (TypeError, ValueError, RuntimeError):
                    pass  # a tensor numpy cannot take as it is: the general path copies it
        if kind is numpy.ndarray:
            casting = self._castings.get(value.dtype)
            if casting is not None and value.ndim == 1:
                try:
                    tokens = value.astype(self.dtype, casting=casting)
                    return tokens, len(tokens)
                except ValueError:
                    pass  # a value would change: the general path names it
        elif kind is list and self._struct_code is not None:
            count = len(value)
            pack = self._packers.get(count) or self._packer(count)
            try:
                return pack(*value), count
            except (struct.error, TypeError):
                pass  # not a Python int in range: the general path accepts it or names it
        tokens = as_token_array(value, self.dtype)
        return tokens, tokens.size

    def _packer(self, count: int) -> Callable[..., bytes]:
        if len(self._packers) >= MAX_PACKERS:
            self._packers.clear()
        pack = self._packers[count] = struct.Struct(f"={count}{self._struct_code}").pack
        return pack


def as_token_array(value: Any, dtype: numpy.dtype) -> numpy.ndarray:
    """``value`` (an array, a sequence, a torch tensor) as a flat contiguous array of ``dtype``."""
    tokens = _as_array(value, dtype)
    if tokens.dtype is not dtype:
        tokens = _cast_exactly(tokens, dtype)
    if tokens.ndim != 1 or not tokens.flags.c_contiguous:
        tokens = numpy.ascontiguousarray(tokens).reshape(-1)
    return tokens


def _as_array(value: Any, dtype: numpy.dtype) -> numpy.ndarray:
    if type(value) is numpy.ndarray:
        return value
    try:
        return numpy.asarray(value)
    except (OverflowError, ValueError, TypeError, RuntimeError) as error:
        if isinstance(value, _DeviceTensor):
            return numpy.asarray(value.detach().cpu())
        raise TokenValueError(f"cannot convert to {dtype.name}: {error}") from None


def _cast_exactly(tokens: numpy.ndarray, dtype: numpy.dtype) -> numpy.ndarray:
    if tokens.dtype.kind in "OUS":
        tokens = _as_numbers(tokens, dtype)
    elif tokens.dtype.kind not in "biuf":
        raise TokenValueError(f"expected numbers for {dtype.name}, got {tokens.dtype}")
    if dtype.kind == "f":  # float corpora take any number, rounded as numpy rounds
        return tokens.astype(dtype)
    if SAME_VALUE_CASTING:
        try:
            return tokens.astype(dtype, casting="same_value")
        except ValueError:
            pass  # some value would change: find it below
    _refuse_changed_values(tokens, dtype)
    return tokens.astype(dtype)


def _refuse_changed_values(tokens: numpy.ndarray, dtype: numpy.dtype) -> None:
    """Raise naming the first value of a numeric array that ``dtype`` (integer) cannot hold."""
    if tokens.size == 0 or numpy.can_cast(tokens.dtype, dtype, "safe"):
        return
    if tokens.dtype.kind == "f":
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


def _as_numbers(tokens: numpy.ndarray, dtype: numpy.dtype) -> numpy.ndarray:
    """Text or Python objects as int64 (integer dtypes) or float64, each value as numpy converts
    it alone; the first that ``dtype`` cannot hold exactly is refused by position."""
    wide = numpy.dtype(numpy.int64 if dtype.kind in "iu" else numpy.float64)
    if tokens.dtype.kind in "US":
        try:
            return tokens.astype(wide)  # the cast that follows checks the range
        except (ValueError, OverflowError):
            pass  # find which one below
    values = tokens.reshape(-1).tolist()  # Python str, bytes and objects, not numpy scalars
    numbers = [_as_number(value, at, dtype, wide) for at, value in enumerate(values)]
    return numpy.array(numbers, dtype=wide).reshape(tokens.shape)


def _as_number(value: Any, position: int, dtype: numpy.dtype, wide: numpy.dtype) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            value = numpy.asarray(value).astype(wide).item()
        except (ValueError, OverflowError):
            raise TokenValueError(
                f"value {value!r} at position {position} is not a number numpy converts to "
                f"{dtype.name}"
            ) from None
    elif isinstance(value, bool) or not isinstance(
        value, (int, float, numpy.integer, numpy.floating)
    ):
        raise TokenValueError(
            f"value {value!r} at position {position} is not a number, expected {dtype.name} "
            "token ids"
        )
    if dtype.kind == "f":
        try:
            return float(value)
        except OverflowError:
            raise TokenValueError(
                f"value {value} at position {position} does not fit {dtype.name}"
            ) from None
    if not (isinstance(value, (int, numpy.integer)) or float(value).is_integer()):
        raise TokenValueError(
            f"value {value} at position {position} is not an integer, expected {dtype.name} "
            "token ids"
        )
    info = numpy.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise TokenValueError(
            f"value {value} at position {position} does not fit {dtype.name} "
            f"(range {info.min}..{info.max})"
        )
    return int(value)


def as_bounded_ints(values: Any, what: str, low: int, high: int) -> list[int]:
    """``values`` (a sequence or an array of what numpy converts to integers exactly: ints,
    whole floats, digit strings) as a list of ints, each checked to lie in ``low..high``.
    Short lists of Python ints, the usual case, take a fast path."""
    if type(values) is list and len(values) == 1 and type(values[0]) is int:
        if low <= values[0] <= high:  # one sequence per document: the common case, kept cheap
            return values
        raise TokenValueError(f"{what} must be integers in {low}..{high}, got {values!r}")
    if isinstance(values, (list, tuple)) and all(type(v) is int for v in values):
        ints = list(values)
    else:
        try:
            array = numpy.asarray(values).reshape(-1)
        except (ValueError, TypeError):  # ragged: the exact conversion below names the culprit
            array = None
        if array is None or (array.size and array.dtype.kind not in "iub"):
            try:  # whole floats, digit strings: as numpy converts them, exactly or not at all
                array = as_token_array(values, numpy.dtype(numpy.int64))
            except TokenValueError as error:
                raise TokenValueError(f"{what}: {error}") from None
        ints = array.tolist()
    if ints and (min(ints) < low or max(ints) > high):
        raise TokenValueError(f"{what} must be integers in {low}..{high}, got {values!r}")
    return ints
