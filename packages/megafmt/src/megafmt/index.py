"""Reading and writing ``.idx`` files (the layout is specified in :mod:`megafmt.format`).

:class:`Index` maps the whole file once (:mod:`megafmt.mapping`: no descriptor stays open) and
hands out its arrays as read-only numpy views of that one mapping: nothing is copied, and pages
are read on first touch. A view keeps the mapping alive, so arrays stay valid after the
:class:`Index` (or the dataset holding it) is gone; the mapping is released when the last view
is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy

from megafmt.dtypes import DType
from megafmt.errors import FormatError, MissingFileError
from megafmt.format import (
    DOCUMENT_INDEX_DTYPE,
    HEADER_SIZE,
    LENGTH_DTYPE,
    MODE_DTYPE,
    POINTER_DTYPE,
    Header,
    Layout,
    implied_token_count,
)
from megafmt.mapping import map_file
from megafmt.prefix_hints import missing_file_message
from megafmt.readers.pool import opened_with_room


def open_readonly(path: str, what: str) -> int:
    """A read-only file descriptor for ``path``; a missing file, or a directory where the file
    belongs, is a :class:`MissingFileError` naming ``path`` (POSIX opens a directory read-only
    without complaint, and the first read then fails without naming it). A process out of
    descriptors first has the pool of open readers give some back
    (:func:`~megafmt.readers.pool.opened_with_room`)."""
    try:
        fd = opened_with_room(lambda: os.open(path, os.O_RDONLY), path, what)
    except (FileNotFoundError, IsADirectoryError):
        fd = None
    if fd is not None and not stat.S_ISDIR(os.fstat(fd).st_mode):
        return fd
    if fd is not None:
        os.close(fd)
    raise MissingFileError(f"{path}: {missing_file_message(path, what)}")


class Index:
    """The contents of one ``.idx`` file.

    Attributes mirror megatron-core's index reader: ``dtype`` (a numpy scalar type),
    ``dtype_size``, ``sequence_count``, ``document_count``, and the arrays
    ``sequence_lengths``, ``sequence_pointers``, ``document_indices`` and
    ``sequence_modes`` (None unless opened with ``multimodal=True``).
    """

    def __init__(
        self,
        path: str,
        multimodal: bool = False,
        sequences_per_dataset: tuple[int, int] | None = None,
        dtype_code: int | None = None,
        *,
        name: str | None = None,
    ) -> None:
        """Map ``path``.

        With ``sequences_per_dataset`` (sequence count, document count) and ``dtype_code``
        given, the header is not parsed and those values are used instead, as megatron-core's
        fast cache load does; the file size is still checked against them. ``name`` is what
        messages call the file (the URL of a remote ``.idx`` whose local copy is ``path``).
        """
        self.path = path
        self.name = name or path
        fd = open_readonly(path, "index file")
        try:
            size = os.fstat(fd).st_size
            if sequences_per_dataset is not None:
                if dtype_code is None:
                    raise ValueError(
                        f"{self.name}: sequences_per_dataset is given without dtype_code"
                    )
                DType.dtype_from_code(dtype_code)
                header = Header(dtype_code, *map(int, sequences_per_dataset))
                counts_from = "sequences_per_dataset"
            else:
                header = Header.unpack(os.pread(fd, HEADER_SIZE, 0), self.name)
                counts_from = "the header at offset 18"
            self.layout = Layout.for_file(header, size, self.name, multimodal, counts_from)
            self._data = map_file(path, fd, size)
        finally:
            os.close(fd)

        self.dtype_code = header.dtype_code
        self.dtype: type[numpy.number] = DType.dtype_from_code(header.dtype_code)
        self.dtype_size = numpy.dtype(self.dtype).itemsize
        self.sequence_count = header.sequence_count
        self.document_count = header.document_count
        self.multimodal = multimodal
        #: whether the file holds a (non-empty) sequence_modes section
        self.has_modes = self.layout.has_modes and self.sequence_count > 0
        layout = self.layout
        self.sequence_lengths = self._view(LENGTH_DTYPE, layout.lengths_offset, self.sequence_count)
        self.sequence_pointers = self._view(
            POINTER_DTYPE, layout.pointers_offset, self.sequence_count
        )
        self.document_indices = self._view(
            DOCUMENT_INDEX_DTYPE, layout.document_indices_offset, self.document_count
        )
        self.sequence_modes = (
            self._view(MODE_DTYPE, layout.modes_offset, self.sequence_count) if multimodal else None
        )

    def _view(self, dtype: str, offset: int, count: int) -> numpy.ndarray:
        return self._data[offset : offset + count * numpy.dtype(dtype).itemsize].view(dtype)

    @property
    def nbytes(self) -> int:
        """The size of the ``.idx`` file."""
        return self.layout.nbytes

    @property
    def num_tokens(self) -> int:
        """Tokens in the corpus, from the last sequence's pointer and length (no scan)."""
        if self.sequence_count == 0:
            return 0
        return implied_token_count(
            int(self.sequence_pointers[-1]), int(self.sequence_lengths[-1]), self.dtype_size
        )

    @property
    def bin_nbytes(self) -> int:
        """The ``.bin`` size this index implies."""
        return self.num_tokens * self.dtype_size

    def __len__(self) -> int:
        return self.sequence_count

    def __getitem__(self, idx: int) -> tuple[numpy.int64, numpy.int32, numpy.int8 | None]:
        """The pointer, length and mode (None unless multimodal) of sequence ``idx``."""
        return (
            self.sequence_pointers[idx],
            self.sequence_lengths[idx],
            self.sequence_modes[idx] if self.sequence_modes is not None else None,
        )

    def __getstate__(self) -> Any:
        raise TypeError("an Index is not picklable; pickle the IndexedDataset that holds it")


def has_sequence_modes(idx_path: str) -> bool:
    """Whether the ``.idx`` at ``idx_path`` belongs to a multimodal corpus."""
    return Index(idx_path).has_modes


def sequence_pointers(lengths: numpy.ndarray, dtype_size: int) -> numpy.ndarray:
    """Byte offsets of sequences of ``lengths`` tokens laid back to back from 0."""
    pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
    if len(lengths) > 1:
        numpy.cumsum(lengths[:-1], dtype=numpy.int64, out=pointers[1:])
        pointers *= dtype_size
    return pointers


class IndexWriter:
    """Writes an ``.idx`` file from its arrays; the pointers are derived from the lengths."""

    def __init__(self, dtype: Any) -> None:
        self.dtype_code = DType.code_from_dtype(dtype)
        self.dtype_size = DType.size(dtype)

    def write(
        self,
        stream: BinaryIO,
        sequence_lengths: Sequence[int] | numpy.ndarray,
        document_indices: Sequence[int] | numpy.ndarray,
        sequence_modes: Sequence[int] | numpy.ndarray | None = None,
    ) -> None:
        """Write the whole index to ``stream``; ``sequence_modes`` only for multimodal files."""
        lengths = numpy.ascontiguousarray(sequence_lengths, dtype=LENGTH_DTYPE)
        documents = numpy.ascontiguousarray(document_indices, dtype=DOCUMENT_INDEX_DTYPE)
        if sequence_modes is not None and len(sequence_modes) != len(lengths):
            raise FormatError(
                f"sequence_modes has {len(sequence_modes)} entries, expected one per sequence "
                f"({len(lengths)})"
            )
        stream.write(Header(self.dtype_code, len(lengths), len(documents)).pack())
        stream.write(memoryview(lengths))
        stream.write(memoryview(sequence_pointers(lengths, self.dtype_size)))
        stream.write(memoryview(documents))
        if sequence_modes is not None:
            stream.write(memoryview(numpy.ascontiguousarray(sequence_modes, dtype=MODE_DTYPE)))
