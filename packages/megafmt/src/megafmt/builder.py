"""``IndexedDatasetBuilder``: write a ``.bin``/``.idx`` corpus, byte-identical to megatron-core's.

Names and arguments follow megatron-core's builder. What differs is deliberate:

* Tokens go to a ``*.partial`` file; ``finalize`` writes the index the same way and renames
  both into place, the ``.idx`` last. An interrupted build leaves only ``*.partial`` files,
  never a ``.bin``/``.idx`` pair that looks complete.
* Items may be numpy arrays, Python sequences or torch tensors (torch is not imported).
  A value that does not fit the dtype is an error, never a silent wrap-around; what numpy
  converts exactly (whole floats, digit strings) is taken. Each form has its own fast path
  (:mod:`megafmt.conversion`), so a call costs less than megatron-core's whatever it is given.
* Lengths and document boundaries live in compact arrays and the index is written with a
  handful of vectorised writes, so building is bounded by the disk, not by Python.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from typing import Any

import numpy

from megafmt.atomic import open_exclusive, partial_path, remove_quietly
from megafmt.conversion import TokenEncoder, as_bounded_ints, as_token_array
from megafmt.dtypes import DType
from megafmt.errors import FormatError, MissingFileError, OutputBlockedError, TokenValueError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index, IndexWriter
from megafmt.prefix_hints import missing_file_message
from megafmt.verification import check_consistency

INT32_MAX = 2**31 - 1
# Tokens are copied into this buffer and from it into the page cache; at 1 MiB the buffer stays
# in the CPU cache between the two copies (measured: 8 MiB made a 800 MB build ~1.8x slower).
WRITE_BUFFER_BYTES = 1 << 20
COPY_CHUNK_BYTES = 64 << 20


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
        self.data_file = open_exclusive(self._partial_bin, buffering=WRITE_BUFFER_BYTES)
        self._lengths = array("i")
        self._document_indices = array("q", [0])
        self._modes: array | None = array("b") if multimodal else None
        self._done = False
        #: the partial index and its place once prepared, until committed or aborted
        self._prepared: tuple[str, str] | None = None
        # token ids of any form as a buffer of the dtype; once the builder is finished, a
        # function that refuses them
        self._encode: Callable[[Any], tuple[Any, int]] = TokenEncoder(self._dtype).encode
        # add_document writes an array of this dtype as it is, without a call; None turns that
        # path off once the builder is finished
        self._fast_dtype: numpy.dtype | None = self._dtype

    def _located(self, error: TokenValueError) -> TokenValueError:
        return TokenValueError(f"{self.bin_path}, sequence {len(self._lengths)}: {error}")

    def _check_open(self) -> None:
        if self._done:
            self._refuse_finished()

    def _refuse_finished(self, value: Any = None) -> tuple[Any, int]:
        """What ``_encode`` becomes once the builder is finalized or aborted."""
        raise ValueError(f"{self.bin_path}: the builder was already finalized or aborted")

    def _finish(self) -> None:
        """Refuse every later call; the caller closes the files."""
        self._done = True
        self._fast_dtype = None
        self._encode = self._refuse_finished

    def add_item(self, tensor: Any, mode: int = 0) -> None:
        """Append one sequence (any array-like of token ids) to the current document."""
        try:
            tokens, count = self._encode(tensor)
            if count > INT32_MAX:
                raise TokenValueError(f"{count} tokens, but a sequence holds at most {INT32_MAX}")
            if self._modes is not None:
                as_bounded_ints([mode], "modes", -128, 127)
        except TokenValueError as error:
            raise self._located(error) from None
        self.data_file.write(tokens)
        self._lengths.append(count)
        if self._modes is not None:
            self._modes.append(mode)

    def add_document(self, tensor: Any, lengths: Any, modes: Any = None) -> None:
        """Append a whole document: ``tensor`` holds its sequences back to back.

        ``lengths`` gives the size of each sequence and must add up to the tokens given.
        ``modes`` (multimodal only) defaults to 0 for every sequence.
        """
        if type(tensor) is numpy.ndarray and tensor.dtype is self._fast_dtype:
            tokens, count = tensor, tensor.size  # written as it is, without a call
        else:
            try:
                tokens, count = self._encode(tensor)
            except TokenValueError as error:
                raise self._located(error) from None
        if (  # the common case, kept cheap: one sequence, not multimodal
            type(lengths) is list
            and len(lengths) == 1
            and type(lengths[0]) is int
            and lengths[0] == count <= INT32_MAX
            and self._modes is None
        ):
            counts = None
        else:
            counts, mode_values = self._layout(lengths, modes, count)
        try:
            self.data_file.write(tokens)
        except ValueError:  # a strided array of the dtype: numpy lends only contiguous memory
            self.data_file.write(numpy.ascontiguousarray(tokens))
        if counts is None:
            self._lengths.append(count)
        else:
            self._lengths.extend(counts)
            if self._modes is not None:
                self._modes.extend(mode_values)
        self._document_indices.append(len(self._lengths))

    def _layout(self, lengths: Any, modes: Any, count: int) -> tuple[list[int], list[int]]:
        """The checked sequence lengths and modes of a document of ``count`` tokens."""
        try:
            counts = as_bounded_ints(lengths, "sequence lengths", 0, INT32_MAX)
            total = sum(counts)
            if total != count:
                raise TokenValueError(
                    f"the lengths add up to {total} tokens, but the document has {count}"
                )
            if self._modes is None or modes is None:
                return counts, [0] * len(counts)
            mode_values = as_bounded_ints(modes, "modes", -128, 127)
            if len(mode_values) != len(counts):
                raise TokenValueError(f"{len(mode_values)} modes for {len(counts)} sequences")
            return counts, mode_values
        except TokenValueError as error:
            raise self._located(error) from None

    def add_documents(
        self, tokens: Any, sequence_lengths: Any, sequences_per_document: Any
    ) -> None:
        """Append many documents at once: ``tokens`` back to back, the length of each sequence,
        and how many sequences each document holds (0 makes an empty document, as
        ``add_document([], [])`` does). The bulk form of ``add_document``, for writers that
        produce thousands of documents per call."""
        self._check_open()
        try:
            values = as_token_array(tokens, self._dtype)
            lengths = numpy.asarray(sequence_lengths, dtype=numpy.int64).reshape(-1)
            counts = numpy.asarray(sequences_per_document, dtype=numpy.int64).reshape(-1)
            if (lengths.size and not 0 <= lengths.min() <= lengths.max() <= INT32_MAX) or (
                counts.size and counts.min() < 0
            ):
                raise TokenValueError("sequence lengths and counts must not be negative")
            if int(lengths.sum()) != values.size:
                raise TokenValueError(
                    f"the lengths add up to {int(lengths.sum())} tokens, but {values.size} "
                    "were given"
                )
            if int(counts.sum()) != lengths.size:
                raise TokenValueError(
                    f"the documents hold {int(counts.sum())} sequences, but {lengths.size} "
                    "lengths were given"
                )
        except TokenValueError as error:
            raise self._located(error) from None
        if self._modes is not None:
            self._modes.frombytes(bytes(lengths.size))
        self.data_file.write(values)
        ends = len(self._lengths) + numpy.cumsum(counts, dtype=numpy.int64)
        self._lengths.frombytes(lengths.astype(numpy.int32).tobytes())
        self._document_indices.frombytes(ends.tobytes())

    def end_document(self) -> None:
        """Close the current document (after its sequences were added with ``add_item``)."""
        if self._done:  # not _check_open(): a call costs as much as the rest
            self._refuse_finished()
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
        if not os.path.isfile(bin_path):  # missing, or a directory in its place
            raise MissingFileError(f"{bin_path}: {missing_file_message(bin_path, 'token file')}")
        bin_size = os.path.getsize(bin_path)
        # the index whole, as an open checks it: a damaged one would be copied into the merge
        # (its pointers rebuilt from its lengths, its document indices as they are)
        check_consistency(index, bin_path, bin_size)
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
        """Write the index to ``idx_path`` and move both files into place, the ``.idx`` last;
        where that fails, nothing is left beside them."""
        self.prepare(idx_path)
        try:
            self.commit()
        except BaseException:
            self.abort()
            raise

    def prepare(self, idx_path: str) -> None:
        """Write the index beside ``idx_path``: both files complete, not yet in place
        (:meth:`commit` moves them; :meth:`abort` deletes them). A writer of several corpora
        prepares all before moving any, so that one that fails (a full disk) replaces none."""
        self._check_open()
        self._finish()
        partial_idx = partial_path(idx_path)
        try:
            self.data_file.close()  # flushes: a full disk may fail it
            with open_exclusive(partial_idx) as stream:
                IndexWriter(self._dtype).write(
                    stream,
                    numpy.frombuffer(self._lengths, dtype=numpy.int32),
                    numpy.frombuffer(self._document_indices, dtype=numpy.int64),
                    None if self._modes is None else numpy.frombuffer(self._modes, numpy.int8),
                )
        except BaseException:
            remove_quietly(partial_idx)
            remove_quietly(self._partial_bin)
            raise
        self._prepared = (partial_idx, idx_path)

    def check_targets(self) -> None:
        """Refuse, before :meth:`commit` moves anything, a place of the prepared files that
        holds something they cannot replace (a directory)."""
        if self._prepared is None:
            raise ValueError(f"{self.bin_path}: prepare() the corpus before its commit")
        for path, what in ((self.bin_path, "token file"), (self._prepared[1], "index file")):
            if os.path.isdir(path):
                raise OutputBlockedError(
                    f"{path}: found a directory where the {what} is to be written; move it "
                    "away or choose another output prefix"
                )

    def commit(self) -> None:
        """Move the prepared files into place, the ``.idx`` last. A place that holds something
        they cannot replace is refused first (:meth:`check_targets`), the files kept for
        :meth:`abort`; a move that fails deletes them."""
        self.check_targets()
        partial_idx, idx_path = self._prepared
        self._prepared = None
        try:
            # an old .idx must not sit beside the new .bin, even for an instant
            remove_quietly(idx_path)
            os.replace(self._partial_bin, self.bin_path)
            os.replace(partial_idx, idx_path)
        except BaseException:
            remove_quietly(partial_idx)
            remove_quietly(self._partial_bin)
            raise

    def abort(self) -> None:
        """Stop building and delete what was written, prepared files too; nothing appears at
        ``bin_path`` (a committed corpus stays)."""
        if self._prepared is not None:
            remove_quietly(self._prepared[0])
            remove_quietly(self._partial_bin)
            self._prepared = None
        if not self._done:
            self._finish()
            try:
                self.data_file.close()  # flushes what is buffered, which a full disk refuses
            except OSError:
                pass  # the file is closed all the same, and deleted next
            finally:
                remove_quietly(self._partial_bin)
