"""A ``.bin`` reader that uses positional reads instead of a memory map.

For file systems where mapping is slow or unsafe (some network and parallel file systems, or
files that may be replaced while a job runs). One descriptor is opened per reader and read with
``preadv`` straight into the array returned, so concurrent reads need no lock. An ``OSError``
is retried after an exponentially growing pause on a freshly opened descriptor (which recovers
from stale NFS handles); the failed one is kept open until the reader closes, so another thread
still reading through it can never read another file that reused its number. After the last
retry the error is raised as a :class:`~megafmt.errors.ReadError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from typing import Any

import numpy

from megafmt.errors import FormatError, ReadError
from megafmt.index import open_readonly
from megafmt.readers.base import check_read_range

logger = logging.getLogger(__name__)


class FileBinReader:
    """Reads a local ``.bin`` with ``preadv``, retrying transient failures.

    ``num_max_retries`` retries follow a failed read, the first after ``sleep_duration_start``
    seconds and each later one after twice the previous pause (with +-10% jitter), capped at
    ``max_sleep_duration``. megatron-core's equivalent sleeps 10, 20 and 40 seconds.
    """

    def __init__(
        self,
        path: str,
        num_max_retries: int = 3,
        sleep_duration_start: float = 1.0,
        max_sleep_duration: float = 60.0,
    ) -> None:
        if num_max_retries < 0 or sleep_duration_start < 0:
            raise ValueError(
                f"num_max_retries and sleep_duration_start must be >= 0, got "
                f"{num_max_retries} and {sleep_duration_start}"
            )
        self.path = path
        self.num_max_retries = num_max_retries
        self.sleep_duration_start = sleep_duration_start
        self.max_sleep_duration = max_sleep_duration
        self._closed = False
        self._lock = threading.Lock()
        self._retired: list[int] = []  # descriptors that failed, closed with the reader
        self._fd: int | None = open_readonly(path, "token file")
        self.nbytes = os.fstat(self._fd).st_size
        self._itemsizes: dict[Any, int] = {}

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """A new array of ``count`` items of ``dtype`` read at byte ``offset``."""
        itemsize = self._itemsizes.get(dtype)
        if itemsize is None:
            itemsize = self._itemsizes[dtype] = numpy.dtype(dtype).itemsize
        check_read_range(self.path, self.nbytes, offset, count, itemsize)
        out = numpy.empty(count, dtype=dtype)
        self._read_into(memoryview(out.view(numpy.uint8)), int(offset))
        return out

    def _read_into(self, buffer: memoryview, offset: int) -> None:
        filled = 0
        failures = 0
        while filled < len(buffer):
            fd = self._descriptor()
            try:
                got = os.preadv(fd, [buffer[filled:]], offset + filled)
            except OSError as error:
                failures += 1
                self._retry_or_raise(error, failures, len(buffer), offset, fd)
                continue
            if got == 0:
                raise FormatError(
                    f"{self.path}: unexpected end of file at byte {offset + filled} while reading "
                    f"{len(buffer)} bytes at offset {offset}; the file was "
                    f"{self.nbytes} bytes when opened (was it truncated?)"
                )
            filled += got

    def _descriptor(self) -> int:
        fd = self._fd
        if fd is not None:
            return fd
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: read from a closed reader")
            if self._fd is None:
                self._fd = open_readonly(self.path, "token file")
            return self._fd

    def _retry_or_raise(
        self, error: OSError, failures: int, size: int, offset: int, fd: int
    ) -> None:
        what = f"{self.path}: reading {size} bytes at offset {offset}"
        if failures > self.num_max_retries:
            raise ReadError(f"{what} failed {failures} times, giving up: {error}") from error
        pause = self.sleep_duration_start * 2 ** (failures - 1) * random.uniform(0.9, 1.1)
        pause = min(pause, self.max_sleep_duration)
        logger.warning(
            "%s failed (attempt %d of %d): %s; retrying in %.2f s",
            what,
            failures,
            self.num_max_retries + 1,
            error,
            pause,
        )
        with self._lock:  # the next read opens a fresh descriptor
            if self._fd == fd:
                self._retired.append(fd)
                self._fd = None
        time.sleep(pause)

    def _close_all(self) -> None:
        descriptors = [getattr(self, "_fd", None), *getattr(self, "_retired", [])]
        self._fd, self._retired = None, []
        for fd in descriptors:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        """Close the descriptors."""
        with self._lock:
            self._closed = True
            self._close_all()

    def __del__(self) -> None:
        self._close_all()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.path, self.num_max_retries, self.sleep_duration_start, self.max_sleep_duration),
        )

    def __repr__(self) -> str:
        return f"FileBinReader({self.path!r})"
