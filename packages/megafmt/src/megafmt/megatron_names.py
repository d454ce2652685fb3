"""megatron-core's private names of ``megatron.core.datasets.indexed_dataset``, for code that
imports them: the ``.idx`` reader and writer and the ``.bin`` readers, with megatron-core's
constructor signatures, each one of megafmt's classes underneath.

``_BinReader`` is the abstract base a custom reader derives from (one method,
``read(dtype, count, offset)``); the readers here derive from it and from megafmt's reader of
the same storage, so they also satisfy :class:`megafmt.BinReader`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from types import TracebackType
from typing import Any, BinaryIO

import numpy

from megafmt.index import Index, IndexWriter
from megafmt.object_storage import ObjectStorageConfig
from megafmt.readers.file_reader import FileBinReader
from megafmt.readers.fsspec_reader import FsspecBinReader
from megafmt.readers.mmap_reader import MMapBinReader
from megafmt.readers.msc_reader import MscBinReader


class _IndexReader(Index):
    """megatron-core's ``.idx`` reader: megafmt's :class:`~megafmt.index.Index`."""

    def __init__(
        self,
        idx_path: str,
        multimodal: bool,
        sequences_per_dataset: tuple[int, int] | None = None,
        dtype_code: int | None = None,
    ) -> None:
        super().__init__(idx_path, multimodal, sequences_per_dataset, dtype_code)


class _IndexWriter:
    """megatron-core's ``.idx`` writer: ``with _IndexWriter(idx_path, dtype) as writer:
    writer.write(sequence_lengths, sequence_modes, document_indices)``."""

    def __init__(self, idx_path: str, dtype: Any) -> None:
        self.idx_path = idx_path
        self.dtype = dtype
        self._writer = IndexWriter(dtype)  # refuses a dtype the format has no code for
        self.idx_writer: BinaryIO | None = None

    def __enter__(self) -> _IndexWriter:
        self.idx_writer = open(self.idx_path, "wb")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        if self.idx_writer is not None:
            self.idx_writer.close()

    def write(
        self,
        sequence_lengths: Iterable[int],
        sequence_modes: Iterable[int] | None,
        document_indices: Iterable[int],
    ) -> None:
        """Write the whole index; ``sequence_modes`` only for multimodal corpora."""
        if self.idx_writer is None:
            raise ValueError(
                f"{self.idx_path}: _IndexWriter.write must be called inside its `with` block; "
                "it was called outside"
            )
        self._writer.write(
            self.idx_writer,
            numpy.asarray(list(sequence_lengths)),
            numpy.asarray(list(document_indices)),
            None if sequence_modes is None else numpy.asarray(list(sequence_modes)),
        )


class _BinReader(ABC):
    """megatron-core's abstract ``.bin`` reader."""

    @abstractmethod
    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """``count`` items of ``dtype`` starting at byte ``offset`` of the ``.bin``."""


class _MMapBinReader(MMapBinReader, _BinReader):
    """``_MMapBinReader(bin_path)``: megafmt's memory-mapped reader."""

    def __init__(self, bin_path: str) -> None:
        super().__init__(bin_path)


class _FileBinReader(FileBinReader, _BinReader):
    """``_FileBinReader(bin_path, num_max_retries=3, sleep_duration_start=10)``: megafmt's
    positional reader, waiting 10, 20, 40 seconds (jittered) between retries by default, as
    megatron-core does."""

    def __init__(
        self, bin_path: str, num_max_retries: int = 3, sleep_duration_start: float = 10
    ) -> None:
        super().__init__(bin_path, num_max_retries, sleep_duration_start)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.policy.retries, self.policy.first_wait))


class _S3BinReader(FsspecBinReader, _BinReader):
    """``_S3BinReader(bin_path, object_storage_config)``: megafmt's object-storage reader,
    fetching ``object_storage_config.bin_chunk_nbytes`` per chunk."""

    def __init__(self, bin_path: str, object_storage_config: ObjectStorageConfig) -> None:
        chunk = object_storage_config.bin_chunk_nbytes
        if chunk <= 0:
            raise ValueError(
                f"{bin_path}: object_storage_config.bin_chunk_nbytes must be positive, got {chunk}"
            )
        super().__init__(
            bin_path,
            chunk_bytes=chunk,
            cache_bytes=max(chunk, 256 << 20),
            object_storage_config=object_storage_config,
        )


class _MultiStorageClientBinReader(MscBinReader, _BinReader):
    """``_MultiStorageClientBinReader(bin_path, object_storage_config)``: megafmt's ``msc://``
    reader (needs ``megafmt[msc]``)."""

    def __init__(self, bin_path: str, object_storage_config: ObjectStorageConfig) -> None:
        super().__init__(bin_path, object_storage_config=object_storage_config)
