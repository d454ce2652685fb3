"""Python's cyclic garbage collector, paused while datasets are built.

A blend of thousands of corpora makes hundreds of thousands of small objects that all live on
(datasets, their tables and settings), in a process that already holds as many (torch's
modules): each time the collector's thresholds are reached it walks them all, and finds nothing
to free. That walking was a third of a 2,400-corpus blend's cache hit. While a build runs the
collector is off; once the last concurrent build ends it is back as it was (reference counting
frees everything that holds no cycle meanwhile).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_builds = 0  # builds running now, on any thread
_was_enabled = False  # whether the collector ran before the first of them


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
    try:
        yield
    finally:
        with _lock:
            _builds -= 1
            if _builds == 0 and _was_enabled:
                gc.enable()
