"""A bound on how many ``.bin`` readers a process keeps open at once.

A blend of a thousand corpora opens a thousand datasets. Each one registers its reader here
when it opens it; past ``capacity`` (the ``MEGAFMT_MAX_OPEN_BIN`` environment variable, default
512) the pool releases the reader of a dataset not read from recently (a CLOCK sweep: every
read marks its dataset, the sweep spares marked datasets once), and that dataset reopens its
reader on its next read. Arrays already handed out stay valid.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Protocol

DEFAULT_CAPACITY = 512


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
        self._open: deque[weakref.ref] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._forget_dead()
            return len(self._open)

    def _forget_dead(self) -> None:
        alive = [ref for ref in self._open if ref() is not None]
        self._open = deque(alive)

    def opened(self, dataset: Releasable) -> None:
        """Note that ``dataset`` opened its reader, releasing others beyond the capacity."""
        with self._lock:
            self._open.append(weakref.ref(dataset))
            if len(self._open) > self.capacity:
                self._forget_dead()
            while len(self._open) > self.capacity:
                candidate = self._open.popleft()()
                if candidate is None or candidate is dataset:
                    if candidate is dataset:
                        self._open.append(weakref.ref(dataset))
                    continue
                if candidate.recently_read:  # a second chance
                    candidate.recently_read = False
                    self._open.append(weakref.ref(candidate))
                    continue
                candidate.release_reader()


POOL = ReaderPool(int(os.environ.get("MEGAFMT_MAX_OPEN_BIN", DEFAULT_CAPACITY)))
