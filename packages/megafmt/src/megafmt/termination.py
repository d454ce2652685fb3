"""SIGTERM as an interrupt: a command stopped by a scheduler's time limit or ``kill`` cleans up
as Ctrl-C does.

Python's default for SIGTERM ends the process where it stands, so no ``finally`` runs: the
``*.partial`` files of a run's outputs stayed until the next run of the same output. While
:func:`terminated_as_interrupted` is in force, SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread instead, and every path that removes what an
interrupted run wrote applies.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM while a command ran."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread within this block. Left as it is
    off the main thread (no handler can be set there) or where a handler of the program's own
    is set. Worker processes forked meanwhile take back the default
    (:func:`default_termination`): their pool stops them with SIGTERM."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    ):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def default_termination() -> None:
    """SIGTERM ends this process again (a forked worker inherits its parent's handler, and a
    worker that raised instead of ending would keep its pool waiting)."""
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
