"""A byte-offset index of an SFT jsonl's lines, built once and cached beside the file.

Megatron-LM's SFT dataset loads the whole jsonl through the ``datasets`` library (an Arrow copy
of every line, in memory and in a cache) before the first sample. Here the file is scanned once:
every line is checked (:func:`~megafmt.sft.messages.line_problem`) and the byte range of each
good one kept, so opening a multi-GB file later costs reading a few MB of offsets, and a sample
reads its own line and nothing else.

The index is an ``.npz`` (``starts``, ``ends``, 1-based ``lines`` numbers, and ``meta``: JSON
with the file's size, content hash and modification time, and the bad lines seen). It lies
beside the file as ``<file>.sftlines.npz``, or under ``default_cache_dir()/sft-lines`` when the
file is a URL (any fsspec URL) or its folder is not writable. A changed file is indexed again.
Blank lines are skipped (the ``datasets`` JSON reader skips them too); any other line that is
not a valid example is an error naming file and line, or, with ``skip_bad_lines``, counted,
skipped and reported. ``check="on_read"`` trades the first pass's checks for speed: the index
is built from line ends alone and a bad line is an error when a sample reads it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from typing import Any

import numpy

from megafmt.atomic import write_atomically
from megafmt.checked import one_checker
from megafmt.errors import BadInputError, ObjectChangedError
from megafmt.fingerprint import file_version
from megafmt.readers import is_url
from megafmt.readers import pool as reader_pool
from megafmt.readers.pool import OpenDescriptor
from megafmt.remote import default_cache_dir, fetch_range, filesystem
from megafmt.sft.messages import Message, parse_line
from megafmt.sft.scan import line_ranges, scan
from megafmt.sft.tokenizer import tokenize_line

#: bumped when the cached index's layout (or what makes a line good) changes
INDEX_FORMAT = 2
#: when lines are checked: all of them while indexing, or each when it is read
CHECKS = ("all", "on_read")
SUFFIX = ".sftlines.npz"
#: the notes' kind whose locks let one process per machine scan a new jsonl
SCANS = "sft-scans"


def _version(path: str) -> dict[str, Any]:
    size, digest = file_version(path, "SFT jsonl")
    version: dict[str, Any] = {"size": size, "hash": digest}
    if not is_url(path):
        version["mtime_ns"] = os.stat(path).st_mtime_ns
    return version


def stat_identity(status: os.stat_result) -> tuple[int, int, int, int]:
    """Which file, as it was: device, inode, size and modification time (a file replaced, or
    written in place, differs; one whose mode or links changed does not)."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def index_path(path: str) -> str:
    """Where the index of ``path`` is kept: beside a local file in a writable folder, else in
    the cache folder under a name made from the path."""
    if not is_url(path):
        folder = os.path.dirname(os.path.abspath(path))
        if os.access(folder, os.W_OK):
            return os.path.abspath(path) + SUFFIX
    name = hashlib.md5(path.encode("utf-8"), usedforsecurity=False).hexdigest()
    return os.path.join(default_cache_dir(), "sft-lines", name + SUFFIX)


def _scan(
    path: str, skip_bad_lines: bool, workers: int | None, check: str, masked_turns: bool
) -> tuple[dict[str, numpy.ndarray], dict[str, Any]]:
    """Index ``path``: every line checked (``check="all"``), or only its line ends found."""
    version = _version(path)
    if check == "all":
        arrays, bad_count, bad = scan(
            path, version["size"], skip_bad_lines, workers, masked_turns=masked_turns
        )
    else:
        arrays, bad_count, bad = line_ranges(path, version["size"]), 0, []
    meta = {"format": INDEX_FORMAT, "path": path, "version": version, "checked": check == "all"}
    meta["masked_turns"] = masked_turns
    meta.update(bad_lines=bad_count, shown_bad_lines=bad)
    return arrays, meta


def _load(cache: str, path: str) -> tuple[dict[str, numpy.ndarray], dict[str, Any]] | None:
    """The cached index of ``path`` when it is there and describes the file as it is now."""
    try:
        with numpy.load(cache, allow_pickle=False) as stored:
            arrays = {key: stored[key] for key in ("starts", "ends", "lines")}
            meta = json.loads(stored["meta"].tobytes())
    except (OSError, ValueError, KeyError):
        return None
    if meta.get("format") != INDEX_FORMAT or meta.get("version") != _version(path):
        return None
    return arrays, meta


def _serves(meta: dict[str, Any], check: str, masked_turns: bool) -> bool:
    """Whether a stored index (its ``meta``) serves a reader with these settings."""
    return (check != "all" or meta["checked"]) and meta["masked_turns"] == masked_turns


def _store(cache: str, arrays: dict[str, numpy.ndarray], meta: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    buffer = io.BytesIO()
    encoded = numpy.frombuffer(json.dumps(meta).encode("utf-8"), dtype=numpy.uint8)
    numpy.savez(buffer, meta=encoded, **arrays)
    write_atomically(cache, buffer.getbuffer())


class JsonlLineIndex:
    """The good lines of an SFT jsonl (local path or fsspec URL): ``len``, their numbers in the
    file, and each line's ``messages`` read on demand. Pickles as its path and offsets.
    ``workers`` processes check a file that is not yet indexed (default: one per core).
    ``masked_turns`` (the default): lines are checked as a prompt format that masks prompts
    needs them (:func:`~megafmt.sft.messages.messages_problem`); off, as any format takes them.
    ``check="on_read"`` indexes a new file from its line ends alone (seconds for GBs) and
    checks each line when it is read instead; an index built with every line checked serves
    both."""

    def __init__(
        self,
        path: str,
        skip_bad_lines: bool = False,
        workers: int | None = None,
        check: str = "all",
        masked_turns: bool = True,
    ) -> None:
        #: the local file's descriptor, opened at the first read (in each process), held in
        #: megafmt's pool of open readers (a blend of thousands of files keeps a bounded number)
        self._descriptor: OpenDescriptor | None = None
        self.recently_read = False
        self._pid = -1
        self._client: tuple[Any, str] | None = None  # a URL's file system, per process
        if check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}, found {check!r}")
        if skip_bad_lines and check != "all":
            raise ValueError(
                "skip_bad_lines needs check='all': skipping decides which lines exist, so every "
                "line is checked before the first is read"
            )
        self.path = path
        self._remote = is_url(path)  # decided once: every read goes one way or the other
        self.masked_turns = masked_turns
        self.index_path = index_path(path)
        arrays, meta = self._indexed(skip_bad_lines, workers, check)
        #: the local file the offsets are of: every read checks that its descriptor is still it
        self._identity = None if self._remote else stat_identity(os.stat(path))
        #: the object's version (ETag) the offsets are of: every read of a URL is bound to it
        self._etag = str(meta["version"]["hash"]) if self._remote else None
        self.starts, self.ends, self.lines = arrays["starts"], arrays["ends"], arrays["lines"]
        self.checked: bool = meta.get("checked", True)
        self.bad_lines: int = meta["bad_lines"]
        self.shown_bad_lines: list[tuple[int, str]] = [tuple(b) for b in meta["shown_bad_lines"]]
        if self.bad_lines:
            self._report_bad_lines(skip_bad_lines)

    def _indexed(
        self, skip_bad_lines: bool, workers: int | None, check: str
    ) -> tuple[dict[str, numpy.ndarray], dict[str, Any]]:
        """The stored index when it serves these settings, else a new scan, stored. One process
        of this machine scans (with a pool of its cores); the others, every data rank at once,
        wait for it and load what it stored."""
        found = _load(self.index_path, self.path)
        if found is not None and _serves(found[1], check, self.masked_turns):
            return found
        with one_checker(self.path, SCANS, lock_of_its_own=True):  # a scan may take minutes
            found = _load(self.index_path, self.path)
            if found is not None and _serves(found[1], check, self.masked_turns):
                return found
            scanned = _scan(self.path, skip_bad_lines, workers, check, self.masked_turns)
            _store(self.index_path, *scanned)
            return scanned

    def _report_bad_lines(self, skip_bad_lines: bool) -> None:
        number, problem = self.shown_bad_lines[0]
        if not skip_bad_lines:
            raise BadInputError(
                f"{self.path}, line {number}: {problem} ({self.bad_lines} bad lines in all); "
                "pass skip_bad_lines (--skip-bad-lines) to count and skip such lines"
            )
        shown = "; ".join(f"line {n}: {p}" for n, p in self.shown_bad_lines)
        warnings.warn(f"{self.path}: skipped {self.bad_lines} bad lines ({shown})", stacklevel=3)

    def __len__(self) -> int:
        return len(self.starts)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_descriptor": None, "_pid": -1, "_client": None}

    def release_reader(self) -> None:
        """Drop the file's descriptor (the pool of open readers calls this); the next read opens
        it again."""
        self._descriptor = None

    def raw(self, idx: int) -> bytes:
        """The bytes of good line ``idx`` (0-based among the good lines)."""
        start, end = int(self.starts[idx]), int(self.ends[idx])
        if self._remote:
            return self._fetch(start, end)
        held = self._descriptor
        if held is None or held.pid != os.getpid():  # DataLoader workers fork: one each
            held = self._descriptor = OpenDescriptor(self.path)
            reader_pool.POOL.opened(self)
        self.recently_read = True
        found = stat_identity(os.fstat(held.fd))
        if found != self._identity:  # an fstat: microseconds next to parsing the line
            raise ObjectChangedError(
                f"{self.path} changed since it was indexed (device, inode, size, mtime_ns "
                f"{self._identity} then, {found} now: replaced or edited in place); its lines "
                "would be read at the old offsets. Open it again to index it anew"
            )
        return os.pread(held.fd, end - start, start)

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the object, through one client per process bound to
        the version indexed (a replaced object fails the read, HTTP 412, on S3)."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = filesystem(self.path, if_match=self._etag), os.getpid()
        fs, inner = self._client
        try:
            return fetch_range(fs, inner, self.path, start, end)
        except ObjectChangedError as error:
            raise ObjectChangedError(
                f"{self.path} changed since it was indexed (ETag {self._etag} then); its lines "
                "would be read at the old offsets. Open it again to index it anew"
            ) from error

    def __getitem__(self, idx: int) -> list[Message]:
        """The ``messages`` of good line ``idx``, as Megatron-LM's low-level SFT dataset gives
        (checked now when the index was built with ``check="on_read"``)."""
        raw = self.raw(idx)
        if self.checked:
            return json.loads(raw)["messages"]
        messages, problem = parse_line(raw, self.masked_turns)
        if problem is not None:
            raise BadInputError(
                f"{self.path}, line {int(self.lines[idx])} (byte {int(self.starts[idx])}): "
                f"{problem}"
            )
        return messages

    def tokenized_conversations(
        self, idx: int, tokenizer: Any
    ) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
        """The ids and targets of line ``idx``'s conversations, tokenized by ``tokenizer``."""
        return tokenize_line(self[idx], tokenizer)
