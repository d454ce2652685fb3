"""Small cache files, written atomically by native threads in the background of a build.

A cold build of a blend of thousands of small corpora writes five files for each (three tables,
the sidecar, the description); creating a file costs tens of microseconds of system calls,
hundreds on a busy file system, about a third of the build when Python makes them one after
the other. Inside :func:`background_writes` (the builder's scope over a blend's corpora) each
entry's files are handed to threads of the extension that never take the GIL, and the build
goes on; the scope ends only once every file is in place, before the builder's barrier lets
other ranks read them. A table's bytes are made once, in memory the extension holds
(:func:`held_bytes`), and the writer takes that memory as it is: no second copy on the
builder's thread. Outside it (a dataset built on its own, a cache shared through object
storage, whose files are uploaded right after) the same write runs at once.

A blend's small GPT split goes further (:class:`TablesJob`): its three tables are built by the
writer thread itself, from the split's inputs, and their CRC-32s written into the sidecar, so
the builder's thread only plans the split and goes on (0.4 s of a 2,400-corpus blend's 2 s
build at 2M samples were those tables, built on the builder's thread).

Each file is written as :func:`megafmt.atomic.write_atomically` writes it: created exclusively
under a temporary name (:func:`megafmt.atomic.partial_path`: the next build removes those a
killed one left), never through a planted link, with the umask's permissions, then renamed
into place (closed first, its close checked: a network file system reports a full disk
there). Each file's identity (:func:`megafmt.fingerprint.file_identity`) is taken after its
rename, for the sidecar and for the tables mapped later; where another process renamed its own
file over it meanwhile, the identity is that of the file written, which no longer matches the
name's (a reader checks that one by its checksum).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy

from megafmt import get_bin_path, get_idx_path
from megafmt.atomic import partial_path
from megafmt.fingerprint import (
    BLOCK_BYTES,
    SAMPLED_BLOCKS,
    SAMPLED_HEADER_BYTES,
    corpus_fingerprint,
    corpus_stat,
    described_files,
    idx_modified_ns,
    sizes_and_inodes,
)
from megafmt.mapping import release_pages
from megaindex import _ext
from megaindex.errors import CacheError

#: the threads of a build's background writes: two overlap creations in one folder best (one
#: thread 51 us per file, two 33, four 36, on this project's ext4 test machine)
WRITER_THREADS = 2
#: the most bytes of files waiting to be written before a submit waits (one write always
#: passes): a slow file system does not pile a blend's tables up in memory
MAX_QUEUED_BYTES = 32 << 20
#: how long one wait for the writer threads lasts before signals are taken again
WAIT_SLICE_SECONDS = 1.0
#: a build that wrote at most this many files in a folder looks at each when it ends (they
#: must still be there); more, and it lists the folder once
LOOKED_AT_ONE_BY_ONE = 256
#: how often a wait for the writer threads says what it waits for
WAIT_MESSAGE_SECONDS = 10.0

logger = logging.getLogger(__name__)
Result = TypeVar("Result")


@dataclass(frozen=True)
class CorpusFiles:
    """A local corpus whose fingerprint (:func:`megafmt.fingerprint.corpus_fingerprint`) the
    writer takes and writes into a file: by its threads, without the GIL, while the build goes
    on (0.15 ms of each of a blend's small corpora)."""

    prefix: str
    """The corpus's path prefix, absolute (read later, maybe in another working directory)."""
    opened: dict[str, list[int]] | None = None
    """The files as the tables were cut from them (:func:`megafmt.fingerprint.corpus_stat`):
    files of another size or inode (the corpus replaced by a rename, or cut or grown, since), or
    an ``.idx`` with another modification time (written in place), are not fingerprinted, and
    the write fails (None: not checked). The ``.bin``'s times are not compared: the tables are
    not cut from it. A touch of the ``.idx`` while the tables build passes where the tables cut
    again from it are the same (:meth:`megaindex.tables.CachedTables`), with the files as they
    are then."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", os.path.abspath(self.prefix))

    def paths(self) -> tuple[str, str]:
        """The ``.idx`` and the ``.bin``."""
        return get_idx_path(self.prefix), get_bin_path(self.prefix)

    def step(self) -> tuple[bytes, bytes, int, int, int, list[int]]:
        """What the extension takes: both paths, how the ``.bin`` is sampled, and the files as
        opened (each file's size and inode, then the ``.idx``'s modification time in ns, as
        unsigned 64-bit values; empty: not checked)."""
        idx, bin_path = self.paths()
        opened = []
        if self.opened is not None:
            opened = [*sizes_and_inodes(self.opened), idx_modified_ns(self.opened)]
        return (
            os.fsencode(idx),
            os.fsencode(bin_path),
            SAMPLED_HEADER_BYTES,
            SAMPLED_BLOCKS,
            BLOCK_BYTES,
            [value & UINT64 for value in opened],
        )

    def fingerprint(self) -> dict[str, Any]:
        """The corpus's fingerprint, taken in Python; raises
        :class:`~megaindex.errors.CacheError` where the files are no longer those opened,
        before or after it was taken (as the extension fails the write)."""
        fingerprint = self.unchecked_fingerprint()
        self.check_as_opened()
        return fingerprint

    def unchecked_fingerprint(self) -> dict[str, Any]:
        """The corpus's fingerprint as its files are now (a large corpus's, taken beside its
        build, which checks the files once both are done)."""
        return corpus_fingerprint(self.prefix)

    def check_as_opened(self) -> None:
        """Raise :class:`~megaindex.errors.CacheError` where the path's files now are not those
        opened (another size or inode, or an ``.idx`` written since), naming both."""
        if self.opened is None:
            return
        now = corpus_stat(self.prefix)
        if self.idx_written(now):
            raise CacheError(
                f"{self.idx_written_message(now)}; the tables are not cached. Build again once "
                "the corpus is complete"
            )

    def idx_written(self, now: dict[str, list[int]]) -> bool:
        """Whether the ``.idx`` was written in place since it was opened (the same size and
        inode as the files ``now``, another modification time); raises
        :class:`~megaindex.errors.CacheError` where the files were replaced (another size or
        inode), naming both."""
        if self.opened is None:
            return False
        if sizes_and_inodes(now) != sizes_and_inodes(self.opened):
            raise CacheError(
                f"{self.prefix}: the corpus's files changed while its index tables were built: "
                f"opened as {described_files(self.opened)}, now {described_files(now)} "
                "(replaced, or cut or grown); the tables are not cached. Build again once the "
                "corpus is complete"
            )
        return idx_modified_ns(now) != idx_modified_ns(self.opened)

    def idx_written_message(self, now: dict[str, list[int]]) -> str:
        """That the ``.idx`` was written in place since it was opened (the same size and inode,
        another modification time ``now``), for errors."""
        size, inode = sizes_and_inodes(now)[:2]
        return (
            f"{self.paths()[0]}: the corpus's .idx was written in place while its index tables "
            f"were built: the same size ({size} bytes) and inode ({inode}), but modified at "
            f"{idx_modified_ns(now)} ns, not {idx_modified_ns(self.opened)} ns as opened"
        )


#: unsigned 64-bit values of the stats the extension compares
UINT64 = (1 << 64) - 1
#: a step without a corpus to fingerprint
_NO_CORPUS = (b"", b"", 0, 1, 1, [])


#: a file's bytes the extension holds (:func:`held_bytes`)
FileBytes = _ext.FileBytes


def held_bytes(head: bytes, array: numpy.ndarray) -> FileBytes:
    """``head``'s bytes, then ``array``'s (C-ordered, any dtype), copied once into memory the
    extension holds: a write takes them without another copy (a table copied again into the
    writer's memory, under the GIL, was a sixth of a large blend's cold build). A write empties
    them: each is written once."""
    return FileBytes.join(head, array.reshape(-1).view(numpy.uint8))


@dataclass(frozen=True)
class FileWrite:
    """One file: ``data`` at ``path``; with ``corpus``, followed by the JSON object of that
    corpus's fingerprint, then ``between``; with ``identities_of`` (JSON keys, already quoted,
    and the position of an earlier file of the same write), followed by a JSON object of those
    files' identities; then ``tail``."""

    path: str
    data: bytes | FileBytes
    """The bytes, or bytes the extension holds (:func:`held_bytes`), taken by the write."""
    identities_of: tuple[tuple[str, int], ...] = ()
    tail: str = ""
    corpus: CorpusFiles | None = None
    between: str = ""
    commit_mark: bool = False
    """The cache entry's commit mark (its description): another process that finds the entry
    damaged withdraws it before rewriting the tables, so its absence when the build ends is no
    loss (:meth:`BackgroundWrites.finish` looks for the others)."""


@dataclass(frozen=True)
class TablesJob:
    """GPTDataset's three tables of a small split, built by the writer thread that writes
    them (without the GIL, beside the build's own thread) from these inputs, as
    :func:`megaindex.helpers.build_gpt_tables` builds them: the write's first three files are
    the tables (:class:`FileWrite` of their ``.npy`` headers), its fourth the sidecar, with
    :data:`CHECKSUMS_MARK` where their checksums go."""

    sizes: numpy.ndarray
    """The corpus's sequence lengths (int32), copied when submitted."""
    documents: numpy.ndarray
    """The split's documents (int32), copied when submitted."""
    num_epochs: int
    separate_final_epoch: bool
    seed: int
    sequence_length: int
    add_extra_token: int
    num_samples: int
    samples_first: int
    int64_sample_index: bool
    int64_shuffle_index: bool
    table_bytes: int
    """The tables' bytes and the inputs', counted among those waiting to be written."""


#: where a :class:`TablesJob`'s sidecar takes its tables' checksums (a JSON object); JSON text
#: never holds a NUL
CHECKSUMS_MARK = b"\0checksums\0"


def _waited(attempt: Callable[[float], Result | None], what: str) -> Result:
    """``attempt(seconds)`` again until it gives something, saying every
    :data:`WAIT_MESSAGE_SECONDS` what it waits for (a stalled network file system would
    otherwise hold the build without a word) and taking signals between attempts."""
    start = last = time.monotonic()
    while True:
        result = attempt(WAIT_SLICE_SECONDS)
        if result is not None:
            return result
        now = time.monotonic()
        if now - last >= WAIT_MESSAGE_SECONDS:
            last = now
            logger.warning(
                "waiting %.0f s for %s: the file system is slow or does not answer",
                now - start,
                what,
            )


#: the error of a write whose tables' walk was refused (:class:`TablesJob`): no errno's
TABLES_REFUSED = -1


class TablesRefused(CacheError):
    """A write's tables were not built, and nothing was written: the walk was refused (a
    document id outside the corpus's lengths, or the stream ends in an empty document)."""


class Written:
    """The files of one write, in place now or later (:meth:`identities` waits)."""

    def __init__(
        self,
        outcome: tuple[list, int, bytes, str] | None,
        pending: object = None,
        last: str = "",
    ) -> None:
        self._outcome = outcome
        self._pending = pending
        self._last = last
        self._lock = threading.Lock()

    def _ended_outcome(self) -> tuple[list, int, bytes, str]:
        with self._lock:  # any thread may ask (a table mapped when first read)
            if self._outcome is None:
                self._outcome = _waited(
                    self._pending.wait, f"the write of the files ending with {self._last}"
                )
                self._pending = None
            return self._outcome

    def identities(self) -> list[list[int]]:
        """Each file's identity, in the order given; raises ``OSError`` (with the path) when
        the write failed, :class:`TablesRefused` when its tables were not built."""
        identities, error, path, _ = self._ended_outcome()
        if error == TABLES_REFUSED:
            raise TablesRefused(errno.EINVAL, "the tables' walk was refused", os.fsdecode(path))
        if error:
            raise OSError(error, os.strerror(error), os.fsdecode(path))
        return identities

    def checksums(self) -> dict[str, str]:
        """The CRC-32 of each table the write built (:class:`TablesJob`), by name, whether its
        files were then written or not (empty: none built)."""
        text = self._ended_outcome()[3]
        return json.loads(text) if text else {}

    def ended(self) -> bool:
        """Whether the write has ended (its :meth:`identities` then come without a wait); never
        waits: False while another thread waits for it."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._outcome is None:
                self._outcome = self._pending.wait(0.0)
                if self._outcome is None:
                    return False
                self._pending = None
            return True
        finally:
            self._lock.release()


@dataclass
class _Submitted:
    written: Written
    on_done: Callable[[], None]
    on_error: Callable[[OSError], Exception | None]
    """The failure's exception, raised at the build's end (None: mended)."""
    paths: tuple[str, ...]
    builds_tables: bool = False
    """Whether the write builds its tables (:class:`TablesJob`): its failure may be mended."""


class BackgroundWrites:
    """The writes of one build, on :data:`WRITER_THREADS` native threads."""

    def __init__(self, threads: int = WRITER_THREADS) -> None:
        self._pool = _ext.FileWriterPool(threads, MAX_QUEUED_BYTES)
        self._submitted: list[_Submitted] = []
        self._ended = 0  # the submissions before it ended without an error
        self._by_last_path: dict[str, list[Written]] = {}
        self._lock = threading.Lock()

    def submit(
        self,
        files: Sequence[FileWrite],
        on_done: Callable[[], None],
        on_error: Callable[[OSError], Exception | None],
        tables: TablesJob | None = None,
    ) -> Written:
        """Queue ``files`` (with ``tables``: built first, by the writer); ``on_error`` gives
        the exception a failure raises when the build's writes end (None: the failure was
        mended)."""
        steps, last = _steps(files), files[-1].path
        if tables is None:
            submit = functools.partial(self._pool.submit, steps)
        else:  # the job's fields are the extension's arguments, by name
            submit = functools.partial(self._pool.submit_tables, steps, **vars(tables))
        pending = _waited(
            submit,
            f"room among the build's writes in the background (for the files ending with {last})",
        )
        written = Written(None, pending, last)
        with self._lock:
            paths = tuple(f.path for f in files if not f.commit_mark)
            self._submitted.append(
                _Submitted(written, on_done, on_error, paths, tables is not None)
            )
            self._by_last_path.setdefault(files[-1].path, []).append(written)
        if tables is not None:  # copied by the job: a mapped corpus's lengths need not stay
            release_pages(tables.sizes)  # resident (as the builder's thread releases them)
        return written

    def wait_for(self, path: str) -> None:
        """Wait for the writes whose last file is ``path`` (another dataset of the same build
        asks for the same cache entry)."""
        with self._lock:
            waiting = list(self._by_last_path.get(path, ()))
        for written in waiting:
            with contextlib.suppress(OSError):  # reported when the build's writes end
                written.identities()

    def raise_failure(self) -> None:
        """Raise the first failure among the writes that have ended, in the order they were
        submitted, as :meth:`finish` would raise it (which still ends every write): a build
        that can write no file stops at once, not after thousands of corpora. A write that
        built its tables (:class:`TablesJob`) and found its corpus's files not as opened
        stops the look without a word: it may be mended, which only :meth:`finish` does, once
        every dataset of the build is made (a mend replaces its dataset's tables)."""
        with self._lock:
            while self._ended < len(self._submitted):
                item = self._submitted[self._ended]
                if not item.written.ended():
                    return
                try:
                    item.written.identities()
                except OSError as error:
                    if item.builds_tables and error.errno == errno.ESTALE:
                        return  # may be mended: only finish mends
                    raise item.on_error(error) from error
                self._ended += 1

    def finish(self) -> None:
        """Wait for every write, stop the threads, and raise the first failure (as its
        ``on_error`` words it, the ``OSError`` as its cause; a failure its ``on_error`` mends
        is none); a file written and gone by then (its folder removed or emptied while the
        build ran, a mended write's files included) is such a failure: its tables are mapped
        when first read, which would fail only then, maybe hours into a run. Called once every
        dataset of the build is made (the builder's threads are done)."""
        failure: tuple[Exception, OSError] | None = None
        with self._lock:
            submitted, self._submitted, self._ended = self._submitted, [], 0
            self._by_last_path = {}
        ended = 0
        try:
            for item in submitted:
                try:
                    item.written.identities()
                except OSError as error:
                    if failure is None and (raised := item.on_error(error)) is not None:
                        failure = (raised, error)
                finally:
                    ended += 1
                    item.on_done()
        finally:
            try:
                self._pool.close()
            finally:
                # interrupted (Ctrl-C): the writes not waited for end too, once the threads
                # stopped, whatever became of them
                for item in submitted[ended:]:
                    with contextlib.suppress(Exception):
                        item.on_done()
        failure = failure or _first_gone(submitted)
        if failure is not None:
            raise failure[0] from failure[1]


def _first_gone(submitted: Sequence[_Submitted]) -> tuple[Exception, OSError] | None:
    """The failure of the first write one of whose files is no longer where it was written."""
    by_folder: dict[str, list[str]] = {}
    for item in submitted:
        for path in item.paths:
            by_folder.setdefault(os.path.dirname(path), []).append(path)
    gone = set().union(*(_gone_from(folder, paths) for folder, paths in by_folder.items()))
    for item in submitted:
        for path in item.paths:
            if path in gone:
                error = FileNotFoundError(
                    errno.ENOENT, "written by this build, and gone before it ended", path
                )
                raised = item.on_error(error)
                if raised is not None:
                    return raised, error
    return None


def _gone_from(folder: str, paths: list[str]) -> set[str]:
    """Those of ``paths`` (files written in ``folder``) no longer there. More than
    :data:`LOOKED_AT_ONE_BY_ONE` are found in one listing of the folder (a blend's thousands of
    files; a long-lived cache folder's listing costs more than a few files' looks); fewer, or
    a folder that cannot be listed (no descriptor left, no permission), are looked at one by
    one, and a file that cannot be looked at is not judged."""
    if len(paths) > LOOKED_AT_ONE_BY_ONE:
        try:
            names = frozenset(os.listdir(folder or "."))
        except (FileNotFoundError, NotADirectoryError):  # the folder itself is gone
            return set(paths)
        except OSError:
            pass
        else:
            return {path for path in paths if os.path.basename(path) not in names}
    gone = set()
    for path in paths:
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            gone.add(path)
        except OSError:
            pass
    return gone


_scope = threading.local()


def _after_fork_in_child() -> None:
    """A child forked during a build has none of its writer threads: it writes at once."""
    global _scope
    _scope = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def current() -> BackgroundWrites | None:
    """The background writes of the build running on this thread, if any."""
    return getattr(_scope, "writes", None)


@contextlib.contextmanager
def background_writes() -> Iterator[BackgroundWrites]:
    """A build's scope: writes submitted on this thread (and on threads that
    :func:`adopt` it) go to the background; all are in place when the block ends."""
    writes = BackgroundWrites()
    outer = current()
    _scope.writes = writes
    try:
        yield writes
    except BaseException:
        with contextlib.suppress(Exception):  # the build's own error is the one to see
            writes.finish()
        raise
    else:
        writes.finish()
    finally:
        _scope.writes = outer


def adopt(writes: BackgroundWrites | None) -> None:
    """Make ``writes`` this thread's scope (a builder's pool thread)."""
    _scope.writes = writes


def write_files(
    files: Sequence[FileWrite],
    on_done: Callable[[], None],
    on_error: Callable[[OSError], Exception | None],
    background: bool = True,
    tables: TablesJob | None = None,
) -> Written:
    """Write ``files`` in order: in the background when ``background`` and this thread is in a
    build's scope, else now (``on_error``'s exception raised for a failure). ``on_done`` runs
    once the write is finished, whether it failed or not. ``tables``: the first three files
    are tables the writer builds (:class:`TablesJob`), in a build's background only."""
    writes = current() if background else None
    if writes is not None:
        try:
            return writes.submit(files, on_done, on_error, tables)
        except BaseException:
            on_done()
            raise
    if tables is not None:
        on_done()
        raise ValueError("tables built by the writer are written in a build's background only")
    try:
        written = Written(_ext.write_files(_steps(files)))
        written.identities()
    except OSError as error:
        raise on_error(error) from error
    finally:
        on_done()
    return written


def _steps(files: Sequence[FileWrite]) -> list[tuple]:
    return [
        (
            os.fsencode(f.path),
            os.fsencode(partial_path(f.path)),
            f.data,
            _NO_CORPUS if f.corpus is None else f.corpus.step(),
            f.between,
            list(f.identities_of),
            f.tail,
        )
        for f in files
    ]
