"""Structural verification of a corpus: every invariant the format promises, checked.

Checks run in order and stop at the first violation unless all are asked for: the files
exist, the header is valid, the ``.idx`` size matches its counts, sequence modes are present
exactly when the corpus is multimodal, the document indices start at 0, never decrease and end
at the sequence count, lengths are non-negative, pointers are the prefix sums of the lengths,
and the ``.bin`` is exactly as long as the index implies and can be read to its end (a
disk's read error or an object that refuses reads is named with the byte offset where
reading failed). Arrays and the ``.bin`` are read in chunks, so a corpus of any size
verifies in bounded memory; a local ``.bin`` is read with read-ahead and its pages dropped
behind the read (:mod:`megafmt.page_cache`), so a pass over a large corpus leaves the page
cache to other work. With ``progress``, a line follows the index scan (sequences) and the
``.bin`` read (bytes), and one summary line ends the check.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy

from megafmt.dtypes import DType
from megafmt.errors import FormatError, MissingFileError
from megafmt.format import (
    HEADER_SIZE,
    LENGTH_DTYPE,
    POINTER_DTYPE,
    Header,
    Layout,
    get_bin_path,
    get_idx_path,
    implied_token_count,
)
from megafmt.index import Index
from megafmt.mapping import release_pages
from megafmt.page_cache import SequentialPass
from megafmt.prefix_hints import missing_file_message
from megafmt.progress import Progress, format_count
from megafmt.remote import file_size, filesystem, local_index_path, read_range

CHUNK = 1 << 16  # elements per step: the temporaries stay in the CPU's cache
#: the sequences of an index checked whole, without the chunked walk's release of the pages it
#: read (a larger one's pages stayed in the process's memory: 17 MiB more in the 2,400-corpus
#: blend's cold build, whose corpora of up to 10,000 sequences are checked at their first open)
SMALL_INDEX_SEQUENCES = 4096
BIN_CHUNK = 8 << 20  # bytes of the .bin read per step: one buffer, reused
#: off a terminal, a progress line each time this many more bytes of the .bin are read
BIN_PROGRESS_EVERY = 1 << 30


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, in which file, and what was expected and found."""

    check: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def verify(
    path_prefix: str,
    multimodal: bool | None = None,
    *,
    stop_at_first: bool = True,
    progress: bool = False,
    sizes_only: bool = False,
) -> list[Violation]:
    """The violations found in the corpus at ``path_prefix`` (empty when it is well formed).

    ``multimodal`` True requires the modes section, False forbids it, None accepts either.
    ``sizes_only`` checks the header and file sizes alone, without fetching the whole ``.idx``.
    """
    found = []
    for violation in iter_violations(path_prefix, multimodal, progress, sizes_only):
        found.append(violation)
        if stop_at_first:
            break
    return found


def iter_violations(
    path_prefix: str,
    multimodal: bool | None = None,
    progress: bool = False,
    sizes_only: bool = False,
) -> Iterator[Violation]:
    """Every violation, in check order; stops early when a file cannot be read at all.

    ``sizes_only`` checks the header and the two file sizes alone, reading 46 bytes of the
    ``.idx`` in place (nothing is downloaded or cached): a quick check of a remote corpus.
    """
    idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
    sizes = {path: file_size(path) for path in (idx_path, bin_path)}
    for path, what in ((idx_path, "index file"), (bin_path, "token file")):
        if sizes[path] is None:
            yield Violation("exists", path, missing_file_message(path, what))
    if None in sizes.values():
        return
    if sizes_only:
        yield from _size_violations(
            idx_path, sizes[idx_path], bin_path, sizes[bin_path], multimodal
        )
        return
    try:
        # a remote corpus: its .idx is fetched (and cached); the .bin is streamed at the end
        index = Index(local_index_path(path_prefix), multimodal=bool(multimodal), name=idx_path)
    except (FormatError, MissingFileError) as error:
        yield Violation("header", idx_path, str(error).removeprefix(f"{idx_path}: "))
        return
    yield from _modes_violations(idx_path, index.layout, multimodal)
    meter = (
        Progress(f"verify {path_prefix}", index.sequence_count, "sequences") if progress else None
    )
    yield from index_violations(index, bin_path, sizes[bin_path], meter)
    if meter is not None:
        meter.close("")
    reading = (
        Progress(f"verify {path_prefix}: .bin", sizes[bin_path], "B", every=BIN_PROGRESS_EVERY)
        if progress
        else None
    )
    completed = False
    try:
        yield from bin_read_violations(bin_path, sizes[bin_path], reading)
        completed = True
    finally:  # a caller that stops at the first violation closes this generator early
        if reading is not None:
            reading.close(_summary(path_prefix, index, reading) if completed else "")


def _summary(path_prefix: str, index: Index, reading: Progress) -> str:
    """The line that ends a check: what the corpus holds and how fast its ``.bin`` was read."""
    elapsed = reading.elapsed
    rate = reading.done / elapsed if elapsed > 0 else 0.0
    documents = max(len(index.document_indices) - 1, 0)
    return (
        f"checked {path_prefix}: {index.sequence_count:,} sequences, {documents:,} documents, "
        f"{index.num_tokens:,} tokens; {format_count(reading.done)}B of .bin read in "
        f"{elapsed:.1f} s ({format_count(rate)}B/s)"
    )


def bin_read_violations(
    bin_path: str, bin_size: int, meter: Progress | None = None
) -> Iterator[Violation]:
    """A violation when the ``.bin`` (local or a URL) cannot be read from its first to its
    last byte: the offset where reading failed and why, or where it ended early. Streamed
    through one buffer of :data:`BIN_CHUNK` bytes, one :class:`SequentialPass` (read-ahead,
    pages dropped behind the read); ``meter`` counts the bytes read."""
    buffer = bytearray(min(BIN_CHUNK, max(bin_size, 1)))
    offset = 0
    try:
        fs, inner = filesystem(bin_path)
        with fs.open(inner, "rb") as stream:
            cache = SequentialPass(stream)
            while offset < bin_size:
                view = memoryview(buffer)[: min(len(buffer), bin_size - offset)]
                got = stream.readinto(view)
                if not got:
                    yield Violation(
                        "bin_read",
                        bin_path,
                        f"reading ended at byte {offset}, expected {bin_size} bytes (the file "
                        "shrank while it was read)",
                    )
                    return
                offset += got
                cache.consumed(offset)
                if meter is not None:
                    meter.update(got)
            cache.consumed(offset, final=True)
    except OSError as error:
        yield Violation(
            "bin_read",
            bin_path,
            f"cannot be read at byte {offset} of {bin_size}: {type(error).__name__}: {error}",
        )


def index_violations(
    index: Index, bin_path: str, bin_size: int, meter: Progress | None = None
) -> Iterator[Violation]:
    """The violations of an open index's arrays and of the ``.bin`` size it implies: document
    indices, lengths, pointers (exactly the prefix sums of the lengths, so monotone, aligned
    and in range) and the size. Vectorised in chunks: a 20M-sequence index takes a fraction of
    a second once its pages are in memory."""
    yield from _document_violations(index)
    yield from _sequence_violations(index, meter)
    yield from _bin_size_violations(
        bin_path, bin_size, index.name, index.num_tokens, index.dtype_size
    )


def check_consistency(index: Index, bin_path: str, bin_size: int) -> None:
    """Raise :class:`FormatError` naming the file, field and offset of the first violation of
    :func:`index_violations`: the check every corpus gets when it is opened, so a damaged
    index or a ``.bin`` of the wrong size never yields wrong tokens."""
    if index.sequence_count <= SMALL_INDEX_SEQUENCES and _small_index_passes(index, bin_size):
        return
    for violation in index_violations(index, bin_path, bin_size):
        raise FormatError(
            f"{violation} (the corpus fails its consistency check at open; "
            f"`mega verify` lists every violation)"
        )


def _small_index_passes(index: Index, bin_size: int) -> bool:
    """Whether a small index (:data:`SMALL_INDEX_SEQUENCES`) has none of
    :func:`index_violations`, in a dozen array operations: a blend opens thousands of small
    corpora, and the chunked walk that finds and words the first violation cost three times
    more. False sends it to that walk."""
    documents, lengths = index.document_indices, index.sequence_lengths
    count = index.sequence_count
    if not len(documents) or documents[0] != 0 or documents[-1] != count:
        return False
    if (documents[1:] < documents[:-1]).any():
        return False
    if count:
        pointers = index.sequence_pointers
        if pointers[0] != 0 or lengths.min() < 0:
            return False
        sizes = numpy.multiply(lengths[:-1], index.dtype_size, dtype=numpy.int64)
        if not numpy.array_equal(pointers[1:] - pointers[:-1], sizes):
            return False
    return bin_size == index.num_tokens * index.dtype_size


def _size_violations(
    idx_path: str, idx_size: int, bin_path: str, bin_size: int, multimodal: bool | None
) -> Iterator[Violation]:
    """The header, the ``.idx`` size against its counts and the ``.bin`` size against the last
    sequence's pointer and length, read in place."""
    try:
        header = Header.unpack(read_range(idx_path, 0, min(HEADER_SIZE, idx_size)), idx_path)
        layout = Layout.for_file(header, idx_size, idx_path, bool(multimodal))
    except FormatError as error:
        yield Violation("header", idx_path, str(error).removeprefix(f"{idx_path}: "))
        return
    yield from _modes_violations(idx_path, layout, multimodal)
    itemsize = numpy.dtype(DType.dtype_from_code(header.dtype_code)).itemsize
    tokens = 0
    if header.sequence_count:
        last = header.sequence_count - 1
        length = read_range(idx_path, layout.lengths_offset + 4 * last, 4)
        pointer = read_range(idx_path, layout.pointers_offset + 8 * last, 8)
        tokens = implied_token_count(
            int(numpy.frombuffer(pointer, POINTER_DTYPE)[0]),
            int(numpy.frombuffer(length, LENGTH_DTYPE)[0]),
            itemsize,
        )
    yield from _bin_size_violations(bin_path, bin_size, idx_path, tokens, itemsize)


def _modes_violations(
    idx_path: str, layout: Layout, multimodal: bool | None
) -> Iterator[Violation]:
    if multimodal is False and layout.has_modes and layout.sequence_count > 0:
        yield Violation(
            "modes",
            idx_path,
            f"the file ends with a sequence_modes section ({layout.sequence_count} bytes at "
            f"offset {layout.modes_offset}), but the corpus is declared not multimodal",
        )


def _bin_size_violations(
    bin_path: str, bin_size: int | None, idx_path: str, tokens: int, itemsize: int
) -> Iterator[Violation]:
    if bin_size != tokens * itemsize:
        yield Violation(
            "bin_size",
            bin_path,
            f"expected {tokens * itemsize} bytes ({tokens} tokens of {itemsize} bytes, as "
            f"{idx_path} implies), found {bin_size}",
        )


def _document_violations(index: Index) -> Iterator[Violation]:
    documents = index.document_indices
    base = index.layout.document_indices_offset

    def at(i: int) -> str:
        return f"document_indices[{i}] (byte {base + 8 * i})"

    if len(documents) == 0:
        yield Violation(
            "documents",
            index.name,
            "document_indices is empty; expected at least its first entry, 0 (the header's "
            "document count is 0, it must be 1 or more)",
        )
        return
    if documents[0] != 0:
        yield Violation("documents", index.name, f"{at(0)}: expected 0, found {documents[0]}")
    decreasing = False
    for start in range(0, len(documents), CHUNK):
        chunk = documents[start : start + CHUNK + 1]
        if (chunk[1:] < chunk[:-1]).any():
            decreasing = True
            i = start + int(numpy.flatnonzero(chunk[1:] < chunk[:-1])[0]) + 1
            yield Violation(
                "documents",
                index.name,
                f"{at(i)}: document indices must not decrease, found {documents[i]} after "
                f"{documents[i - 1]}",
            )
            break
        release_pages(chunk)  # read: not kept resident (a 146.5M-document index is 1.2 GB)
    # entries that never decrease from 0 to the sequence count all lie between the two
    if decreasing or documents[0] != 0 or documents[-1] != index.sequence_count:
        for start in range(0, len(documents), CHUNK):
            chunk = documents[start : start + CHUNK]
            outside = numpy.flatnonzero((chunk < 0) | (chunk > index.sequence_count))
            if len(outside):
                i = start + int(outside[0])
                yield Violation(
                    "documents",
                    index.name,
                    f"{at(i)}: expected a sequence index in 0..{index.sequence_count}, "
                    f"found {documents[i]}",
                )
                break
    if documents[-1] != index.sequence_count:
        yield Violation(
            "documents",
            index.name,
            f"{at(len(documents) - 1)}: the last entry must be the sequence count "
            f"{index.sequence_count}, found {documents[-1]}",
        )


def _sequence_violations(index: Index, meter: Progress | None) -> Iterator[Violation]:
    lengths, pointers = index.sequence_lengths, index.sequence_pointers
    layout = index.layout
    negative_reported = False
    expected_pointer = 0  # byte offset where the next sequence must start
    # no larger than the index: a blend's small corpora each allocated (and mapped) 1 MB
    buffered = min(CHUNK, index.sequence_count)
    size_buffer = numpy.empty(buffered, dtype=numpy.int64)  # bytes of each sequence of a chunk
    step_buffer = numpy.empty(buffered, dtype=numpy.int64)  # differences of successive pointers
    for start in range(0, index.sequence_count, CHUNK):
        chunk = lengths[start : start + CHUNK]
        if not negative_reported and chunk.min() < 0:
            negative_reported = True
            i = start + int(numpy.flatnonzero(chunk < 0)[0])
            yield Violation(
                "lengths",
                index.name,
                f"sequence_lengths[{i}] (byte {layout.lengths_offset + 4 * i}): expected a "
                f"length >= 0, found {lengths[i]}",
            )
        found = pointers[start : start + len(chunk)]
        sizes = size_buffer[: len(chunk)]
        numpy.multiply(chunk, index.dtype_size, dtype=numpy.int64, out=sizes)
        steps = step_buffer[: len(chunk) - 1]
        numpy.subtract(found[1:], found[:-1], out=steps)
        if found[0] != expected_pointer or not numpy.array_equal(steps, sizes[:-1]):
            expected = numpy.cumsum(sizes)
            expected -= sizes
            expected += expected_pointer
            i = start + int(numpy.flatnonzero(found != expected)[0])
            yield Violation(
                "pointers",
                index.name,
                f"sequence_pointers[{i}] (byte {layout.pointers_offset + 8 * i}): expected "
                f"{expected[i - start]} (the sum of the lengths before it times "
                f"{index.dtype_size}), found {pointers[i]}",
            )
            return
        expected_pointer = int(found[-1]) + int(sizes[-1])
        release_pages(chunk)  # read: not kept resident (a 146.5M-sequence index is 1.8 GB)
        release_pages(found)
        if meter is not None:
            meter.update(len(chunk))
