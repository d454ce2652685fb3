"""The default ``.bin`` reader: one read-only memory map of the whole file.

Reads are zero-copy views into the mapping, so the page cache is shared by every process on the
machine (DataLoader workers included). A returned array keeps the mapping alive; it is unmapped
when the reader and every array it returned are gone, never under a live array. No file
descriptor stays open (:mod:`megafmt.mapping`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy

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
            self.nbytes = os.fstat(fd).st_size
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

    def close(self) -> None:
        """Drop this reader's reference to the mapping."""
        self._views = {}
        self._data = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path,))

    def __repr__(self) -> str:
        return f"MMapBinReader({self.path!r})"
