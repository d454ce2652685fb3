"""Reading a large file once, front to back, without crowding the page cache.

A pass over a whole corpus (``mega verify`` reads every byte of the ``.bin``) would otherwise
leave the file in the page cache and push out what other work keeps there: a verify of a
terabyte corpus would evict everything else. So the pass asks the kernel for aggressive
read-ahead (``posix_fadvise(POSIX_FADV_SEQUENTIAL)``) and, as it goes, drops what it has read
(``POSIX_FADV_DONTNEED`` on the range behind the read position, every :data:`DROP_EVERY`
bytes and at the end). Clean pages another process had cached from the same file are dropped
too: a corpus being trained on re-reads them from disk.

Advice is a hint: where the platform has no ``posix_fadvise``, the stream has no descriptor (a
remote object, a wrapped stream) or the file system refuses advice, nothing is advised and the
pass reads the same bytes.
"""

from __future__ import annotations

import contextlib
import os
from typing import IO

#: bytes read between two requests to drop the pages already read
DROP_EVERY = 64 << 20
#: whether this platform can advise the kernel at all
CAN_ADVISE = hasattr(os, "posix_fadvise")


class SequentialPass:
    """One front-to-back pass over ``stream``: read-ahead asked for at the start, the pages
    read dropped behind the position the caller reports with :meth:`consumed`."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._fd = _descriptor(stream) if CAN_ADVISE else None
        self._dropped = 0
        if self._fd is not None:  # length 0: to the end of the file
            self._advise(0, 0, os.POSIX_FADV_SEQUENTIAL)

    @property
    def advised(self) -> bool:
        """Whether the kernel is being advised (the stream has a descriptor here)."""
        return self._fd is not None

    def consumed(self, offset: int, final: bool = False) -> None:
        """Every byte before ``offset`` has been read: drop those pages, once
        :data:`DROP_EVERY` bytes have built up (at once when ``final``)."""
        if self._fd is not None and offset - self._dropped >= (1 if final else DROP_EVERY):
            self._advise(self._dropped, offset - self._dropped, os.POSIX_FADV_DONTNEED)
            self._dropped = offset

    def _advise(self, offset: int, length: int, advice: int) -> None:
        with contextlib.suppress(OSError):  # a hint the file system may refuse (a pipe, FUSE)
            os.posix_fadvise(self._fd, offset, length, advice)


def _descriptor(stream: IO[bytes]) -> int | None:
    """The descriptor of a local file's stream; None for one that has none (``io`` raises
    ``UnsupportedOperation``, an ``OSError``, for a remote object's)."""
    try:
        return stream.fileno()
    except OSError:
        return None
