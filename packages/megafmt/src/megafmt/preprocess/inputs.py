"""Finding and reading the input of ``mega preprocess``: jsonl (plain, .gz, .zst, .bz2, .xz:
:mod:`megafmt.preprocess.decompress`), parquet when pyarrow is installed; a file, a glob, a
directory or any fsspec URL.

Files are read in sorted order (Megatron's tool takes ``glob.glob``'s order, which the file
system decides) and cut into chunks of whole lines (about ``chunk_bytes``, in whole block
reads), so memory stays bounded however large the input. Lines are numbered per file for
error messages and counted across files to deal documents into partitions the way Megatron's
tool does.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec

from megafmt.errors import MissingFileError, PluginError, ReadError
from megafmt.preprocess.decompress import DECOMPRESSION_ERRORS, decompressing
from megafmt.preprocess.decompress import SUFFIXES as COMPRESSED_SUFFIXES

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
#: a plain name, and each suffix the decompressing reader knows
COMPRESSION_SUFFIXES = ("", *COMPRESSED_SUFFIXES)
PARQUET_SUFFIX = ".parquet"


def record_word(path: str) -> str:
    """What an input's records are called in messages: a parquet file's rows, else lines."""
    return "row" if path.endswith(PARQUET_SUFFIX) else "line"


#: one line and its newline
LINE = re.compile(rb"[^\n]*\n")
INPUT_SUFFIXES = (
    *(name + compression for name in JSONL_SUFFIXES for compression in COMPRESSION_SUFFIXES),
    PARQUET_SUFFIX,
)


@dataclass(frozen=True)
class InputFile:
    path: str
    """A local path or a URL with its scheme."""
    size: int
    start: int = 0
    """The byte where reading starts (a line start): above 0 for a shard of a large file."""
    end: int | None = None
    """The byte after the last line read (a line start, or the size); None: the whole file."""

    @property
    def label(self) -> str:
        """The name messages give this input: its path, and the byte range of a shard (whose
        line numbers count from the range's start)."""
        if self.start == 0 and self.end is None:
            return self.path
        return f"{self.path} bytes {self.start}-{self.end}"


@dataclass
class Chunk:
    """Consecutive lines of one input file."""

    file: str
    first_line: int
    """The number (from 1) of the first line in its file."""
    start: int
    """The index of the first line among all lines of all files (from 0)."""
    data: bytes | list[Any]
    """jsonl: the lines as read, one block of bytes (each line with its newline, the last may
    lack one), cut into lines only where a worker reads them one by one; parquet: the rows
    already read, as dicts."""
    nbytes: int

    @property
    def lines(self) -> list[Any]:
        """The raw lines (bytes, each with its newline), or the rows (parquet)."""
        if not isinstance(self.data, bytes):
            return self.data
        lines = LINE.findall(self.data)
        cut = self.data.rfind(b"\n") + 1
        return [*lines, self.data[cut:]] if cut < len(self.data) else lines

    @property
    def count(self) -> int:
        """How many lines (or rows) the chunk holds, without cutting them."""
        if not isinstance(self.data, bytes):
            return len(self.data)
        return self.data.count(b"\n") + (not self.data.endswith(b"\n"))


def expand_input(spec: str) -> list[InputFile]:
    """The files ``--input`` names, sorted; an error when it names none. One listing gives
    names, kinds and sizes (one request for a remote folder, not one per file).

    A name that exists is read as what it is, a file or a folder, even when it also reads as a
    glob pattern (``data[1].jsonl``); only a name that does not exist is expanded as one. A
    folder's hidden files and folders (a name starting with ``.``) are not read, nor are those
    a pattern matches without naming them (as Python's ``glob``, which Megatron's tool uses,
    does not match them): ``.mega/`` holds the manifests of outputs written into the folder,
    which are ``.json`` too."""
    fs, path = fsspec.core.url_to_fs(spec)
    if glob.has_magic(path) and not fs.exists(path):
        names = path.split("/")
        literal = "/".join(itertools.takewhile(lambda n: not glob.has_magic(n), names)) + "/"
        shown = any(name.startswith(".") for name in names[literal.count("/") :])
        found = {
            p: i for p, i in fs.glob(path, detail=True).items() if shown or not _hidden(p, literal)
        }
    elif fs.isdir(path):
        root = path.rstrip("/") + "/"
        found = {
            p: i
            for p, i in fs.find(path, detail=True).items()
            if p.endswith(INPUT_SUFFIXES) and not _hidden(p, root)
        }
    elif fs.exists(path):
        found = {path: fs.info(path)}
    else:
        raise MissingFileError(f"--input {spec}: no such file or directory")
    files = sorted((p, info) for p, info in found.items() if info.get("type") != "directory")
    if not files:
        raise MissingFileError(
            f"--input {spec}: no input files found (looked for {', '.join(JSONL_SUFFIXES)} "
            f"and {PARQUET_SUFFIX}, compressed or not)"
        )
    local = "://" not in spec
    return [
        InputFile(p if local else fs.unstrip_protocol(p), int(info.get("size") or 0))
        for p, info in files
    ]


def _hidden(path: str, root: str) -> bool:
    """Whether ``path``, found in the folder ``root`` (ending with ``/``), is hidden there:
    any of its names below ``root`` starts with ``.`` (a hidden folder above the input folder
    hides nothing)."""
    below = path[len(root) :] if path.startswith(root) else path.rsplit("/", 1)[-1]
    return any(name.startswith(".") for name in below.split("/"))


def _open(path: str) -> Any:
    # a pipe is read as a stream: fsspec's local files seek to their end when opened
    stream = open(path, "rb") if _is_pipe(path) else fsspec.open(path, "rb").open()  # noqa: SIM115
    try:
        return decompressing(stream, path)
    except BaseException:
        stream.close()
        raise


def _is_pipe(path: str) -> bool:
    """Whether ``path`` is a local named pipe (``mkfifo``, a shell's ``<(zcat ...)``)."""
    try:
        return "://" not in path and stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _line_blocks(
    stream: Any, limit: int | None = None, block_bytes: int = 1 << 20
) -> Iterator[bytes]:
    """The bytes of a binary stream up to ``limit``, a block read's worth at a time, each
    block cut after its last newline (the last block may lack one): block reads, since
    decompressing streams do not all iterate by line, and no Python work per line.

    Line ends are Python's text mode's, in which Megatron's tool reads its input: ``\r\n``
    and a lone ``\r`` end a line as ``\n`` does, and come out as ``\n`` (a file with old Mac
    line ends is lines, not one line that is not JSON)."""
    rest = b""
    left = float("inf") if limit is None else limit
    carriage_return = False  # the last block ended with one: "\r\n" or a lone "\r"?
    while left > 0 and (block := stream.read(int(min(block_bytes, left)))):
        left -= len(block)
        if carriage_return:
            block = b"\r" + block
        carriage_return = block.endswith(b"\r")
        if carriage_return:
            block = block[:-1]
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        data = rest + block
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield data[:cut]
    if carriage_return:
        rest += b"\n"
    if rest:
        yield rest


def _parquet_rows(
    path: str, columns: tuple[str, ...], batch_rows: int
) -> Iterator[tuple[list[dict], int]]:
    """The rows of the parquet file ``path`` (its ``columns`` that it has), a batch at a time,
    each with its share of the file's bytes (what progress counts; the rows are compressed
    together); a file pyarrow cannot read, or a string that is not UTF-8, is a
    :class:`ReadError` naming the file and the row."""
    try:
        import pyarrow
        import pyarrow.parquet as parquet
    except ImportError:
        raise PluginError(
            f"{path}: reading parquet input needs pyarrow: pip install megafmt[parquet]"
        ) from None
    first = 1  # the first row of the batch being read
    try:
        with fsspec.open(path, "rb") as stream:
            table = parquet.ParquetFile(stream)
            present = [c for c in columns if c in table.schema_arrow.names]
            size, total, counted = stream.size, max(1, table.metadata.num_rows), 0
            for batch in table.iter_batches(batch_size=batch_rows, columns=present):
                rows = _pylist(batch, first)
                share = size * (first - 1 + len(rows)) // total - counted
                counted += share
                yield rows, share
                first += len(rows)
    except (pyarrow.ArrowException, OSError) as error:
        raise ReadError(
            f"{path}: reading parquet failed at row {first} or in the rows after it: {error}"
        ) from None
    except UnicodeDecodeError as error:
        raise ReadError(f"{path}: {error.reason}") from None


def _pylist(batch: Any, first: int) -> list[dict]:
    """The rows of a record batch whose first is row ``first`` of its file; a string that is
    not UTF-8 raises a UnicodeDecodeError whose reason names its row."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        for row in range(batch.num_rows):
            try:
                batch.slice(row, 1).to_pylist()
            except UnicodeDecodeError as error:
                error.reason = f"row {first + row}: a string that is not UTF-8 ({error.reason})"
                raise
        raise


def read_chunks(
    files: list[InputFile], chunk_bytes: int, columns: tuple[str, ...] = ()
) -> Iterator[Chunk]:
    """The lines of ``files``, in order, as chunks of about ``chunk_bytes`` each."""
    start = 0
    for file in files:
        if file.path.endswith(PARQUET_SUFFIX):
            first = 1
            for rows, nbytes in _parquet_rows(file.path, columns, max(1, chunk_bytes // 1024)):
                yield Chunk(file.path, first, start, rows, nbytes)
                first += len(rows)
                start += len(rows)
            continue
        blocks: list[bytes] = []
        size = 0
        first = 1
        name = file.label
        step = min(1 << 20, chunk_bytes)
        try:
            opened = _open(file.path)
        except DECOMPRESSION_ERRORS as error:  # no permission, a compressed header it refuses
            reason = getattr(error, "strerror", None) or error
            raise ReadError(f"{name}: cannot be opened: {reason}") from None
        try:
            with opened as stream:
                if file.start:
                    stream.seek(file.start)
                limit = None if file.end is None else file.end - file.start
                for block in _line_blocks(stream, limit, step):
                    blocks.append(block)
                    size += len(block)
                    if size >= chunk_bytes:
                        chunk = Chunk(name, first, start, b"".join(blocks), size)
                        yield chunk
                        count = chunk.count
                        first, start = first + count, start + count
                        blocks, size = [], 0
        except DECOMPRESSION_ERRORS as error:
            # a block's read fails whole: the lines read before it are known, not those in it
            read = first - 1 + sum(block.count(b"\n") for block in blocks)
            where = (
                f"after line {read}, within the {step:,} bytes of text after it"
                if read
                else f"within its first {step:,} bytes of text"
            )
            raise ReadError(f"{name}: reading failed {where}: {error}") from None
        if blocks:
            chunk = Chunk(name, first, start, b"".join(blocks), size)
            yield chunk
            start += chunk.count
