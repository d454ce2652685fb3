"""Progress of one long table build, reported from a thread of its own.

A large corpus's tables (hundreds of millions of document-index entries, or many epochs) take
tens of seconds, mostly in calls of the extension that report nothing until they return. The
build advances a count (:meth:`BuildProgress.reach`, a plain store); a thread redraws the
progress line from it every :data:`PROGRESS_SECONDS`, with a rate and an estimate of the time
left, and a build that lasted that long ends with a summary. A short build prints nothing, on
a terminal too (the progress, whose tqdm bar draws when it is made, is made at the first
redraw).
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from megafmt.progress import Progress

#: how long a build runs before it reports progress, and how often it does then
PROGRESS_SECONDS = 5.0


class BuildProgress:
    """``total`` units (``unit``) of the build ``what``, counted by :meth:`reach`."""

    def __init__(self, what: str, total: int, unit: str) -> None:
        self._what, self._total, self._unit = what, total, unit
        self._started = time.perf_counter()
        self._progress: Progress | None = None  # made at the first redraw
        self._reached = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._redraw, name="megaindex-build-progress", daemon=True
        )
        self._thread.start()

    def reach(self, count: int) -> None:
        """The build has done ``count`` units in all."""
        self._reached = count

    def _redraw(self) -> None:
        while not self._stop.wait(PROGRESS_SECONDS):
            if self._progress is None:
                self._progress = Progress(
                    self._what,
                    total=self._total,
                    unit=self._unit,
                    log_interval=PROGRESS_SECONDS,
                    started=self._started,
                )
            self._progress.update(self._reached - self._progress.done)

    def close(self, finished: bool) -> None:
        """Stop redrawing; a build that reported ends with a summary (when ``finished``; an
        error ends it without one)."""
        self._stop.set()
        self._thread.join()
        if self._progress is None:  # short: nothing was drawn
            return
        if finished:
            self._progress.update(self._reached - self._progress.done)
        self._progress.close(None if finished else "")

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(exc_type is None)
