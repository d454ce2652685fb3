"""Fuzzing the .idx parser, and `verify` against what reading shows.

Whatever the bytes, opening and reading a corpus either works or raises a megafmt error (or
IndexError for a position outside a sequence): never another exception, never a crash of the
interpreter. The memory-mapped and the file reader read the same or fail alike. And `verify`
finds no violation exactly when the corpus opens, every sequence reads, and what the dataset
hands out is what the format promises: the sequences, read one after another, are the whole
``.bin`` (each pointer is where the previous sequence ended, the last ends at the end of the
file) and the document indices run from 0 up to the sequence count without going back.
Opening checks only what it can cheaply (a longer ``.bin`` or misplaced pointers still read),
so those two are checked here, from the dataset's own arrays.
"""

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


def reads_as_promised(prefix, multimodal):
    """Whether the corpus opens, every sequence reads (one by one and as one slice), the reads
    tile the ``.bin`` in order and the document indices are a partition of the sequences."""
    try:
        dataset = IndexedDataset(prefix, multimodal=multimodal, mmap=multimodal is False)
        sequences = [dataset[i] for i in range(len(dataset))]
        window = dataset[0 : len(dataset)]
        for i in range(len(dataset)):
            dataset.get(i, offset=0, length=0)
    except ALLOWED:
        return False
    if multimodal:
        sequences, window = [tokens for tokens, _mode in sequences], window[0]
    end = 0
    for sequence, pointer in zip(sequences, dataset.sequence_pointers, strict=True):
        if int(pointer) != end:
            return False
        end += sequence.nbytes
    documents = dataset.document_indices
    if end != os.path.getsize(get_bin_path(prefix)) or documents[0] != 0:
        return False
    if not numpy.all(documents[1:] >= documents[:-1]):
        return False
    # the slice is read in one piece from the first pointer: the same tokens when they tile
    assert [s.tolist() for s in window] == [s.tolist() for s in sequences]
    return True


def each_read(prefix, multimodal, mmap):
    """What reading gives through one reader: None when the corpus does not open, else each
    sequence's bytes, None where its read fails."""
    try:
        dataset = IndexedDataset(prefix, multimodal=multimodal, mmap=mmap)
    except ALLOWED:
        return None
    reads = []
    for i in range(len(dataset)):
        try:
            tokens = dataset[i]
        except ALLOWED:
            reads.append(None)
            continue
        reads.append((tokens[0] if multimodal else tokens).tobytes())
    return reads


def exercise(prefix, multimodal):
    """`verify` (asked for the modes section exactly when the dataset is) agrees with reading,
    and the two local readers read the same or fail alike."""
    violations = verify(prefix, multimodal=True if multimodal else None, stop_at_first=False)
    assert (violations == []) == reads_as_promised(prefix, multimodal), violations
    assert each_read(prefix, multimodal, mmap=True) == each_read(prefix, multimodal, mmap=False)


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
