"""``IndexedDataset``: the sequences of a ``.bin``/``.idx`` corpus, by index.

Names, arguments and return values follow megatron-core's ``IndexedDataset`` so that changing
the import is the whole migration. The differences are deliberate: the ``.bin`` reader is a
plugin chosen by name, bad files raise errors that say what is wrong and where, reads are
bounds-checked against the sequence they come from, and arrays handed out stay valid after
the dataset is dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy

from megafmt.checked import corpus_identity, one_checker, remember_checked, was_checked
from megafmt.errors import FormatError
from megafmt.fingerprint import (
    CHANGE_TIME,
    corpus_stat,
    described_files,
    inode_of,
    sizes_and_inodes,
)
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index
from megafmt.object_storage import is_msc_url
from megafmt.protocols import Read, conforms
from megafmt.readers import (
    BinReader,
    DescriptorReporting,
    IndexCopyingBinReader,
    PrefetchingBinReader,
    ShrinkDetecting,
    VersionReporting,
    ViewableBinReader,
    default_reader_name,
    is_url,
    open_bin_reader,
)
from megafmt.readers.msc_reader import msc_exists
from megafmt.readers.pool import POOL
from megafmt.verification import check_consistency

#: how often, at most, a read from a memory-mapped ``.bin`` first checks that the file did not
#: shrink (one ``stat``, a few microseconds: checking before every ``get`` would double its cost)
SIZE_CHECK_SECONDS = 0.01
#: an index of at most this many sequences is checked at every open, without a note or the
#: machine's lock on one: its check (0.06-0.1 ms) costs less than creating the note (0.1-0.5 ms
#: of a file creation, thousands at a blend's first build) and no more than looking the note
#: up or taking the lock, so the ranks of a node that open it at once each check it
UNNOTED_CHECK_SEQUENCES = 4096


class IndexedDataset:
    """The sequences of the corpus at ``path_prefix`` (``<prefix>.idx`` and ``<prefix>.bin``).

    ``mmap`` chooses between the ``mmap`` and ``file`` readers as in megatron-core; ``reader``
    names any installed ``megafmt.readers`` plugin instead and ``reader_options`` are passed to
    it. A URL prefix selects the ``fsspec`` reader (``s3://...``) or the ``msc`` reader
    (``msc://...``, multi-storage-client); ``object_storage_config`` and ``s3_config`` are
    megatron-core's way of asking for object storage and are handed to that reader.
    ``fast_cache_load`` with ``sequences_per_dataset`` and ``dtype_code`` skips parsing the
    ``.idx`` header, trusting the counts given.

    A dataset pickles as its arguments and reopens its files when unpickled, so each DataLoader
    worker maps the files itself. A local ``path_prefix`` is made absolute when the dataset is
    opened (``path_prefix`` reads it so), so an unpickled copy reads the same corpus whatever its
    working directory.
    """

    def __init__(
        self,
        path_prefix: str,
        multimodal: bool = False,
        mmap: bool = True,
        object_storage_config: Any = None,
        s3_config: Any = None,
        fast_cache_load: bool = False,
        sequences_per_dataset: tuple[int, int] | None = None,
        dtype_code: int | None = None,
        *,
        reader: str | None = None,
        reader_options: dict[str, Any] | None = None,
    ) -> None:
        object_storage_config = object_storage_config or s3_config
        if reader is None:
            reader = (
                "fsspec"
                if object_storage_config is not None and not is_url(path_prefix)
                else default_reader_name(path_prefix, mmap)
            )
        options = dict(reader_options or {})
        if object_storage_config is not None:
            options.setdefault("object_storage_config", object_storage_config)
        self._arguments = {
            # absolute: a worker started by spawn or forkserver in another working directory
            # reopens the same corpus
            "path_prefix": path_prefix if is_url(path_prefix) else os.path.abspath(path_prefix),
            "multimodal": multimodal,
            "mmap": mmap,
            "fast_cache_load": fast_cache_load,
            "sequences_per_dataset": sequences_per_dataset,
            "dtype_code": dtype_code,
            "reader": reader,
            "reader_options": options,
        }
        self._open(**self._arguments)

    def _open(
        self,
        path_prefix: str,
        multimodal: bool,
        mmap: bool,
        fast_cache_load: bool,
        sequences_per_dataset: tuple[int, int] | None,
        dtype_code: int | None,
        reader: str,
        reader_options: dict[str, Any],
        checked: list[int] | None = None,
        opened: dict[str, list[int]] | None = None,
    ) -> None:
        """Open the files. The consistency check is skipped only for files that passed it
        already: those a pickled dataset's ``checked`` names (DataLoader workers do not scan
        the index again), or a large index :mod:`megafmt.checked` remembers. ``opened``: the
        files as the pickled dataset opened them; others at the path now (the corpus replaced
        since) are refused: its index tables were cut from those."""
        self.path_prefix = path_prefix
        self.multimodal = multimodal
        self.mmap = mmap
        self.fast_cache_load = fast_cache_load
        self.reader_name = reader
        self._reader_options = reader_options
        self._bin_reader: BinReader | None = None
        self._tokens: numpy.ndarray | None = None
        self.recently_read = False
        #: the corpus's files as opened (:func:`~megafmt.fingerprint.corpus_stat`, taken just
        #: before they are opened: a replacement after it makes a later fingerprint of the
        #: path differ, never agree; None for object storage, or files the open reports): what
        #: a cache of tables cut from them records, and what a later fingerprint must find
        self.opened_stat = None if is_url(path_prefix) else _stat_before_open(path_prefix)
        now = self.opened_stat
        if (
            opened is not None
            and now is not None
            and sizes_and_inodes(opened) != sizes_and_inodes(now)
        ):
            raise FormatError(
                f"{path_prefix}: the corpus's files changed since the dataset was opened (then "
                f"{described_files(opened)}, now {described_files(now)}): this copy "
                "of it (a DataLoader worker's) would read other data than its index tables were "
                "made from. Start again once the corpus is complete"
            )
        bin_reader = self._open_reader()
        counts = sequences_per_dataset if fast_cache_load else None
        self.index = Index(
            self._local_idx_path(bin_reader),
            multimodal,
            counts,
            dtype_code,
            name=get_idx_path(path_prefix),
        )
        #: the objects' versions as opened, for a remote corpus whose reader says (else None):
        #: what tables cut from it describe
        self.opened_versions = (
            bin_reader.opened_versions if conforms(bin_reader, VersionReporting) else None
        )
        self._dtype = self.index.dtype
        self._itemsize = self.index.dtype_size
        self._lengths = self.index.sequence_lengths
        self._pointers = self.index.sequence_pointers
        self._modes = self.index.sequence_modes
        taken = time.time_ns()
        self._checked = corpus_identity(self.index.path, bin_reader.nbytes)
        if self._checked != checked:
            self._check_unless_noted(bin_reader, taken)
        self._attach(bin_reader)

    def _check_unless_noted(self, bin_reader: BinReader, taken: int) -> None:
        """The consistency check: a small index's every time, a larger one's unless its note
        says it passed (``taken``: when the identity was taken)."""
        if self.index.sequence_count <= UNNOTED_CHECK_SEQUENCES:
            check_consistency(self.index, bin_reader.path, bin_reader.nbytes)
        elif not was_checked(self.index.path, self._checked):
            with one_checker(self.index.path):  # the ranks of a node: one reads, one notes
                if not was_checked(self.index.path, self._checked):
                    self._check(bin_reader, taken)

    def _check(self, bin_reader: BinReader, taken: int) -> None:
        """The consistency check, then its note."""
        check_consistency(self.index, bin_reader.path, bin_reader.nbytes)
        changed = self._checked[CHANGE_TIME]  # the .idx's (its identity leads)
        remember_checked(self.index.path, self._checked, changed, taken)

    def _open_reader(self) -> BinReader:
        return open_bin_reader(
            self.reader_name, get_bin_path(self.path_prefix), **self._reader_options
        )

    def _reopen_reader(self) -> BinReader:
        """The ``.bin`` reader again, after the pool released it: its size must still be the one
        the index implies."""
        reader = self._open_reader()
        if reader.nbytes != self.index.bin_nbytes:
            reader.close()
            raise FormatError(
                f"{reader.path}: reopened with {reader.nbytes} bytes, but {self.index.name} "
                f"implies {self.index.bin_nbytes}: the .bin changed since the corpus was opened"
            )
        if self.opened_stat is not None:
            inode = inode_of(reader.path)
            if inode != self.opened_stat["bin"][2]:
                reader.close()
                raise FormatError(
                    f"{reader.path}: reopened as inode {inode}, but it was opened as inode "
                    f"{self.opened_stat['bin'][2]}: the .bin was replaced since the corpus was "
                    "opened, and its index (read then) does not describe it"
                )
        return self._attach(reader)

    def _attach(self, reader: BinReader) -> BinReader:
        """Use ``reader`` (and its whole-file view, if it has one); a reader that holds a file
        descriptor is registered in the pool that bounds how many stay open."""
        self._tokens = reader.view(self._dtype) if conforms(reader, ViewableBinReader) else None
        self._size_check = reader.check_size if conforms(reader, ShrinkDetecting) else None
        self._next_size_check = 0.0
        self._bin_reader = reader
        if not conforms(reader, DescriptorReporting) or reader.holds_descriptor:
            POOL.opened(self)
        return reader

    @property
    def bin_reader(self) -> BinReader:
        """The ``.bin`` reader, reopened if the process-wide pool released it."""
        reader = self._bin_reader
        return reader if reader is not None else self._reopen_reader()

    @property
    def tokens_view(self) -> numpy.ndarray | None:
        """The whole ``.bin`` as one read-only array of tokens when the reader maps the file
        (the mmap reader), else None: for callers that gather many spans at once, as
        megaindex's samples do. Counts as a read for the pool of open readers."""
        self.recently_read = True
        if self._bin_reader is None:
            self._reopen_reader()
        self._check_mapped_size()
        return self._tokens

    def _check_mapped_size(self) -> None:
        """Before reading from a mapped ``.bin``: whether it shrank since it was opened (a
        :class:`~megafmt.errors.FormatError` instead of a SIGBUS), asked at most every
        ``SIZE_CHECK_SECONDS``. A view handed out earlier and touched after the file shrank
        still crashes: corpora must be replaced by renaming, never rewritten in place."""
        now = time.monotonic()
        if now >= self._next_size_check and self._size_check is not None:
            self._next_size_check = now + SIZE_CHECK_SECONDS
            try:
                self._size_check()
            except FormatError:
                self._next_size_check = 0.0  # every later read asks again, and fails
                raise

    def release_reader(self) -> None:
        """Drop the ``.bin`` reader (the pool calls this); the next read reopens it."""
        self._tokens = None
        self._bin_reader = None

    def _local_idx_path(self, bin_reader: BinReader) -> str:
        """Where the ``.idx`` is on this machine; a remote reader may keep a local copy."""
        if conforms(bin_reader, IndexCopyingBinReader):
            return bin_reader.local_idx_path
        return get_idx_path(self.path_prefix)

    def __getstate__(self) -> dict[str, Any]:
        return {**self._arguments, "checked": self._checked, "opened": self.opened_stat}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        checked = state.pop("checked", None)
        opened = state.pop("opened", None)
        self._arguments = state
        self._open(**self._arguments, checked=checked, opened=opened)

    def __len__(self) -> int:
        return self.index.sequence_count

    def _sequence(self, idx: Any) -> int:
        """``idx`` as a non-negative sequence number, Python-style negative indices allowed."""
        count = self.index.sequence_count
        position = int(idx)
        if position < 0:
            position += count
        if not 0 <= position < count:
            raise IndexError(
                f"sequence index {idx} out of range for {count} sequences in {self.index.name}"
            )
        return position

    def __getitem__(self, idx: int | numpy.integer | slice) -> Any:
        """The tokens of one sequence, or a list of them for a contiguous slice.

        Multimodal datasets return ``(tokens, mode)`` and ``(list_of_tokens, modes)``.
        """
        if isinstance(idx, (int, numpy.integer)):
            return self.get(idx)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError(
                    f"slices of an IndexedDataset must be contiguous (step 1), got step {step}"
                )
            stop = max(start, stop)
            lengths = self._lengths[start:stop]
            if stop == start:
                sequences: list[numpy.ndarray] = []
            else:
                tokens = self._read(int(self._pointers[start]), int(lengths.sum(dtype=numpy.int64)))
                sequences = numpy.split(tokens, numpy.cumsum(lengths[:-1], dtype=numpy.int64))
            if self._modes is not None:
                return sequences, self._modes[start:stop]
            return sequences
        raise TypeError(
            f"IndexedDataset indices must be integers or contiguous slices, got "
            f"{type(idx).__name__}"
        )

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> Any:
        """Tokens ``offset`` to ``offset + length`` of sequence ``idx`` (to its end by default).

        Multimodal datasets return ``(tokens, mode)``.
        """
        position = self._sequence(idx)
        tokens = self._read(*self._span(position, offset, length))
        if self._modes is not None:
            return tokens, self._modes[position]
        return tokens

    @property
    def prefetches(self) -> bool:
        """Whether ``prefetch`` does anything: the reader fetches ahead (object storage)."""
        return conforms(self.bin_reader, PrefetchingBinReader)

    def prefetch(self, reads: Iterable[Read]) -> None:
        """Announce the ``get(idx, offset, length)`` calls coming next: a reader of remote
        storage starts fetching their bytes now, concurrently; local readers ignore it."""
        reader = self.bin_reader
        if not conforms(reader, PrefetchingBinReader):
            return
        ranges = []
        for idx, offset, length in reads:
            start, count = self._span(self._sequence(idx), offset, length)
            ranges.append((start, count * self._itemsize))
        reader.prefetch(ranges)

    def _span(self, position: int, offset: int, length: int | None) -> tuple[int, int]:
        """The byte where tokens ``offset`` to ``offset + length`` of sequence ``position``
        start, and their count; refuses a range outside the sequence."""
        size = int(self._lengths[position])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"tokens [{offset}, {offset + length}) are outside sequence {position} "
                f"of {self.index.name}, which has {size} tokens"
            )
        return int(self._pointers[position]) + offset * self._itemsize, length

    def _read(self, start: int, length: int) -> numpy.ndarray:
        """``length`` tokens at byte ``start`` of the .bin: a slice of the whole-file view when
        the reader offers one and the range lies in it, else a read (which refuses a range
        outside the file; a negative start from a corrupt pointer must not index from the end)."""
        self.recently_read = True
        tokens = self._tokens
        if tokens is not None and start >= 0 and start % self._itemsize == 0:
            if time.monotonic() >= self._next_size_check:
                self._check_mapped_size()
            first = start // self._itemsize
            if first + length <= len(tokens):
                return tokens[first : first + length]
        return self.bin_reader.read(self._dtype, length, start)

    def read_spans(
        self,
        sequences: Sequence[int],
        offsets: Sequence[int],
        lengths: Sequence[int | None],
        out: numpy.ndarray,
    ) -> int:
        """Copy tokens ``offsets[i]`` to ``offsets[i] + lengths[i]`` of each sequence (to its end
        when the length is None) back to back into ``out``; returns how many were written.

        One call instead of a ``get`` per sequence: the way GPTDataset assembles a sample from
        the documents it spans. Each span is checked like ``get`` checks it.
        """
        position = 0
        for sequence, offset, length in zip(sequences, offsets, lengths, strict=True):
            start, count = self._span(self._sequence(sequence), offset, length)
            if position + count > len(out):
                raise ValueError(
                    f"{self.index.name}: read_spans needs room for at least "
                    f"{position + count} tokens (at sequence {sequence}), `out` holds {len(out)}"
                )
            out[position : position + count] = self._read(start, count)
            position += count
        return position

    @property
    def sequence_lengths(self) -> numpy.ndarray:
        """Tokens in each sequence (int32, a read-only view of the ``.idx``)."""
        return self.index.sequence_lengths

    @property
    def sequence_pointers(self) -> numpy.ndarray:
        """Byte offset of each sequence in the ``.bin`` (int64, read-only view)."""
        return self.index.sequence_pointers

    @property
    def document_indices(self) -> numpy.ndarray:
        """0, then the sequence index that ends each document (int64)."""
        return self.index.document_indices

    def get_document_indices(self) -> numpy.ndarray:
        """The document indices (megatron-core's older accessor)."""
        return self.index.document_indices

    def set_document_indices(self, document_indices: numpy.ndarray) -> None:
        """Replace the document indices in memory (the files are not touched)."""
        self.index.document_indices = document_indices

    @property
    def sequence_modes(self) -> numpy.ndarray | None:
        """The mode of each sequence (int8) for multimodal datasets, else None."""
        return self.index.sequence_modes

    @staticmethod
    def exists(path_prefix: str) -> bool:
        """Whether both files of the corpus at ``path_prefix`` exist (local path or URL)."""
        idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
        if is_msc_url(path_prefix):
            return msc_exists(idx_path) and msc_exists(bin_path)
        if is_url(path_prefix):
            import fsspec

            filesystem, _ = fsspec.core.url_to_fs(path_prefix)
            return bool(filesystem.exists(idx_path) and filesystem.exists(bin_path))
        return os.path.isfile(idx_path) and os.path.isfile(bin_path)

    def __repr__(self) -> str:
        return (
            f"IndexedDataset({self.path_prefix!r}, sequences={len(self)}, "
            f"documents={self.index.document_count - 1}, dtype={self.index.dtype.__name__}, "
            f"reader={self.reader_name!r})"
        )


def _stat_before_open(path_prefix: str) -> dict[str, list[int]] | None:
    """:func:`~megafmt.fingerprint.corpus_stat` of a local pair about to be opened; None where a
    file cannot be stat'ed (the open then says what is wrong with it)."""
    try:
        return corpus_stat(path_prefix)
    except OSError:
        return None
