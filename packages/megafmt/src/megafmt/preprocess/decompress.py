"""Opening a compressed input of ``mega preprocess``, so that a damaged file is an error.

The compression is the file's suffix's (:data:`SUFFIXES`, whatever fsspec has registered: a
``.zst`` file without zstandard installed is an error, not bytes read raw). A zstd file is read
frame after frame by :class:`ZstdFrames`: zstandard's own stream reader (fsspec's) takes a file
cut short inside a frame for the end of the data, and a run would tokenize the first part of a
truncated download and succeed. gzip, bz2 and xz raise ``EOFError`` there themselves. A file
cut exactly where a frame (or gzip member) ends reads as a shorter valid file in every format.
What any of them raise on bytes that do not decompress is in :data:`DECOMPRESSION_ERRORS`, for
the reader to name the file and line.
"""

from __future__ import annotations

import io
import lzma
import zlib
from typing import Any, BinaryIO

from fsspec.compression import compr

from megafmt.errors import MegafmtError, PluginError

#: compressed bytes read from the file at a time
READ_BYTES = 1 << 20
#: decompressed bytes one call of the decompressor should give, about: a call returns all its
#: input decompresses to, which for very repetitive text is thousands of times its size, so the
#: compressed bytes given per call start small and follow what the calls give (a zstd byte can
#: stand for tens of KiB)
AIM_BYTES = 4 << 20
#: the least and most compressed bytes given per call
FEED_BYTES = (64, 64 << 10)
#: each compressed suffix and fsspec's name of its compression
SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma", ".zst": "zstd", ".zstd": "zstd"}


class CorruptCompressedDataError(MegafmtError, ValueError):
    """The bytes of a compressed input do not decompress (corrupt, or another format)."""


#: what reading a damaged compressed input raises: a truncated file (``EOFError``), bytes that
#: do not decompress (gzip's ``OSError`` and ``zlib.error``, xz's ``LZMAError``, zstd's
#: :class:`CorruptCompressedDataError`), and the system's read errors
DECOMPRESSION_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, CorruptCompressedDataError)


def compression_of(path: str) -> str | None:
    """The compression of ``path`` by its suffix (fsspec's name), None for none."""
    return next((name for suffix, name in SUFFIXES.items() if path.endswith(suffix)), None)


def decompressing(stream: BinaryIO, path: str) -> Any:
    """``stream`` (the raw bytes of ``path``) as its decompressed bytes."""
    compression = compression_of(path)
    if compression is None:
        return stream
    if compression == "zstd":
        try:
            return io.BufferedReader(ZstdFrames(stream))
        except ImportError:
            pass  # another zstd of fsspec's (Python 3.14's), which raises on a cut frame
    if compression not in compr:
        raise PluginError(
            f"{path}: reading {compression} input needs zstandard: pip install zstandard"
        )
    return compr[compression](stream, mode="rb")


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd stream, frame after frame (a file of concatenated
    frames, as ``cat a.zst b.zst`` makes, is all read). An ``EOFError`` where the stream ends
    inside a frame; a :class:`CorruptCompressedDataError` where its bytes do not decompress."""

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard

        self._zstandard = zstandard
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame: Any = None  # the frame being decompressed; None between frames
        self._ready = bytearray()  # decompressed, not read yet
        self._compressed = memoryview(b"")  # read from the file, not decompressed yet
        self._feed = 1 << 10  # compressed bytes given per call
        self._ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._ready and not self._ended:
            self._decompress_more()
        count = min(len(buffer), len(self._ready))
        buffer[:count] = self._ready[:count]
        del self._ready[:count]
        return count

    def _decompress_more(self) -> None:
        """Give the decompressor the next few compressed bytes (reading the file when none
        are left), across a frame's end into the next frame."""
        if not self._compressed:
            self._compressed = memoryview(self._raw.read(READ_BYTES))
            if not self._compressed:
                if self._frame is not None:
                    raise EOFError(
                        "the file ends inside a zstd frame: it was cut short (an interrupted "
                        "download or copy?)"
                    )
                self._ended = True
                return
        data, self._compressed = self._compressed[: self._feed], self._compressed[self._feed :]
        given = len(self._ready)
        while data:
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            try:
                self._ready += self._frame.decompress(data)
            except self._zstandard.ZstdError as error:
                raise CorruptCompressedDataError(f"not valid zstd data ({error})") from None
            if not self._frame.eof:
                break
            data = memoryview(self._frame.unused_data)
            self._frame = None
        given = len(self._ready) - given
        least, most = FEED_BYTES
        if given > AIM_BYTES:
            self._feed = max(least, self._feed // 2)
        elif given < AIM_BYTES // 4:
            self._feed = min(most, self._feed * 2)

    def close(self) -> None:
        self._raw.close()
        super().close()
