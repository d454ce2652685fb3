"""Token dtypes of a corpus and their one-byte codes in the ``.idx`` header.

The names, codes and the three helpers mirror megatron-core's ``DType`` so that code written
against it keeps working. The helpers accept numpy scalar types (``numpy.int32``) as megatron-core
does, and also ``numpy.dtype`` objects and dtype names.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy

from megafmt.errors import FormatError

#: Vocabulary sizes below this are written as uint16 by preprocessing (megatron-core's rule).
UINT16_VOCAB_LIMIT = 65500


class DType(Enum):
    """The dtype codes of the ``.idx`` header."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_from_dtype(cls, value: Any) -> int:
        """The header code of a numpy dtype (``numpy.uint16``, ``numpy.dtype('uint16')``, ...)."""
        name = numpy.dtype(value).name
        try:
            return cls[name].value
        except KeyError:
            raise FormatError(
                f"dtype {name} has no .idx code; expected one of "
                f"{', '.join(member.name for member in cls)}"
            ) from None

    @classmethod
    def dtype_from_code(cls, value: int) -> type[numpy.number]:
        """The numpy scalar type for a header code."""
        try:
            return getattr(numpy, cls(value).name)
        except ValueError:
            raise FormatError(
                f"unknown dtype code {value!r}; expected one of "
                + ", ".join(f"{member.value} ({member.name})" for member in cls)
            ) from None

    @staticmethod
    def size(key: Any) -> int:
        """The size in bytes of one token, given a header code or a dtype."""
        if isinstance(key, (int, numpy.integer)) and not isinstance(key, bool):
            return numpy.dtype(DType.dtype_from_code(int(key))).itemsize
        try:
            return numpy.dtype(key).itemsize
        except TypeError:
            raise ValueError(f"expected a dtype or a dtype code, got {key!r}") from None

    @staticmethod
    def optimal_dtype(cardinality: int | None) -> type[numpy.number]:
        """The token dtype preprocessing writes for a vocabulary of ``cardinality`` ids.

        uint16 below 65500 ids, else int32; ``None`` (unknown vocabulary) gives int32.
        """
        if cardinality is not None and cardinality < UINT16_VOCAB_LIMIT:
            return numpy.uint16
        return numpy.int32
