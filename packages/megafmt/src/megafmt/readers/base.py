"""The interface every ``.bin`` storage reader implements.

A reader is made by calling its registered factory (usually the class) with the path of the
``.bin`` and keyword options. It reports the file size and returns ``count`` tokens of a dtype
starting at a byte ``offset``. Readers are registered in the entry-point group
``megafmt.readers``; ``megafmt.testing.BinReaderConformance`` is the test suite a new reader
runs to prove it behaves like the built-in ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import numpy

from megafmt.errors import FormatError


@runtime_checkable
class BinReader(Protocol):
    """Random access to the tokens of one ``.bin`` file."""

    path: str
    """Where the file is (a local path or a URL)."""

    nbytes: int
    """The size of the file in bytes."""

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """``count`` items of ``dtype`` starting at byte ``offset``.

        Raises :class:`~megafmt.errors.FormatError` when the range passes the end of the file,
        and :class:`~megafmt.errors.ReadError` when the storage fails for good. Never returns
        fewer items than asked for.
        """
        ...

    def close(self) -> None:
        """Release what the reader holds; arrays it returned stay valid."""
        ...


# What a reader may offer beyond BinReader, each checked with isinstance by the dataset.


@runtime_checkable
class ViewableBinReader(BinReader, Protocol):
    """A reader that can also hand out the whole file as one array (the ``mmap`` reader).

    Datasets use ``view`` when a reader has it, and ``read`` otherwise.
    """

    def view(self, dtype: Any) -> numpy.ndarray:
        """The whole file as a read-only array of ``dtype``."""
        ...


@runtime_checkable
class PrefetchingBinReader(BinReader, Protocol):
    """A reader that fetches announced byte ranges ahead of their reads (object storage)."""

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Start fetching the ``(offset, size)`` ranges read next, in order of use; returns how
        many requests were started."""
        ...


@runtime_checkable
class IndexCopyingBinReader(BinReader, Protocol):
    """A reader of a remote ``.bin`` that keeps a local copy of the corpus's ``.idx``."""

    @property
    def local_idx_path(self) -> str:
        """Where the ``.idx`` can be read on this machine (fetched when needed)."""
        ...


@runtime_checkable
class VersionReporting(BinReader, Protocol):
    """A reader of a remote corpus that says which versions of its objects it opened."""

    @property
    def opened_versions(self) -> dict[str, int | str] | None:
        """The sizes and ETags of the ``.bin`` it reads and of the ``.idx`` it copied, keyed as
        :func:`megafmt.fingerprint.corpus_fingerprint` keys a URL's (None: the ``.idx`` was not
        copied yet)."""
        ...


@runtime_checkable
class DescriptorReporting(BinReader, Protocol):
    """A reader that says whether it keeps a file descriptor open. One that keeps none (the
    ``mmap`` and ``fsspec`` readers) is left out of the pool that bounds open readers
    (:mod:`megafmt.readers.pool`); a reader that does not say is assumed to hold one."""

    holds_descriptor: bool


@runtime_checkable
class ShrinkDetecting(BinReader, Protocol):
    """A reader that can tell when its file became shorter than when it was opened (the
    ``mmap`` reader: touching a mapped page past the new end of the file kills the process with
    SIGBUS, which no Python code can catch, so the dataset asks before reading)."""

    def check_size(self) -> None:
        """Raise :class:`~megafmt.errors.FormatError` naming the file and both sizes when the
        file at ``path`` is the one opened and is now shorter than ``nbytes``."""
        ...


class BinReaderFactory(Protocol):
    """What a ``megafmt.readers`` entry point loads: ``factory(path, **options)``."""

    def __call__(self, path: str, **options: Any) -> BinReader: ...


def check_read_range(path: str, nbytes: int, offset: int, count: int, itemsize: int) -> None:
    """Raise unless ``count`` items of ``itemsize`` bytes at ``offset`` lie inside the file."""
    if offset < 0 or count < 0:
        raise FormatError(
            f"{path}: invalid read of {count} items at byte offset {offset} (a corrupt index?)"
        )
    end = offset + count * itemsize
    if end > nbytes:
        raise FormatError(
            f"{path}: reading {count} items of {itemsize} bytes at byte offset {offset} needs "
            f"{end} bytes, but the file has {nbytes} (the .bin is shorter than its index implies)"
        )


def versions_opened(
    idx_version: tuple[int, str] | None, bin_bytes: int, bin_version: str
) -> dict[str, int | str] | None:
    """What a :class:`VersionReporting` reader says it opened: the ``.idx`` as copied (its
    size and version; None: not copied yet, and nothing is said) and the ``.bin`` as opened,
    keyed as :func:`megafmt.fingerprint.corpus_fingerprint` keys a URL's."""
    if idx_version is None:
        return None
    return {
        "idx_bytes": idx_version[0],
        "idx_hash": idx_version[1],
        "bin_bytes": bin_bytes,
        "bin_hash": bin_version,
    }
