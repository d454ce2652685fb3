"""A bound on how many readers that hold a file descriptor a process keeps open.

A blend of a thousand corpora opens a thousand datasets. The ``mmap`` reader holds no descriptor
(:mod:`megafmt.mapping`), but readers that do (``.bin`` readers: ``file``, and any reader that
does not say ``holds_descriptor = False``; an SFT corpus's loss mask; an SFT jsonl's lines)
register here when their dataset opens them; past ``capacity`` (the ``MEGAFMT_MAX_OPEN_BIN``
environment variable; default 512, or half the open-files limit where that is lower; a value
the limit cannot hold is refused, naming the limit) the pool releases the reader of a dataset
not read from recently (a CLOCK sweep: every read marks its dataset, the sweep spares marked
datasets once), and that dataset reopens its reader on its next read. Arrays already handed out
stay valid. Where the rest of the process holds more descriptors than the capacity leaves it,
the pool gives readers back and keeps to fewer until descriptors come back
(:func:`opened_with_room`).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

from megafmt.errors import ReadError
from megafmt.limits import carrying_errno, soft_limit

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 512
#: descriptors left to the rest of the process (sockets, DataLoader pipes, logs, the cache)
RESERVED_DESCRIPTORS = 64
#: an open that leaves fewer descriptors free than this has the pool give readers back until
#: twice as many are free (:func:`opened_with_room`)
FEWEST_FREE = 16
#: an open that finds no descriptor free and no reader to give back tries again this many
#: times, waiting twice as long each time from NO_DESCRIPTOR_FIRST_WAIT seconds (0.63 s in all):
#: opens under way in other threads (an ``.idx`` read, then closed) give theirs back
NO_DESCRIPTOR_RETRIES = 6
NO_DESCRIPTOR_FIRST_WAIT = 0.01
#: while the pool keeps to fewer readers than it was made for, every this many opens count the
#: descriptors the process holds (``/proc/self/fd``): where the rest of the process gave some
#: back, the pool takes up to its first capacity again, leaving RESTORED_FREE free
RESTORE_CHECK_OPENS = 64
RESTORED_FREE = 4 * FEWEST_FREE


class Releasable(Protocol):
    """What the pool manages: a dataset that can drop its reader and reopen it later."""

    recently_read: bool

    def release_reader(self) -> None: ...


class ReaderPool:
    """Open readers, at most ``capacity`` of them."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the reader pool needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        #: the capacity it was made with: a capacity lowered for want of descriptors rises
        #: back to it at most (:meth:`raise_to`)
        self.ceiling = capacity
        self._opens_while_lowered = 0
        self._open: deque[weakref.ref] = deque()  # the CLOCK order; dead entries are skipped
        self._members: weakref.WeakSet = weakref.WeakSet()  # the same datasets, for lookups
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._members)

    def opened(self, dataset: Releasable) -> None:
        """Note that ``dataset`` opened its reader, releasing others beyond the capacity."""
        with self._lock:
            if dataset in self._members:
                return
            self._members.add(dataset)
            self._open.append(weakref.ref(dataset))
            if len(self._open) > 2 * self.capacity:  # now and then, drop the dead's entries
                self._open = deque(ref for ref in self._open if ref() is not None)
            # each pass drops a dead entry, releases a reader or clears a mark, so this ends
            while len(self._members) > self.capacity:
                candidate = self._open.popleft()()
                if candidate is None:
                    continue
                if candidate is dataset or candidate.recently_read:  # a second chance
                    candidate.recently_read = False
                    self._open.append(weakref.ref(candidate))
                    continue
                self._members.discard(candidate)
                candidate.release_reader()

    def keep_at_most(self, readers: int) -> tuple[int, int, int]:
        """Release readers, recently read or not, the oldest first, until at most ``readers``
        are open, and keep at most that many (one at least) from now on: the process is short
        of file descriptors. Returns how many were released, and the capacity before and
        after."""
        with self._lock:
            before = self.capacity
            keep = max(0, readers)
            released = 0
            while len(self._members) > keep:
                candidate = self._open.popleft()()
                if candidate is None or candidate not in self._members:
                    continue
                self._members.discard(candidate)
                candidate.release_reader()
                released += 1
            self.capacity = min(before, max(1, keep))
            return released, before, self.capacity

    def due_for_a_count(self) -> bool:
        """Whether the capacity is lowered and this open is one of every
        :data:`RESTORE_CHECK_OPENS` since: time to count the descriptors taken."""
        with self._lock:
            if self.capacity >= self.ceiling:
                return False
            self._opens_while_lowered += 1
            return self._opens_while_lowered % RESTORE_CHECK_OPENS == 0

    def raise_to(self, readers: int) -> tuple[int, int]:
        """Keep up to ``readers`` (at most :attr:`ceiling`) from now on, where that is more
        than now: descriptors came back. Returns the capacity before and after."""
        with self._lock:
            before = self.capacity
            self.capacity = max(before, min(self.ceiling, readers))
            return before, self.capacity


def opened_with_room(open_file: Callable[[], int], path: str, what: str) -> int:
    """``open_file()``, the descriptor of ``path`` (the ``what``), with the pool kept to the
    descriptors the process has left. POSIX hands out the lowest free number, so the number
    says at least how many are taken: one that leaves fewer than ``FEWEST_FREE`` free has the
    pool give readers back until twice as many are. An open that finds none free (EMFILE) has
    the pool release half its readers and tries again; where no reader is left to release, it
    tries again a few times, briefly (other threads' opens under way hold descriptors for a
    moment), then the error names the limit."""
    waits = 0
    while True:
        try:
            fd = open_file()
        except OSError as error:
            if error.errno != errno.EMFILE:
                raise
            if _keep_at_most(len(POOL) // 2):
                continue
            if waits < NO_DESCRIPTOR_RETRIES:
                time.sleep(NO_DESCRIPTOR_FIRST_WAIT * 2**waits)
                waits += 1
                continue
            limit = soft_limit("RLIMIT_NOFILE")
            refused = ReadError(
                f"{path}: cannot open the {what}: the process has no file descriptor left "
                f"(the open-files limit, ulimit -n, RLIMIT_NOFILE: {limit or 'unlimited'}), and "
                "none of the readers megafmt keeps open is left to give one back: the rest of "
                "the process (other files, opens under way in other threads) has held them all "
                f"for {NO_DESCRIPTOR_FIRST_WAIT * (2**NO_DESCRIPTOR_RETRIES - 1):.2f} s. Raise "
                "the limit, or close files elsewhere"
            )
            raise carrying_errno(refused, error) from error
        limit = soft_limit("RLIMIT_NOFILE")
        free = None if limit is None else limit - fd - 1
        if free is not None and free < FEWEST_FREE and len(POOL) > 1:
            _keep_at_most(len(POOL) - (2 * FEWEST_FREE - free))
        elif limit is not None and POOL.due_for_a_count():
            _raise_where_freed(limit)
        return fd


def _raise_where_freed(limit: int) -> None:
    """Raise the pool's lowered capacity to what the descriptors free now leave, counted (the
    lowest free number says nothing of those taken above it): the rest of the process gave
    back what it held when the pool was lowered."""
    try:
        taken = len(os.listdir("/proc/self/fd"))  # the listing's own descriptor included
    except OSError:  # no /proc: the capacity stays lowered
        return
    before, capacity = POOL.raise_to(len(POOL) + limit - taken - RESTORED_FREE)
    if capacity > before:
        logger.info(
            "file descriptors came back (%d of RLIMIT_NOFILE %d taken): keeping up to %d "
            "readers of corpus files open again",
            taken,
            limit,
            capacity,
        )


def _keep_at_most(readers: int) -> int:
    """:meth:`ReaderPool.keep_at_most`, a lowered capacity said in the log; returns how many
    readers it released."""
    held = len(POOL)
    released, before, capacity = POOL.keep_at_most(readers)
    if capacity < before:
        logger.warning(
            "the process is short of file descriptors (RLIMIT_NOFILE %s) with %d readers of "
            "corpus files open: keeping at most %d open from now on (MEGAFMT_MAX_OPEN_BIN "
            "sets it)",
            soft_limit("RLIMIT_NOFILE"),
            held,
            capacity,
        )
    return released


class OpenDescriptor:
    """A read-only descriptor of a file, opened by this process (``pid``), closed when the last
    reference to it goes: a read under way holds one, so a pool that releases its dataset's
    descriptor meanwhile neither closes it under the read nor lets its number be reused."""

    __slots__ = ("fd", "pid")

    def __init__(self, path: str) -> None:
        self.fd = opened_with_room(lambda: os.open(path, os.O_RDONLY), path, "file")
        self.pid = os.getpid()

    def __del__(self, close: Callable[[int], None] = os.close) -> None:
        # os.close bound here: a descriptor collected at interpreter exit finds globals gone
        fd = getattr(self, "fd", None)  # None: the file could not be opened
        if fd is not None:
            try:  # noqa: SIM105 (contextlib.suppress, a global, is gone at exit too)
                close(fd)
            except OSError:
                pass


def _capacity_from_environment() -> int:
    """``MEGAFMT_MAX_OPEN_BIN``, refused when the open-files limit leaves it no room (the
    readers would fail with "Too many open files" part way through a run); unset, the default,
    lowered to half the limit where the limit is small, and to the room the limit leaves (one
    reader at least: a run that opens one ``.bin`` at a time still works)."""
    limit = soft_limit("RLIMIT_NOFILE")  # ulimit -n
    room = None if limit is None else limit - RESERVED_DESCRIPTORS
    value = os.environ.get("MEGAFMT_MAX_OPEN_BIN")
    if value is None:
        if limit is None:
            return DEFAULT_CAPACITY
        return max(1, min(DEFAULT_CAPACITY, limit // 2, room))
    try:
        capacity = int(value)
    except ValueError:
        capacity = 0
    if capacity < 1:
        raise ValueError(f"MEGAFMT_MAX_OPEN_BIN={value!r}: expected a positive number of readers")
    if room is not None and capacity > max(room, 1):  # one reader always: the default's least
        raise ValueError(
            f"MEGAFMT_MAX_OPEN_BIN={capacity} open readers do not fit the open-files limit "
            f"(ulimit -n, RLIMIT_NOFILE: {limit} files, {RESERVED_DESCRIPTORS} of them kept for "
            f"the rest of the process): set MEGAFMT_MAX_OPEN_BIN to at most {max(room, 1)}, or "
            "raise the limit"
        )
    return capacity


POOL = ReaderPool(_capacity_from_environment())


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has only the thread that forked: a lock another
    thread of the parent held would never be released."""
    POOL._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
