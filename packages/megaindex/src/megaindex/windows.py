"""Reading GPT samples' windows of token ids: which documents a sample spans, and their tokens.

A sample is ``sequence_length`` tokens (plus the extra one that becomes the last label) cut
from the shuffled stream of documents: from an offset in its first document to an offset in
its last, the ones between whole (see :mod:`megaindex.gpt_index`). Its window is those tokens
as int64, padded with the pad id when the stream ends first.

How the tokens are read depends on what the dataset's token source can do (the Protocols of
:mod:`megafmt.protocols`), decided once when the dataset is made:

* a :class:`~megafmt.protocols.MappedTokenSource` whose ``.bin`` is mapped (megafmt's default
  reader): every window of a batch in one C++ call (:class:`megaindex.helpers.WindowGatherer`);
* a :class:`~megafmt.protocols.SpanSource`: one ``read_spans`` call per sample;
* any :class:`~megafmt.protocols.TokenSource` (megatron-core's ``get``): one call per document;
* a subclass written against megatron-core that overrides
  ``_query_document_sample_shuffle_indices`` (as Megatron-LM's FIM dataset does): that method,
  per sample, so its samples are the ones it shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy

from megafmt.protocols import MappedTokenSource, Read, SpanSource, TokenSource, conforms
from megaindex.helpers import WindowGatherer
from megaindex.tables import CachedTables

Spans = tuple[list[int], list[int], list[int | None]]


@functools.cache
def can_hold(dtype: numpy.dtype, value: int) -> bool:
    """Whether integers of ``dtype`` can take ``value`` (a pad id of -1 never appears in a
    corpus of unsigned tokens)."""
    limits = numpy.iinfo(dtype)
    return limits.min <= value <= limits.max


def pad_rows(written: list[int], out: numpy.ndarray, pad: int) -> bool:
    """Pad each row of ``out`` after the ``written[row]`` tokens it got; whether any was."""
    padded = False
    width = out.shape[1]
    for row, count in enumerate(written):
        if count < width:
            out[row, count:] = pad
            padded = True
    return padded


class WindowReader:
    """Fills rows with sample windows, reading tokens one document at a time (``get``)."""

    def __init__(self, source: TokenSource, tables: CachedTables, extra: int, pad: int) -> None:
        self.source = source
        self.tables = tables
        self.extra = extra
        self.pad = pad

    def spans(self, idx: int) -> Spans:
        """Sample ``idx`` as spans of documents: their ids, the first token taken from each,
        and how many tokens (None: to the document's end)."""
        sample = int(self.tables["shuffle_index"][idx])
        (begin, begin_offset), (end, end_offset) = self.tables["sample_index"][
            sample : sample + 2
        ].tolist()
        documents = self.tables["document_index"][begin : end + 1].tolist()
        offsets = [begin_offset] + [0] * (len(documents) - 1)
        lengths: list[int | None] = [None] * (len(documents) - 1) + [end_offset + self.extra]
        if begin == end:
            lengths[0] = end_offset - begin_offset + self.extra
        return documents, offsets, lengths

    def reads(self, indices: Sequence[int | None]) -> list[Read]:
        """The ``get`` calls that read the samples at ``indices`` (None: skipped)."""
        reads: list[Read] = []
        for idx in indices:
            if idx is not None:
                reads.extend(zip(*self.spans(idx), strict=True))
        return reads

    def fill(self, indices: Sequence[int], out: numpy.ndarray) -> bool:
        """Fill row ``i`` of ``out`` (int64, ``[len(indices), window]``) with sample
        ``indices[i]``'s window, padded. Returns whether a row may hold the pad id (False: no
        row was padded and the corpus's tokens cannot take that value)."""
        pad_rows([self._read(idx, out[row]) for row, idx in enumerate(indices)], out, self.pad)
        return True

    def _read(self, idx: int, out: numpy.ndarray) -> int:
        written = 0
        for document, offset, length in zip(*self.spans(idx), strict=True):
            part = self.source.get(document, offset=offset, length=length)
            out[written : written + len(part)] = part
            written += len(part)
        return written


class SpanWindowReader(WindowReader):
    """Reads each window with one ``read_spans`` call."""

    source: SpanSource

    def _read(self, idx: int, out: numpy.ndarray) -> int:
        return self.source.read_spans(*self.spans(idx), out)


class MappedWindowReader(WindowReader):
    """Gathers every window of a batch in one native call from the mapped ``.bin``; while the
    source has no mapping (its reader was released, to be reopened), ``fallback`` reads."""

    source: MappedTokenSource

    def __init__(self, fallback: WindowReader) -> None:
        super().__init__(fallback.source, fallback.tables, fallback.extra, fallback.pad)
        self.fallback = fallback
        self._gatherer: WindowGatherer | None = None
        self._tokens: numpy.ndarray | None = None

    def gatherer(self) -> WindowGatherer | None:
        """The native gatherer of the mapped ``.bin`` and the tables (made on first use, and
        again for a reopened reader); None while the source has no mapping."""
        tokens = self.source.tokens_view
        if tokens is None:
            return None
        if self._gatherer is None or tokens is not self._tokens:
            self._gatherer = WindowGatherer(
                tokens,
                self.source.sequence_pointers,
                self.source.sequence_lengths,
                self.tables["document_index"],
                self.tables["sample_index"],
                self.tables["shuffle_index"],
                self.extra,
            )
            self._tokens = tokens
        return self._gatherer

    def fill(self, indices: Sequence[int], out: numpy.ndarray) -> bool:
        gatherer = self.gatherer()
        if gatherer is None:
            return self.fallback.fill(indices, out)
        padded = pad_rows(gatherer.gather(indices, out), out, self.pad)
        return padded or can_hold(self._tokens.dtype, self.pad)

    def __getstate__(self) -> dict:
        # the gatherer is native state of this process: a worker makes its own
        return {**self.__dict__, "_gatherer": None, "_tokens": None}


class QueriedWindowReader(WindowReader):
    """Reads each window through a megatron-core style ``_query_document_sample_shuffle_indices``
    override (which returns the window and the document ids); spans come from ``reader``."""

    def __init__(
        self, reader: WindowReader, query: Callable[[int], tuple[numpy.ndarray, numpy.ndarray]]
    ) -> None:
        super().__init__(reader.source, reader.tables, reader.extra, reader.pad)
        self.query = query

    def fill(self, indices: Sequence[int], out: numpy.ndarray) -> bool:
        self.tables["shuffle_index"]  # deferred tables are mapped before the override reads them
        for row, idx in enumerate(indices):
            out[row] = self.query(idx)[0]
        return True


def window_reader(source: TokenSource, tables: CachedTables, extra: int, pad: int) -> WindowReader:
    """The fastest reader the declared capabilities of ``source`` allow."""
    reader = (
        SpanWindowReader(source, tables, extra, pad)
        if conforms(source, SpanSource)
        else WindowReader(source, tables, extra, pad)
    )
    if conforms(source, MappedTokenSource) and source.tokens_view is not None:
        return MappedWindowReader(reader)
    return reader
