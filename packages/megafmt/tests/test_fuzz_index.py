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
from megafmt.index import Index
from megafmt.verification import _small_index_passes, index_violations

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


@st.composite
def nearly_valid_indices(draw):
    """An int32 index's bytes and a ``.bin`` size, consistent but for a few slips: lengths that
    may be negative, pointers, document indices and the size each maybe off by a little."""
    lengths = draw(st.lists(st.integers(-2, 5), max_size=6))
    pointers = [4 * sum(lengths[:i]) for i in range(len(lengths))]
    cuts = draw(st.lists(st.integers(1, max(1, len(lengths))), max_size=3))
    documents = [0, *sorted(cuts), len(lengths)] if lengths else [0]
    for table in (pointers, documents):
        if table and draw(st.booleans()):
            table[draw(st.integers(0, len(table) - 1))] += draw(st.sampled_from([-4, -1, 1, 4]))
    if draw(st.booleans()):
        documents = documents[: draw(st.integers(0, len(documents)))]
    tokens = (pointers[-1] + 4 * lengths[-1]) // 4 if lengths else 0
    bin_size = 4 * tokens + draw(st.sampled_from([0, 0, 0, -4, 4, 1]))
    data = (
        HEADER.pack(b"MMIDIDX\x00\x00", 1, 4, len(lengths), len(documents))
        + struct.pack(f"<{len(lengths)}i", *lengths)
        + struct.pack(f"<{len(pointers)}q", *pointers)
        + struct.pack(f"<{len(documents)}q", *documents)
    )
    return data, bin_size


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index_and_size=nearly_valid_indices()
    | st.tuples(
        st.lists(st.tuples(st.integers(0, 145), st.integers(0, 255)), max_size=4).map(
            lambda edits: mutated(valid_index(), edits)
        ),
        st.integers(0, 60) | st.just(48),
    ),
)
def test_the_small_index_test_at_open_passes_exactly_what_the_full_check_passes(
    index_and_size,
):
    """The dozen-operation test opening gives a small index passes an index and ``.bin`` size
    exactly when the chunked check finds no violation (that check words the error)."""
    data, bin_size = index_and_size
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "c.idx")
        with open(path, "wb") as stream:
            stream.write(data)
        try:
            index = Index(path)
        except MegafmtError:
            return
        found = list(index_violations(index, "c.bin", bin_size))
        assert _small_index_passes(index, bin_size) == (not found), found


def mutated(data, edits):
    """``data`` with the byte at each offset of ``edits`` set to its value."""
    data = bytearray(data)
    for offset, value in edits:
        data[offset] = value
    return bytes(data)


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
