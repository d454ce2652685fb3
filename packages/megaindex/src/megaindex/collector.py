"""Python's cyclic garbage collector, paused while datasets are built.

A blend of thousands of corpora makes hundreds of thousands of small objects that all live on
(datasets, their tables and settings), in a process that already holds as many (torch's
modules): each time the collector's thresholds are reached it walks them all, and finds nothing
to free. That walking was a third of a 2,400-corpus blend's cache hit. While a build runs the
collector is off; once the last concurrent build ends it is back as it was (reference counting
frees everything that holds no cycle meanwhile; cyclic garbage waits for the end). A process
forked during a build runs none: its collector is back as it was before the build. Whoever
turns the collector on or off during a build is overruled when the build ends.

When it is turned back on, the objects the build made are moved to the oldest generation
(``gc.freeze`` then ``gc.unfreeze``, which walks none of them): left in the youngest, the first
allocation after the build walked them all at once (200,000 objects, 0.07 to 0.19 s of that
blend's 1.2 s cache hit), again to find nothing. Objects that were young when the build began
move with them, to be looked at by the next full collection; where anything is frozen already
(a program that froze its objects before forking workers), nothing is moved: unfreezing would
undo that. Nor after a build that failed: what it made is garbage, its traceback's frames in
cycles with the tables they hold, for the young collection to free.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_builds = 0  # builds running now, on any thread
_was_enabled = False  # whether the collector ran before the first of them


def _before_fork() -> None:
    """A fork waits for a build's start or end under way on another thread: a child forked
    between the count and the collector's switch, or between freezing and unfreezing, would keep
    the collector off, or everything frozen, for good."""
    _lock.acquire()


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    """The child of a fork during a build: no build runs there (and the lock is a new one: the
    copy was held by the fork)."""
    global _builds, _lock
    _lock = threading.Lock()
    if _builds:
        _builds = 0
        if _was_enabled:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The block runs with the cyclic garbage collector off; nested and concurrent blocks
    restore it when the last ends, and only if it was on before the first began."""
    global _builds, _was_enabled
    with _lock:
        if _builds == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _builds += 1
    built = False
    try:
        yield
        built = True
    finally:
        with _lock:
            _builds -= 1
            if _builds == 0 and _was_enabled:
                if built and gc.get_freeze_count() == 0:
                    gc.freeze()  # into the permanent generation, then all to the oldest
                    gc.unfreeze()
                gc.enable()
