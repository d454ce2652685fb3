"""A ``.bin`` reader that uses positional reads instead of a memory map.

For file systems where mapping is slow or unsafe (some network and parallel file systems, or
files that may be replaced while a job runs). One descriptor is opened per reader and read with
``preadv`` straight into the array returned. Each read takes its descriptor and counts itself
in flight under a short lock (the ``preadv`` itself runs outside it), and ``close`` closes the
descriptors only once no read is in flight: a read never goes through a number that a
concurrent close released and the system may have given to another file. A transient
failure (``EIO``, ``ESTALE``, a timeout ...; see :mod:`megafmt.retry`) is retried under the
same :class:`~megafmt.retry.RetryPolicy` as object storage, on a freshly opened descriptor
(which recovers from stale NFS handles); the failed one is kept open until the reader closes,
so another thread still reading through it can never read another file that reused its number.
After the last retry, or at once for a failure no retry can help, the error is raised as a
:class:`~megafmt.errors.ReadError`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy

from megafmt.errors import FormatError
from megafmt.index import open_readonly
from megafmt.readers.base import check_read_range
from megafmt.retry import RetryPolicy


class FileBinReader:
    """Reads a local ``.bin`` with ``preadv``, retrying transient failures.

    ``num_max_retries`` retries follow a failed read, the first after up to
    ``sleep_duration_start`` seconds and each later one after up to twice as long (jittered
    down by at most half), capped at ``max_sleep_duration``: a
    :class:`~megafmt.retry.RetryPolicy`. megatron-core's equivalent sleeps 10, 20 and 40
    seconds.
    """

    def __init__(
        self,
        path: str,
        num_max_retries: int = 3,
        sleep_duration_start: float = 1.0,
        max_sleep_duration: float = 60.0,
    ) -> None:
        if num_max_retries < 0 or sleep_duration_start < 0 or max_sleep_duration < 0:
            raise ValueError(
                f"num_max_retries, sleep_duration_start and max_sleep_duration must be >= 0, "
                f"got {num_max_retries}, {sleep_duration_start} and {max_sleep_duration}"
            )
        self.path = path
        self.policy = RetryPolicy(num_max_retries, sleep_duration_start, max_sleep_duration)
        self.retry_count = [0]
        self._closed = False
        self._lock = threading.Lock()
        self._retired: list[int] = []  # descriptors that failed, closed with the reader
        self._in_flight = 0  # reads under way: close() leaves their descriptors open
        self._fd: int | None = open_readonly(path, "token file")
        self.nbytes = os.fstat(self._fd).st_size
        self._itemsizes: dict[Any, int] = {}

    @property
    def retries(self) -> int:
        """Reads retried so far by this reader."""
        return self.retry_count[0]

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """A new array of ``count`` items of ``dtype`` read at byte ``offset``."""
        itemsize = self._itemsizes.get(dtype)
        if itemsize is None:
            itemsize = self._itemsizes[dtype] = numpy.dtype(dtype).itemsize
        check_read_range(self.path, self.nbytes, offset, count, itemsize)
        if self._closed:
            raise ValueError(f"{self.path}: read from a closed reader")
        out = numpy.empty(count, dtype=dtype)
        self._read_into(memoryview(out.view(numpy.uint8)), int(offset))
        return out

    def _read_into(self, buffer: memoryview, offset: int) -> None:
        what = f"{self.path}: reading {len(buffer)} bytes at offset {offset}"
        filled = 0
        while filled < len(buffer):
            got = self.policy.call(
                what, self._pread, buffer[filled:], offset + filled, counter=self.retry_count
            )
            if got == 0:
                raise FormatError(
                    f"{self.path}: unexpected end of file at byte {offset + filled} while reading "
                    f"{len(buffer)} bytes at offset {offset}; the file was "
                    f"{self.nbytes} bytes when opened (was it truncated?)"
                )
            filled += got

    def _pread(self, buffer: memoryview, offset: int) -> int:
        """One ``preadv`` into ``buffer`` through a descriptor held open while it runs; a
        descriptor it fails on is retired, so the next attempt opens a fresh one."""
        fd = self._hold()
        try:
            return os.preadv(fd, [buffer], offset)
        except OSError:
            with self._lock:
                if self._fd == fd:
                    self._retired.append(fd)
                    self._fd = None
            raise
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._closed and not self._in_flight:
                    self._close_all()  # the close that came meanwhile

    def _hold(self) -> int:
        """The open descriptor (a fresh one after a failure), counted in flight until the read
        ends; never one after the reader closed. The fresh one is opened outside the lock: an
        open near the open-files limit may wait for descriptors, and other threads' reads and
        ends of reads go on meanwhile."""
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.path}: read from a closed reader")
            if self._fd is not None:
                self._in_flight += 1
                return self._fd
        fresh = open_readonly(self.path, "token file")
        with self._lock:
            if self._closed or self._fd is not None:  # closed, or another thread opened one
                os.close(fresh)
                if self._closed:
                    raise ValueError(f"{self.path}: read from a closed reader")
            else:
                self._fd = fresh
            self._in_flight += 1
            return self._fd

    def _close_all(self, close: Callable[[int], None] = os.close) -> None:
        # os.close bound here: a reader collected at interpreter exit finds module globals gone
        descriptors = [getattr(self, "_fd", None), *getattr(self, "_retired", [])]
        self._fd, self._retired = None, []
        for fd in descriptors:
            if fd is not None:
                try:  # noqa: SIM105 (contextlib.suppress, a global, is gone at exit too)
                    close(fd)
                except OSError:
                    pass

    def close(self) -> None:
        """Close the descriptors: at once, or when the last read under way ends."""
        with self._lock:
            self._closed = True
            if not self._in_flight:
                self._close_all()

    def __del__(self) -> None:
        self._close_all()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.path, self.policy.retries, self.policy.first_wait, self.policy.max_wait),
        )

    def __repr__(self) -> str:
        return f"FileBinReader({self.path!r})"
