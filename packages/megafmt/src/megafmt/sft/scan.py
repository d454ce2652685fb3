"""One pass over an SFT jsonl: every line checked, the good lines' byte ranges kept.

The file is cut at line ends into byte ranges that worker processes check at once (JSON parsing
is most of the cost, and it is per line), each reading only its range (local or any fsspec URL);
the parent stitches their results in file order, so line numbers and the first bad line are
those of a sequential pass. Small files are checked in this process.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import fsspec
import numpy

from megafmt.errors import BadInputError
from megafmt.progress import Progress
from megafmt.sft.messages import line_problem

#: bad lines named in reports and kept in the index (all are counted)
SHOWN_BAD_LINES = 5
BLOCK_BYTES = 8 << 20
#: bytes each worker checks per task; a file this size or smaller is checked in this process
RANGE_BYTES = 64 << 20


@dataclass
class RangeScan:
    """What one byte range of the file holds: its good lines (absolute offsets, line numbers
    counted within the range from 1), how many lines it has, and its bad lines."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    line_count: int = 0
    bad_count: int = 0
    bad: list[tuple[int, int, str]] = field(default_factory=list)
    """(number within the range, byte offset, problem) of the first few"""


def _lines(path: str, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """The lines in bytes [start, end) of ``path`` (``start`` at a line's start): each line's
    offset and its bytes without the line end."""
    offset, carry = start, b""
    with fsspec.open(path, "rb") as stream:
        stream.seek(start)
        left = end - start
        while left > 0 and (block := stream.read(min(BLOCK_BYTES, left))):
            left -= len(block)
            pieces = (carry + block).split(b"\n")
            carry = pieces.pop()
            for piece in pieces:
                yield offset, piece
                offset += len(piece) + 1
    if carry:
        yield offset, carry


def scan_range(
    path: str, start: int, end: int, skip_bad_lines: bool, masked_turns: bool = True
) -> RangeScan:
    """Check the lines in bytes [start, end) (their turns as a masking prompt format checks
    them when ``masked_turns``); without ``skip_bad_lines`` stop at the first bad one."""
    found = RangeScan()
    for offset, raw in _lines(path, start, end):
        found.line_count += 1
        content = raw.rstrip(b"\r")
        if not content.strip():  # blank lines are skipped, as the datasets library skips them
            continue
        problem = line_problem(content, masked_turns)
        if problem is None:
            found.starts.append(offset)
            found.ends.append(offset + len(content))
            found.numbers.append(found.line_count)
            continue
        found.bad_count += 1
        if len(found.bad) < SHOWN_BAD_LINES:
            found.bad.append((found.line_count, offset, problem))
        if not skip_bad_lines:
            break
    return found


def cut_points(path: str, size: int, range_bytes: int | None = None) -> list[int]:
    """Offsets that cut ``path`` into ranges of about ``range_bytes`` (``RANGE_BYTES``), each
    at a line start."""
    range_bytes = range_bytes or RANGE_BYTES
    points = [0]
    with fsspec.open(path, "rb") as stream:
        while points[-1] + range_bytes < size:
            stream.seek(points[-1] + range_bytes)
            skipped = 0
            while (window := stream.read(1 << 16)) and b"\n" not in window:
                skipped += len(window)
            if not window:
                break
            points.append(points[-1] + range_bytes + skipped + window.index(b"\n") + 1)
    return [*points, size] if points[-1] < size else points


def scan(
    path: str,
    size: int,
    skip_bad_lines: bool,
    workers: int | None = None,
    range_bytes: int | None = None,
    masked_turns: bool = True,
) -> tuple[dict[str, numpy.ndarray], int, list[list]]:
    """The good lines of ``path`` (``starts``, ``ends``, 1-based ``lines``), the bad-line
    count and the first few bad lines as ``[line, problem]``; without ``skip_bad_lines`` the
    first bad line is an error naming file, line and byte. ``masked_turns``: lines are checked
    for a prompt format that masks prompts (:func:`~megafmt.sft.messages.messages_problem`)."""
    ranges = list(itertools.pairwise(cut_points(path, size, range_bytes)))
    workers = min(workers or os.cpu_count() or 1, len(ranges))
    results: list[RangeScan] = []
    with Progress(f"indexing {path}", total=size, unit="B") as progress:
        if workers <= 1:
            for start, end in ranges:
                results.append(scan_range(path, start, end, skip_bad_lines, masked_turns))
                progress.update(end - start)
        else:
            context = multiprocessing.get_context("spawn")  # safe under torch's threads too
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                tasks = [
                    pool.submit(scan_range, path, a, b, skip_bad_lines, masked_turns)
                    for a, b in ranges
                ]
                for (start, end), task in zip(ranges, tasks, strict=True):
                    results.append(task.result())
                    progress.update(end - start)
    return _stitch(path, results, skip_bad_lines)


def line_ranges(path: str, size: int) -> dict[str, numpy.ndarray]:
    """Every non-blank line of ``path`` (``starts``, ``ends`` without the line end, 1-based
    ``lines``) from its line ends alone, nothing parsed: seconds for GBs. A line of spaces is
    kept here (a full check counts it blank)."""
    newlines, carriage = [], []
    with fsspec.open(path, "rb") as stream:
        offset, previous = 0, 0
        while block := stream.read(BLOCK_BYTES):
            data = numpy.frombuffer(block, dtype=numpy.uint8)
            found = numpy.flatnonzero(data == 10)
            before = numpy.where(found > 0, data[found - 1], previous)  # the byte before each
            newlines.append(found + offset)
            carriage.append(before == 13)
            offset, previous = offset + len(block), data[-1]
    ends = numpy.concatenate([*newlines, numpy.zeros(0, numpy.int64)]).astype(numpy.int64)
    stripped = ends - numpy.concatenate([*carriage, numpy.zeros(0, bool)])
    starts = numpy.concatenate([[0], ends + 1])
    if starts[-1] < size:  # a last line without its newline
        stripped = numpy.append(stripped, size - (previous == 13))
    else:
        starts = starts[:-1]
    keep = stripped > starts
    return {
        "starts": starts[keep],
        "ends": stripped[keep],
        "lines": numpy.flatnonzero(keep).astype(numpy.int64) + 1,
    }


def _stitch(
    path: str, results: list[RangeScan], skip_bad_lines: bool
) -> tuple[dict[str, numpy.ndarray], int, list[list]]:
    before = 0
    numbers, bad = [], []
    for found in results:
        numbers.append(numpy.asarray(found.numbers, dtype=numpy.int64) + before)
        for number, offset, problem in found.bad:
            if not skip_bad_lines:
                raise BadInputError(
                    f"{path}, line {before + number} (byte {offset}): {problem}; pass "
                    "skip_bad_lines (--skip-bad-lines) to count and skip such lines"
                )
            if len(bad) < SHOWN_BAD_LINES:
                bad.append([before + number, problem])
        before += found.line_count
    arrays = {
        "starts": numpy.asarray([s for found in results for s in found.starts], numpy.int64),
        "ends": numpy.asarray([e for found in results for e in found.ends], numpy.int64),
        "lines": numpy.concatenate(numbers) if numbers else numpy.zeros(0, numpy.int64),
    }
    return arrays, sum(found.bad_count for found in results), bad
