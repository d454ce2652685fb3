"""The Megatron ``.bin``/``.idx`` on-disk format, version 1: the byte-level spec.

A corpus is a pair of files sharing a path prefix, ``<prefix>.bin`` and ``<prefix>.idx``.

``<prefix>.bin`` holds the tokens of every sequence back to back, in the dtype that the index
names, with no header, separator or padding.

``<prefix>.idx`` is little-endian; with S sequences and D document-index entries::

    offset          size   type     field
    0               9      bytes    magic b"MMIDIDX\\x00\\x00"
    9               8      <Q       version, always 1
    17              1      <B       dtype code of the .bin tokens (table below)
    18              8      <Q       S, the sequence count
    26              8      <Q       D, the number of document_indices entries
    34              4*S    int32    sequence_lengths: tokens in each sequence
    34+4S           8*S    int64    sequence_pointers: byte offset of each sequence in the .bin,
                                    the exclusive prefix sum of length * itemsize, from 0
    34+12S          8*D    int64    document_indices: 0, then the sequence index that ends each
                                    document (so D - 1 documents, and the last entry is S)
    34+12S+8D       S      int8     sequence_modes: present only in multimodal files

Dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.

The ``.bin`` of a well-formed corpus is exactly ``sum(sequence_lengths) * itemsize`` bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from megafmt.dtypes import DType
from megafmt.errors import FormatError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")
HEADER_SIZE = HEADER.size  # 34

LENGTH_DTYPE = "<i4"
POINTER_DTYPE = "<i8"
DOCUMENT_INDEX_DTYPE = "<i8"
MODE_DTYPE = "i1"

IDX_SUFFIX = ".idx"
BIN_SUFFIX = ".bin"
#: the loss-mask sidecar of a pre-tokenized SFT corpus (``mega preprocess --sft``)
LOSS_MASK_SUFFIX = ".lossmask"


def get_idx_path(path_prefix: str) -> str:
    """The index file of a corpus prefix."""
    return path_prefix + IDX_SUFFIX


def get_bin_path(path_prefix: str) -> str:
    """The token file of a corpus prefix."""
    return path_prefix + BIN_SUFFIX


def get_loss_mask_path(path_prefix: str) -> str:
    """The loss-mask sidecar of the pre-tokenized SFT corpus at ``path_prefix``."""
    return path_prefix + LOSS_MASK_SUFFIX


def implied_token_count(last_pointer: int, last_length: int, itemsize: int) -> int:
    """Tokens in a corpus whose last sequence starts at byte ``last_pointer`` of the ``.bin``
    and holds ``last_length`` tokens of ``itemsize`` bytes (the ``.bin`` it implies, no scan)."""
    return (last_pointer + last_length * itemsize) // itemsize


@dataclass(frozen=True)
class Header:
    """The fixed 34 bytes at the start of every ``.idx`` file."""

    dtype_code: int
    sequence_count: int
    document_count: int

    def pack(self) -> bytes:
        """The header bytes, magic and version included."""
        return HEADER.pack(
            MAGIC, VERSION, self.dtype_code, self.sequence_count, self.document_count
        )

    @classmethod
    def unpack(cls, data: bytes, path: str) -> Header:
        """Parse and check a header read from ``path``."""
        if len(data) < HEADER_SIZE:
            what = "the file is empty" if not data else f"found only {len(data)} bytes"
            raise FormatError(f"{path}: truncated header: expected {HEADER_SIZE} bytes, {what}")
        magic, version, code, sequences, documents = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise FormatError(
                f"{path}: bad magic at offset 0: expected {MAGIC!r}, found {magic!r} "
                "(not a Megatron .idx file)"
            )
        if version != VERSION:
            raise FormatError(
                f"{path}: unsupported version at offset 9: expected {VERSION}, found {version}"
            )
        try:
            DType.dtype_from_code(code)
        except FormatError as error:
            raise FormatError(f"{path}: dtype code at offset 17: {error}") from None
        return cls(code, sequences, documents)


@dataclass(frozen=True)
class Layout:
    """Where each array of an ``.idx`` file starts, for given counts."""

    sequence_count: int
    document_count: int
    has_modes: bool

    @property
    def lengths_offset(self) -> int:
        return HEADER_SIZE

    @property
    def pointers_offset(self) -> int:
        return HEADER_SIZE + 4 * self.sequence_count

    @property
    def document_indices_offset(self) -> int:
        return HEADER_SIZE + 12 * self.sequence_count

    @property
    def modes_offset(self) -> int:
        return HEADER_SIZE + 12 * self.sequence_count + 8 * self.document_count

    @property
    def nbytes(self) -> int:
        """The exact size of an ``.idx`` file with this layout."""
        return self.modes_offset + (self.sequence_count if self.has_modes else 0)

    @classmethod
    def for_file(
        cls,
        header: Header,
        file_size: int,
        path: str,
        multimodal: bool | None,
        counts_from: str = "the header at offset 18",
    ) -> Layout:
        """The layout of an ``.idx`` file of ``file_size`` bytes, checked against its header.

        ``multimodal`` True requires the modes section, False and None accept a file with or
        without it (megatron-core ignores modes it was not asked for). ``counts_from`` says in
        messages where the counts came from.
        """
        plain = cls(header.sequence_count, header.document_count, has_modes=False)
        with_modes = cls(header.sequence_count, header.document_count, has_modes=True)
        counts = (
            f"{counts_from} says {header.sequence_count} sequences and "
            f"{header.document_count} document indices"
        )
        if file_size == plain.nbytes and (not multimodal or header.sequence_count == 0):
            return with_modes if multimodal else plain
        if file_size == with_modes.nbytes:
            return with_modes
        if multimodal and file_size == plain.nbytes:
            raise FormatError(
                f"{path}: multimodal=True but the file has no sequence_modes section: "
                f"expected {with_modes.nbytes} bytes ({counts}), found {file_size}"
            )
        if file_size < plain.nbytes:
            raise FormatError(
                f"{path}: file too short: {counts}, which needs {plain.nbytes} bytes, "
                f"but the file has {file_size}"
            )
        raise FormatError(
            f"{path}: unexpected file size: {counts}, which needs {plain.nbytes} bytes "
            f"({with_modes.nbytes} with sequence_modes), but the file has {file_size}"
        )
