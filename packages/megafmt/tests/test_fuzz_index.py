"""Fuzzing the .idx parser: whatever the bytes, opening and reading a corpus either works or
raises a megafmt error (or IndexError for a position outside a sequence). Never another
exception, never a crash of the interpreter."""

import contextlib
import os
import struct
import tempfile

import numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megafmt import IndexedDataset, MegafmtError, get_bin_path, get_idx_path, verify
from megafmt.format import HEADER

DOCUMENTS = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8, 9, 10]], [[11, 12]]]
ALLOWED = (MegafmtError, IndexError)


def exercise(prefix, multimodal):
    try:
        dataset = IndexedDataset(prefix, multimodal=multimodal, mmap=multimodal is False)
    except ALLOWED:
        return
    for i in range(min(len(dataset), 64)):
        try:
            dataset[i]
            dataset.get(i, offset=0, length=0)
        except ALLOWED:
            pass
    with contextlib.suppress(ALLOWED):
        dataset[0 : min(len(dataset), 64)]
    assert isinstance(verify(prefix, stop_at_first=False), list)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), multimodal=st.booleans())
def test_arbitrary_bytes(data, multimodal):
    with tempfile.TemporaryDirectory() as directory:
        prefix = os.path.join(directory, "c")
        with open(get_idx_path(prefix), "wb") as stream:
            stream.write(data)
        with open(get_bin_path(prefix), "wb") as stream:
            stream.write(bytes(range(64)))
        exercise(prefix, multimodal)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    code=st.integers(0, 255),
    sequences=st.integers(0, 2**64 - 1) | st.integers(0, 8),
    documents=st.integers(0, 2**64 - 1) | st.integers(0, 8),
    body=st.binary(max_size=160),
    multimodal=st.booleans(),
)
def test_plausible_headers_with_random_bodies(code, sequences, documents, body, multimodal):
    with tempfile.TemporaryDirectory() as directory:
        prefix = os.path.join(directory, "c")
        with open(get_idx_path(prefix), "wb") as stream:
            stream.write(HEADER.pack(b"MMIDIDX\x00\x00", 1, code, sequences, documents) + body)
        with open(get_bin_path(prefix), "wb") as stream:
            stream.write(bytes(range(48)))
        exercise(prefix, multimodal)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(st.tuples(st.integers(0, 145), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.none() | st.integers(0, 146),
    bin_cut=st.none() | st.integers(0, 48),
)
def test_mutations_of_a_valid_corpus(edits, cut, bin_cut):
    with tempfile.TemporaryDirectory() as directory:
        prefix = os.path.join(directory, "c")
        data = bytearray(valid_index())
        for offset, value in edits:
            data[offset] = value
        with open(get_idx_path(prefix), "wb") as stream:
            stream.write(bytes(data[:cut]))
        with open(get_bin_path(prefix), "wb") as stream:
            stream.write(numpy.arange(12, dtype=numpy.int32).tobytes()[:bin_cut])
        exercise(prefix, multimodal=False)


def valid_index():
    """The 146-byte index of DOCUMENTS as int32, from the spec."""
    lengths = [3, 2, 1, 0, 4, 2]
    pointers = [0, 12, 20, 24, 24, 40]
    return (
        HEADER.pack(b"MMIDIDX\x00\x00", 1, 4, 6, 5)
        + struct.pack("<6i", *lengths)
        + struct.pack("<6q", *pointers)
        + struct.pack("<5q", 0, 2, 3, 5, 6)
    )


def test_the_unmutated_corpus_is_valid(tmp_path):
    prefix = str(tmp_path / "c")
    with open(get_idx_path(prefix), "wb") as stream:
        stream.write(valid_index())
    with open(get_bin_path(prefix), "wb") as stream:
        stream.write(numpy.arange(12, dtype=numpy.int32).tobytes())
    assert verify(prefix) == []
    assert IndexedDataset(prefix)[4].tolist() == [6, 7, 8, 9]
