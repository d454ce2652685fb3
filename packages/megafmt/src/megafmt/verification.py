"""Structural verification of a corpus: every invariant the format promises, checked.

Checks run in order and stop at the first violation unless all are asked for: the files
exist, the header is valid, the ``.idx`` size matches its counts, sequence modes are present
exactly when the corpus is multimodal, the document indices start at 0, never decrease and end
at the sequence count, lengths are non-negative, pointers are the prefix sums of the lengths,
and the ``.bin`` is exactly as long as the index implies. Arrays are checked in chunks, so a
corpus of any size verifies in bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy

from megafmt.errors import FormatError, MissingFileError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index
from megafmt.progress import Progress
from megafmt.remote import file_size, local_index_path

CHUNK = 1 << 22


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
) -> list[Violation]:
    """The violations found in the corpus at ``path_prefix`` (empty when it is well formed).

    ``multimodal`` True requires the modes section, False forbids it, None accepts either.
    """
    found = []
    for violation in iter_violations(path_prefix, multimodal, progress=progress):
        found.append(violation)
        if stop_at_first:
            break
    return found


def iter_violations(
    path_prefix: str, multimodal: bool | None = None, progress: bool = False
) -> Iterator[Violation]:
    """Every violation, in check order; stops early when a file cannot be read at all."""
    idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
    sizes = {path: file_size(path) for path in (idx_path, bin_path)}
    for path, what in ((idx_path, "index file"), (bin_path, "token file")):
        if sizes[path] is None:
            yield Violation("exists", path, f"{what} not found")
    if None in sizes.values():
        return
    try:
        # a remote corpus: its .idx is fetched (and cached); the .bin is checked by size only
        index = Index(local_index_path(path_prefix), multimodal=bool(multimodal))
    except (FormatError, MissingFileError) as error:
        yield Violation("header", idx_path, str(error).removeprefix(f"{idx_path}: "))
        return
    if multimodal is False and index.has_modes:
        yield Violation(
            "modes",
            idx_path,
            f"the file ends with a sequence_modes section ({index.sequence_count} bytes at offset "
            f"{index.layout.modes_offset}), but the corpus is declared not multimodal",
        )
    yield from _document_violations(index)
    meter = (
        Progress(f"verify {path_prefix}", index.sequence_count, "sequences") if progress else None
    )
    yield from _sequence_violations(index, meter)
    if meter is not None:
        meter.close("")
    bin_size = sizes[bin_path]
    if bin_size != index.bin_nbytes:
        yield Violation(
            "bin_size",
            bin_path,
            f"expected {index.bin_nbytes} bytes ({index.num_tokens} tokens of "
            f"{index.dtype_size} bytes, as {idx_path} implies), found {bin_size}",
        )


def _document_violations(index: Index) -> Iterator[Violation]:
    documents = index.document_indices
    base = index.layout.document_indices_offset

    def at(i: int) -> str:
        return f"document_indices[{i}] (byte {base + 8 * i})"

    if len(documents) == 0:
        yield Violation("documents", index.path, "document_indices is empty; expected at least 0")
        return
    if documents[0] != 0:
        yield Violation("documents", index.path, f"{at(0)}: expected 0, found {documents[0]}")
    for start in range(0, len(documents), CHUNK):
        chunk = documents[start : start + CHUNK + 1]
        steps = numpy.flatnonzero(chunk[1:] < chunk[:-1])
        if len(steps):
            i = start + int(steps[0]) + 1
            yield Violation(
                "documents",
                index.path,
                f"{at(i)}: document indices must not decrease, found {documents[i]} after "
                f"{documents[i - 1]}",
            )
            break
    for start in range(0, len(documents), CHUNK):
        chunk = documents[start : start + CHUNK]
        outside = numpy.flatnonzero((chunk < 0) | (chunk > index.sequence_count))
        if len(outside):
            i = start + int(outside[0])
            yield Violation(
                "documents",
                index.path,
                f"{at(i)}: expected a sequence index in 0..{index.sequence_count}, "
                f"found {documents[i]}",
            )
            break
    if documents[-1] != index.sequence_count:
        yield Violation(
            "documents",
            index.path,
            f"{at(len(documents) - 1)}: the last entry must be the sequence count "
            f"{index.sequence_count}, found {documents[-1]}",
        )


def _sequence_violations(index: Index, meter: Progress | None) -> Iterator[Violation]:
    lengths, pointers = index.sequence_lengths, index.sequence_pointers
    layout = index.layout
    negative_reported = False
    expected_pointer = 0  # byte offset where the next sequence must start
    for start in range(0, index.sequence_count, CHUNK):
        chunk = lengths[start : start + CHUNK].astype(numpy.int64)
        negative = numpy.flatnonzero(chunk < 0)
        if len(negative) and not negative_reported:
            negative_reported = True
            i = start + int(negative[0])
            yield Violation(
                "lengths",
                index.path,
                f"sequence_lengths[{i}] (byte {layout.lengths_offset + 4 * i}): expected a "
                f"length >= 0, found {lengths[i]}",
            )
        expected = numpy.empty(len(chunk), dtype=numpy.int64)
        expected[0] = expected_pointer
        numpy.cumsum(chunk[:-1] * index.dtype_size, out=expected[1:])
        expected[1:] += expected_pointer
        wrong = numpy.flatnonzero(pointers[start : start + CHUNK] != expected)
        if len(wrong):
            i = start + int(wrong[0])
            yield Violation(
                "pointers",
                index.path,
                f"sequence_pointers[{i}] (byte {layout.pointers_offset + 8 * i}): expected "
                f"{expected[i - start]} (the sum of the lengths before it times "
                f"{index.dtype_size}), found {pointers[i]}",
            )
            return
        expected_pointer = int(expected[-1]) + int(chunk[-1]) * index.dtype_size
        if meter is not None:
            meter.update(len(chunk))
