"""Cutting the input of ``mega preprocess`` into shards that tokenize independently.

A shard is one input file, or a byte range of a large uncompressed jsonl file that starts and
ends on line boundaries. Shards in order cover every line of every file exactly once, in
input order, so their outputs merged in shard order are the bytes of one sequential run.
Compressed files and parquet cannot be cut at a byte offset and are one shard each.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import BinaryIO

import fsspec

from megafmt.preprocess.inputs import JSONL_SUFFIXES, InputFile

#: how far past a cut point the next newline is looked for, per read
SCAN_BYTES = 1 << 16


def _next_line_start(stream: BinaryIO, offset: int, size: int) -> int:
    """The first line start at or after ``offset`` (``size`` when no line starts there)."""
    stream.seek(offset - 1)
    position = offset - 1
    while position < size:
        block = stream.read(SCAN_BYTES)
        if not block:
            break
        newline = block.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(block)
    return size


def cut_points(path: str, size: int, shard_bytes: int) -> list[int]:
    """Line starts about ``shard_bytes`` apart in a plain file, from 0 to ``size`` inclusive."""
    points = [0]
    with fsspec.open(path, "rb") as stream:
        while points[-1] + shard_bytes < size:
            point = _next_line_start(stream, points[-1] + shard_bytes, size)
            if point >= size:
                break
            points.append(point)
    return [*points, size]


def plan_shards(files: list[InputFile], shard_bytes: int) -> list[InputFile]:
    """The shards of ``files`` in input order: each file, and each plain jsonl file larger than
    ``shard_bytes`` as ranges of about that many bytes."""
    if shard_bytes < 1:
        raise ValueError(f"the shard size must be at least 1 byte, found {shard_bytes}")
    shards = []
    for file in files:
        if file.size <= shard_bytes or not file.path.endswith(JSONL_SUFFIXES):
            shards.append(file)
            continue
        points = cut_points(file.path, file.size, shard_bytes)
        shards += [
            dataclasses.replace(file, start=start, end=end)
            for start, end in itertools.pairwise(points)
        ]
    return shards
