"""A blend's two tables drawn by the extension on a thread of their own, with progress.

The extension releases the GIL while it draws, so the draw runs beside the build of the blend's
parts (:func:`megaindex.blended_dataset.blend_in_advance`); a blend of tens of millions of
samples over thousands of corpora takes tens of seconds to draw. The extension fills the
tables in sample order, so the samples drawn so far are those before the first entry of
``dataset_index`` still at its initial -1 (no dataset's id): a wait for the draw that lasts
over :data:`PROGRESS_SECONDS` reports them, with a rate and an estimate of the time left, every
:data:`PROGRESS_SECONDS`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy

from megafmt.progress import Progress

#: how long a wait for a draw lasts before it reports progress, and how often it does then
PROGRESS_SECONDS = 5.0
#: ``dataset_index`` where no sample was drawn yet
UNDRAWN = -1

Fill = Callable[[numpy.ndarray, numpy.ndarray], None]


class BlendDraw:
    """``fill(dataset_index, dataset_sample_index)`` of ``size`` samples, started at once on
    a thread of its own (named ``thread``); ``what`` names the blend in the progress line."""

    def __init__(
        self, fill: Fill, size: int, what: str, thread: str = "megaindex-blending"
    ) -> None:
        self.dataset_index = numpy.full(size, UNDRAWN, dtype=numpy.int16)
        self.dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
        self.what = what
        self._done: Future = Future()

        def run() -> None:
            try:
                fill(self.dataset_index, self.dataset_sample_index)
            except BaseException as error:  # raised by the wait
                self._done.set_exception(error)
            else:
                self._done.set_result(None)

        # a daemon: a draw no blend takes (a part failed, the blend was cached) does not hold
        # the interpreter's exit
        threading.Thread(target=run, name=thread, daemon=True).start()

    def wait(self) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The two tables once drawn (the fill's error raised), reporting progress every
        :data:`PROGRESS_SECONDS` while the draw goes on (nothing for a short one)."""
        first = self.drawn()  # a draw made in advance is under way: its rate is counted from here
        left = len(self.dataset_index) - first
        progress = Progress(
            f"blending indices of {self.what}: the {left:,} samples after the first {first:,}",
            total=left,
            unit="samples",
            log_interval=PROGRESS_SECONDS,
        )
        drawn_all = False
        try:
            while not drawn_all:
                try:
                    self._done.result(timeout=PROGRESS_SECONDS)
                    drawn_all = True
                except FutureTimeout:
                    progress.update(self.drawn() - first - progress.done)
        finally:
            if drawn_all:
                progress.update(left - progress.done)
            long = drawn_all and progress.elapsed >= PROGRESS_SECONDS
            progress.close(None if long else "")
        return self.dataset_index, self.dataset_sample_index

    def when_ended(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the draw has ended (at once if it has), drawn or failed:
        until then its thread still writes the tables."""
        self._done.add_done_callback(lambda done: callback())

    def drawn(self) -> int:
        """Samples drawn so far (the first that is not, found by bisection)."""
        low, high = 0, len(self.dataset_index)
        while low < high:
            middle = (low + high) // 2
            if self.dataset_index[middle] != UNDRAWN:
                low = middle + 1
            else:
                high = middle
        return low
