"""Storage readers for ``.bin`` files, chosen by name from the ``megafmt.readers`` plugins.

Shipped: ``mmap`` (the default for local files), ``file`` (positional reads with retries),
``fsspec`` (object storage, any fsspec URL) and ``msc`` (``msc://`` URLs, multi-storage-client).
"""

from __future__ import annotations

from typing import Any

from megafmt.errors import PluginError
from megafmt.protocols import conforms
from megafmt.readers.base import (
    BinReader,
    BinReaderFactory,
    DescriptorReporting,
    IndexCopyingBinReader,
    PrefetchingBinReader,
    ShrinkDetecting,
    VersionReporting,
    ViewableBinReader,
)
from megafmt.registry import Registry

READERS: Registry[BinReaderFactory] = Registry(
    "megafmt.readers", "megafmt reader", required=("__call__",), home="megafmt"
)


def is_url(path: str) -> bool:
    """Whether ``path`` names a location by URL (``s3://...``) rather than a local path."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isidentifier()


def default_reader_name(path: str, mmap: bool = True) -> str:
    """The reader megatron-core would use: ``msc`` for ``msc://`` URLs, ``fsspec`` for other
    URLs, else ``mmap`` or ``file``."""
    if path.startswith("msc://"):
        return "msc"
    if is_url(path):
        return "fsspec"
    return "mmap" if mmap else "file"


def open_bin_reader(name: str, path: str, **options: Any) -> BinReader:
    """Open ``path`` with the reader registered as ``name``; what it makes must be a
    :class:`BinReader`."""
    reader = READERS.get(name)(path, **options)
    if not conforms(reader, BinReader):
        raise PluginError(
            f"megafmt reader {name!r} made {type(reader).__name__}, which is not a BinReader "
            "(it needs path, nbytes, read and close)"
        )
    return reader


__all__ = [
    "READERS",
    "BinReader",
    "BinReaderFactory",
    "DescriptorReporting",
    "IndexCopyingBinReader",
    "PrefetchingBinReader",
    "ShrinkDetecting",
    "VersionReporting",
    "ViewableBinReader",
    "default_reader_name",
    "is_url",
    "open_bin_reader",
]
