"""Test support for corpora: conformance tests that every ``.bin`` reader runs, the built-in
ones and third parties', and :func:`write_corpus`, a random corpus for tests of anything that
reads one.

Subclass :class:`BinReaderConformance` in a pytest module and name the reader (its checks go
through ``numpy.testing``, so they hold under ``python -O`` too)::

    from megafmt.testing import BinReaderConformance

    class TestMyReader(BinReaderConformance):
        reader_name = "myreader"            # its name in the megafmt.readers entry points

A reader of remote storage overrides :meth:`BinReaderConformance.publish` to upload the corpus
the suite writes locally and return where the reader finds it. Requires pytest.
"""

from __future__ import annotations

import gc
import pickle
from typing import Any, ClassVar

import numpy
import pytest

from megafmt.builder import IndexedDatasetBuilder
from megafmt.dataset import IndexedDataset
from megafmt.errors import FormatError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.readers import READERS, BinReader

#: The vocabulary of :func:`write_corpus`'s documents unless told otherwise: ids below it, and the
#: id itself ends a document, as megatron-core's ``NullTokenizer(VOCAB)`` does.
VOCAB = 1000


def write_corpus(
    prefix: str,
    documents: int = 300,
    *,
    seed: int = 0,
    shortest: int = 1,
    longest: int = 60,
    dtype: Any = numpy.uint16,
    vocab: int = VOCAB,
    eod: int | None = VOCAB,
) -> str:
    """Write ``documents`` random documents of one sequence each at ``prefix``; returns it.

    A document holds ``shortest`` to ``longest - 1`` ids below ``vocab`` (drawn by
    ``numpy.random.default_rng(seed)``, so a seed always gives the same corpus), then ``eod``
    unless it is None.
    """
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)
    for _ in range(documents):
        tokens = rng.integers(0, vocab, int(rng.integers(shortest, longest)))
        if eod is not None:
            tokens = numpy.append(tokens, eod)
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(get_idx_path(prefix))
    return prefix


SEQUENCES = {
    numpy.uint16: [[1, 2, 3], [], [65535, 0, 7, 9], [5], list(range(100, 300))],
    numpy.int32: [[-(2**31), 2**31 - 1, 0], [42], [], list(range(-50, 50))],
}


class BinReaderConformance:
    """The behaviour every reader shares with the built-in ``mmap`` and ``file`` readers."""

    reader_name: ClassVar[str] = ""
    reader_options: ClassVar[dict[str, Any]] = {}

    def publish(self, local_prefix: str) -> str:
        """The prefix the reader reads the corpus written at ``local_prefix`` from."""
        return local_prefix

    def open_reader(self, bin_path: str) -> BinReader:
        return READERS.get(self.reader_name)(bin_path, **self.reader_options)

    @pytest.fixture(params=sorted(SEQUENCES, key=lambda dtype: dtype.__name__))
    def reader_corpus(self, request: Any, tmp_path: Any) -> tuple[str, Any, list[numpy.ndarray]]:
        dtype = request.param
        sequences = [numpy.array(s, dtype=dtype) for s in SEQUENCES[dtype]]
        prefix = str(tmp_path / f"corpus_{dtype.__name__}")
        builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)
        for sequence in sequences:
            builder.add_item(sequence)
            builder.end_document()
        builder.finalize(get_idx_path(prefix))
        return self.publish(prefix), dtype, sequences

    def test_reports_size(self, reader_corpus: Any) -> None:
        prefix, dtype, sequences = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        expected = sum(len(s) for s in sequences) * numpy.dtype(dtype).itemsize
        numpy.testing.assert_equal(reader.nbytes, expected)

    def test_reads_every_sequence(self, reader_corpus: Any) -> None:
        prefix, dtype, sequences = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        offset = 0
        for sequence in sequences:
            got = reader.read(dtype, len(sequence), offset)
            numpy.testing.assert_equal(got.dtype, numpy.dtype(dtype))
            numpy.testing.assert_array_equal(got, sequence)
            offset += sequence.nbytes

    def test_reads_at_any_byte_offset(self, reader_corpus: Any) -> None:
        prefix, _dtype, sequences = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        raw = numpy.concatenate(sequences).view(numpy.uint8)
        for offset in (0, 1, 3, len(raw) // 2, len(raw) - 1):
            numpy.testing.assert_array_equal(reader.read(numpy.uint8, 1, offset), raw[offset:][:1])

    def test_zero_items_and_the_very_end(self, reader_corpus: Any) -> None:
        prefix, dtype, sequences = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        numpy.testing.assert_equal(len(reader.read(dtype, 0, 0)), 0)
        numpy.testing.assert_equal(len(reader.read(dtype, 0, reader.nbytes)), 0)
        numpy.testing.assert_array_equal(
            reader.read(dtype, 1, reader.nbytes - numpy.dtype(dtype).itemsize), sequences[-1][-1:]
        )

    def test_read_past_the_end_is_a_format_error(self, reader_corpus: Any) -> None:
        prefix, dtype, _ = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        itemsize = numpy.dtype(dtype).itemsize
        with pytest.raises(FormatError, match="shorter than its index implies"):
            reader.read(dtype, 2, reader.nbytes - itemsize)
        with pytest.raises(FormatError):
            reader.read(dtype, 1, -itemsize)

    def test_pickled_reader_reopens(self, reader_corpus: Any) -> None:
        prefix, dtype, sequences = reader_corpus
        clone = pickle.loads(pickle.dumps(self.open_reader(get_bin_path(prefix))))
        numpy.testing.assert_array_equal(clone.read(dtype, len(sequences[0]), 0), sequences[0])

    def test_arrays_outlive_the_reader(self, reader_corpus: Any) -> None:
        prefix, dtype, sequences = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        got = reader.read(dtype, len(sequences[0]), 0)
        reader.close()
        del reader
        gc.collect()
        numpy.testing.assert_array_equal(got, sequences[0])

    def test_read_after_close_fails_cleanly(self, reader_corpus: Any) -> None:
        prefix, dtype, _ = reader_corpus
        reader = self.open_reader(get_bin_path(prefix))
        reader.close()
        with pytest.raises(ValueError, match="closed"):
            reader.read(dtype, 1, 0)

    def test_indexed_dataset_through_this_reader(self, reader_corpus: Any) -> None:
        prefix, _dtype, sequences = reader_corpus
        dataset = IndexedDataset(
            prefix, reader=self.reader_name, reader_options=self.reader_options
        )
        numpy.testing.assert_equal(len(dataset), len(sequences))
        for i, sequence in enumerate(sequences):
            numpy.testing.assert_array_equal(dataset[i], sequence)
            numpy.testing.assert_array_equal(
                dataset.get(i, offset=len(sequence) // 2), sequence[len(sequence) // 2 :]
            )
        for got, sequence in zip(dataset[1:], sequences[1:], strict=True):
            numpy.testing.assert_array_equal(got, sequence)
        clone = pickle.loads(pickle.dumps(dataset))
        numpy.testing.assert_array_equal(clone[len(sequences) - 1], sequences[-1])
