"""``IndexedDatasetBuilder``: write a ``.bin``/``.idx`` corpus, byte-identical to megatron-core's.

Names and arguments follow megatron-core's builder. What differs is deliberate:

* Tokens go to a ``*.partial`` file; ``finalize`` writes the index the same way and renames
  both into place, the ``.idx`` last. An interrupted build leaves only ``*.partial`` files,
  never a ``.bin``/``.idx`` pair that looks complete.
* Items may be numpy arrays, Python sequences or torch tensors (torch is not imported).
  A value that does not fit the dtype is an error, never a silent wrap-around.
* Lengths and document boundaries live in compact arrays and the index is written with a
  handful of vectorised writes, so building is bounded by the disk, not by Python.
"""

from __future__ import annotations

import os
from array import array
from typing import Any

import numpy

from megafmt.atomic import partial_path, remove_quietly
from megafmt.dtypes import DType
from megafmt.errors import FormatError, MissingFileError, TokenValueError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index, IndexWriter

INT32_MAX = 2**31 - 1
WRITE_BUFFER_BYTES = 8 << 20
COPY_CHUNK_BYTES = 64 << 20


def as_token_array(value: Any, dtype: numpy.dtype, where: str) -> numpy.ndarray:
    """``value`` as a flat, contiguous array of ``dtype``, refusing values that do not fit."""
    if isinstance(value, numpy.ndarray):
        tokens = value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        tokens = value.detach().cpu().numpy()
    else:
        try:
            tokens = numpy.asarray(value)
        except (OverflowError, ValueError, TypeError) as error:
            raise TokenValueError(f"{where}: cannot convert to {dtype.name}: {error}") from None
    if tokens.dtype != dtype:
        tokens = _cast_checked(tokens, dtype, where)
    if tokens.ndim != 1 or not tokens.flags.c_contiguous:
        tokens = numpy.ascontiguousarray(tokens).reshape(-1)
    return tokens


def _cast_checked(tokens: numpy.ndarray, dtype: numpy.dtype, where: str) -> numpy.ndarray:
    if tokens.dtype.kind == "O":  # Python ints too large for int64, or mixed objects
        for position, value in enumerate(tokens.flat):
            if not isinstance(value, (int, float, numpy.number)) or isinstance(value, bool):
                raise TokenValueError(
                    f"{where}: value {value!r} at position {position} is not a "
                    f"number, expected {dtype.name} token ids"
                )
            if dtype.kind in "iu" and not numpy.iinfo(dtype).min <= value <= numpy.iinfo(dtype).max:
                raise TokenValueError(
                    f"{where}: value {value} at position {position} does not fit {dtype.name}"
                )
        tokens = tokens.astype(numpy.float64 if dtype.kind == "f" else numpy.int64)
    if tokens.dtype.kind not in "biuf":
        raise TokenValueError(f"{where}: expected numbers for {dtype.name}, got {tokens.dtype}")
    if tokens.size == 0 or numpy.can_cast(
        tokens.dtype, dtype, "same_kind" if dtype.kind == "f" else "safe"
    ):
        return tokens.astype(dtype)
    if tokens.dtype.kind == "f":  # into an integer dtype: only whole numbers
        whole = numpy.isfinite(tokens) & (tokens == numpy.trunc(tokens))
        if not whole.all():
            bad = int(numpy.argmin(whole))
            raise TokenValueError(
                f"{where}: value {tokens.flat[bad]} at position {bad} is not an integer, "
                f"expected {dtype.name} token ids"
            )
    info = numpy.iinfo(dtype)
    for extreme, position in ((tokens.min(), numpy.argmin), (tokens.max(), numpy.argmax)):
        if not info.min <= int(extreme) <= info.max:
            bad = int(position(tokens))
            raise TokenValueError(
                f"{where}: value {tokens.flat[bad]} at position {bad} does not fit "
                f"{dtype.name} (range {info.min}..{info.max})"
            )
    return tokens.astype(dtype)


def _as_ints(values: Any, what: str, low: int, high: int, where: str) -> numpy.ndarray:
    """``values`` as a flat integer array, refusing non-integers and values outside low..high."""
    ints = numpy.asarray(values).reshape(-1)
    if ints.size and (ints.dtype.kind not in "iub" or ints.min() < low or ints.max() > high):
        raise TokenValueError(f"{where}: {what} must be integers in {low}..{high}, got {values!r}")
    return ints


def _append_file(source: str, target: Any, nbytes: int) -> None:
    """Append the first ``nbytes`` of the file ``source`` to the open binary file ``target``.

    The kernel copies (``copy_file_range``) where it can; otherwise the bytes pass through
    user space in large chunks.
    """
    target.flush()
    copied = 0
    with open(source, "rb") as stream:
        try:
            while copied < nbytes:
                step = os.copy_file_range(stream.fileno(), target.fileno(), nbytes - copied)
                if step == 0:
                    break
                copied += step
        except (AttributeError, OSError):  # not on this platform, or not across these mounts
            stream.seek(copied)
            while copied < nbytes:
                chunk = stream.read(min(COPY_CHUNK_BYTES, nbytes - copied))
                if not chunk:
                    break
                target.write(chunk)
                copied += len(chunk)
    target.seek(0, os.SEEK_END)  # resynchronise the buffered writer with the descriptor
    if copied != nbytes:
        raise FormatError(f"{source}: expected {nbytes} bytes, the file ended after {copied}")


class IndexedDatasetBuilder:
    """Builds the corpus whose tokens go to ``bin_path``; ``finalize`` writes its ``.idx``."""

    def __init__(self, bin_path: str, dtype: Any = numpy.int32, multimodal: bool = False) -> None:
        DType.code_from_dtype(dtype)  # refuse dtypes the format has no code for, before writing
        self.bin_path = bin_path
        self.dtype = dtype
        self.multimodal = multimodal
        self._dtype = numpy.dtype(dtype)
        self._partial_bin = partial_path(bin_path)
        self.data_file = open(self._partial_bin, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115
        self._lengths = array("i")
        self._document_indices = array("q", [0])
        self._modes: array | None = array("b") if multimodal else None
        self._done = False

    def _where(self) -> str:
        return f"{self.bin_path}, sequence {len(self._lengths)}"

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(f"{self.bin_path}: the builder was already finalized or aborted")

    def add_item(self, tensor: Any, mode: int = 0) -> None:
        """Append one sequence (any array-like of token ids) to the current document."""
        self._check_open()
        tokens = as_token_array(tensor, self._dtype, self._where())
        if tokens.size > INT32_MAX:
            raise TokenValueError(f"{self._where()}: {tokens.size} tokens exceed int32 lengths")
        if self._modes is not None:
            _as_ints(mode, "modes", -128, 127, self._where())
        self.data_file.write(tokens)
        self._lengths.append(tokens.size)
        if self._modes is not None:
            self._modes.append(mode)

    def add_document(self, tensor: Any, lengths: Any, modes: Any = None) -> None:
        """Append a whole document: ``tensor`` holds its sequences back to back.

        ``lengths`` gives the size of each sequence and must add up to the tokens given.
        ``modes`` (multimodal only) defaults to 0 for every sequence.
        """
        self._check_open()
        where = self._where()
        tokens = as_token_array(tensor, self._dtype, where)
        counts = _as_ints(lengths, "sequence lengths", 0, INT32_MAX, where)
        total = int(counts.sum(dtype=numpy.int64))
        if total != tokens.size:
            raise TokenValueError(
                f"{where}: the lengths add up to {total} tokens, but the document has {tokens.size}"
            )
        if self._modes is not None:
            mode_values = (
                numpy.zeros(len(counts), dtype=numpy.int8)
                if modes is None
                else _as_ints(modes, "modes", -128, 127, where)
            )
            if len(mode_values) != len(counts):
                raise TokenValueError(
                    f"{where}: {len(mode_values)} modes for {len(counts)} sequences"
                )
        self.data_file.write(tokens)
        self._lengths.frombytes(counts.astype(numpy.int32).tobytes())
        self._document_indices.append(len(self._lengths))
        if self._modes is not None:
            self._modes.frombytes(mode_values.astype(numpy.int8).tobytes())

    def end_document(self) -> None:
        """Close the current document (after its sequences were added with ``add_item``)."""
        self._check_open()
        self._document_indices.append(len(self._lengths))

    def add_index(self, path_prefix: str) -> None:
        """Append a whole existing corpus: its documents, then its tokens (a merge)."""
        self._check_open()
        index = Index(get_idx_path(path_prefix), multimodal=self.multimodal)
        if numpy.dtype(index.dtype) != self._dtype:
            raise FormatError(
                f"{index.path}: dtype {numpy.dtype(index.dtype).name} (code {index.dtype_code}) "
                f"differs from the builder's {self._dtype.name}; merged corpora must share it"
            )
        bin_path = get_bin_path(path_prefix)
        try:
            bin_size = os.path.getsize(bin_path)
        except FileNotFoundError:
            raise MissingFileError(f"{bin_path}: token file not found") from None
        if bin_size != index.bin_nbytes:
            raise FormatError(
                f"{bin_path}: the .bin has {bin_size} bytes, but {index.path} implies "
                f"{index.bin_nbytes}"
            )
        offset = len(self._lengths)
        self._lengths.frombytes(index.sequence_lengths.tobytes())
        self._document_indices.frombytes((index.document_indices[1:] + offset).tobytes())
        if self._modes is not None and index.sequence_modes is not None:
            self._modes.frombytes(index.sequence_modes.tobytes())
        _append_file(bin_path, self.data_file, bin_size)

    @property
    def sequence_lengths(self) -> numpy.ndarray:
        """A copy of the lengths of the sequences added so far."""
        return numpy.array(self._lengths, dtype=numpy.int32)

    @property
    def document_indices(self) -> numpy.ndarray:
        """A copy of the document indices so far (0, then the end of each document)."""
        return numpy.array(self._document_indices, dtype=numpy.int64)

    @property
    def sequence_modes(self) -> numpy.ndarray | None:
        """A copy of the modes so far (multimodal builders), else None."""
        return None if self._modes is None else numpy.array(self._modes, dtype=numpy.int8)

    def finalize(self, idx_path: str) -> None:
        """Write the index to ``idx_path`` and move both files into place, the ``.idx`` last."""
        self._check_open()
        self._done = True
        self.data_file.close()
        partial_idx = partial_path(idx_path)
        try:
            with open(partial_idx, "wb") as stream:
                IndexWriter(self._dtype).write(
                    stream,
                    numpy.frombuffer(self._lengths, dtype=numpy.int32),
                    numpy.frombuffer(self._document_indices, dtype=numpy.int64),
                    None if self._modes is None else numpy.frombuffer(self._modes, numpy.int8),
                )
            # an old .idx must not sit beside the new .bin, even for an instant
            remove_quietly(idx_path)
            os.replace(self._partial_bin, self.bin_path)
            os.replace(partial_idx, idx_path)
        except BaseException:
            remove_quietly(partial_idx)
            remove_quietly(self._partial_bin)
            raise

    def abort(self) -> None:
        """Stop building and delete what was written; nothing appears at ``bin_path``."""
        if not self._done:
            self._done = True
            self.data_file.close()
            remove_quietly(self._partial_bin)
