"""Writing files so that a reader never sees a half-written one.

Data goes to a ``*.partial`` file beside the destination (unique per writer, so two processes
writing the same destination do not collide) and is renamed over the destination only once it
is complete. ``os.replace`` is atomic on POSIX file systems: a reader sees the old file or the
new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import BinaryIO

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str) -> str:
    """A temporary name beside ``path``, unique to this process and call."""
    return f"{path}.{os.getpid()}-{secrets.token_hex(4)}{PARTIAL_SUFFIX}"


def remove_quietly(path: str) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def atomic_write(path: str, fsync: bool = False) -> Iterator[BinaryIO]:
    """Write a file that appears at ``path`` only when the ``with`` block succeeds.

    On an exception the partial file is deleted and ``path`` is left as it was. With ``fsync``
    the data reach the disk before the rename, so the file survives a power loss too.
    """
    partial = partial_path(path)
    try:
        with open(partial, "wb") as stream:
            yield stream
            if fsync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(partial, path)
    except BaseException:
        remove_quietly(partial)
        raise
