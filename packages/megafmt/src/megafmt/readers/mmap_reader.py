"""The default ``.bin`` reader: one read-only memory map of the whole file.

Reads are zero-copy views into the mapping, so the page cache is shared by every process on the
machine (DataLoader workers included). A returned array keeps the mapping alive; it is unmapped
when the reader and every array it returned are gone, never under a live array. No file
descriptor stays open (:mod:`megafmt.mapping`).

A mapped file that shrinks (rewritten in place, as ``cp new.bin corpus.bin`` does) kills a
process that touches a page past its new end with SIGBUS, which Python cannot catch.
:meth:`MMapBinReader.check_size` (one ``stat``) turns that into a
:class:`~megafmt.errors.FormatError`; the dataset calls it before reading from the mapping (see
:mod:`megafmt.dataset` for how often). A file replaced by a rename (``mv``) is safe: the mapping
keeps the old file.
"""

from __future__ import annotations

import os
from typing import Any

import numpy

from megafmt.errors import FormatError
from megafmt.index import open_readonly
from megafmt.mapping import map_file
from megafmt.readers.base import check_read_range


class MMapBinReader:
    """Reads a local ``.bin`` through a memory map."""

    holds_descriptor = False

    def __init__(self, path: str) -> None:
        self.path = path
        fd = open_readonly(path, "token file")
        try:
            status = os.fstat(fd)
            self.nbytes = status.st_size
            self._identity = (status.st_dev, status.st_ino)
            self._data: numpy.ndarray | None = map_file(path, fd, self.nbytes)
        finally:
            os.close(fd)
        self._views: dict[Any, tuple[numpy.ndarray, int]] = {}

    def view(self, dtype: Any) -> numpy.ndarray:
        """The whole file as a read-only array of ``dtype`` (a trailing partial item is left
        out): slicing it is the cheapest read there is."""
        try:
            return self._views[dtype][0]
        except KeyError:
            return self._typed_view(dtype)[0]

    def _typed_view(self, dtype: Any) -> tuple[numpy.ndarray, int]:
        if self._data is None:
            raise ValueError(f"{self.path}: read from a closed reader")
        itemsize = numpy.dtype(dtype).itemsize
        view = self._data[: self.nbytes - self.nbytes % itemsize].view(dtype)
        self._views[dtype] = (view, itemsize)
        return view, itemsize

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """A read-only view of ``count`` items of ``dtype`` at byte ``offset``."""
        try:
            view, itemsize = self._views[dtype]
        except KeyError:
            view, itemsize = self._typed_view(dtype)
        if offset < 0 or count < 0 or offset + count * itemsize > self.nbytes:
            check_read_range(self.path, self.nbytes, offset, count, itemsize)
        if offset % itemsize == 0:
            start = offset // itemsize
            return view[start : start + count]
        return self._data[offset : offset + count * itemsize].view(dtype)

    def check_size(self) -> None:
        """Raise :class:`FormatError` when the mapped file is now shorter than when opened."""
        try:
            status = os.stat(self.path)
        except OSError:  # removed or renamed away: the mapping keeps the file it mapped
            return
        if (status.st_dev, status.st_ino) == self._identity and status.st_size < self.nbytes:
            raise FormatError(
                f"{self.path}: the file shrank from {self.nbytes} to {status.st_size} bytes "
                "since it was opened (rewritten in place?); reading it through the memory map "
                "would kill the process (SIGBUS). Replace corpora by renaming a new file over "
                "the old one, never in place, and reopen the dataset"
            )

    def close(self) -> None:
        """Drop this reader's reference to the mapping."""
        self._views = {}
        self._data = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path,))

    def __repr__(self) -> str:
        return f"MMapBinReader({self.path!r})"
