import numpy
import pytest

from megafmt import DType, FormatError

# the table of ARCHITECTURE.md ("Files"), written out by hand
CODES = {
    1: numpy.uint8,
    2: numpy.int8,
    3: numpy.int16,
    4: numpy.int32,
    5: numpy.int64,
    6: numpy.float64,
    7: numpy.float32,
    8: numpy.uint16,
}


@pytest.mark.parametrize("code,dtype", sorted(CODES.items()))
def test_codes_match_the_format_table(code, dtype):
    assert DType.dtype_from_code(code) is dtype
    assert DType.code_from_dtype(dtype) == code
    assert DType.code_from_dtype(numpy.dtype(dtype)) == code
    assert DType.size(code) == DType.size(dtype) == numpy.dtype(dtype).itemsize


def test_optimal_dtype_threshold_is_65500():
    assert DType.optimal_dtype(65499) is numpy.uint16
    assert DType.optimal_dtype(65500) is numpy.int32
    assert DType.optimal_dtype(None) is numpy.int32
    assert DType.optimal_dtype(257) is numpy.uint16


def test_unknown_code_names_the_valid_ones():
    with pytest.raises(FormatError, match=r"unknown dtype code 9; expected one of 1 \(uint8\)"):
        DType.dtype_from_code(9)
    with pytest.raises(ValueError):
        DType.size(0)


def test_dtype_without_a_code_is_refused():
    with pytest.raises(FormatError, match="bool has no .idx code"):
        DType.code_from_dtype(numpy.bool_)
    with pytest.raises(ValueError, match="expected a dtype or a dtype code"):
        DType.size(object())
