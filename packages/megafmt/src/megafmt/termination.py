"""SIGTERM as an interrupt: a command stopped by a scheduler's time limit or ``kill`` cleans up
as Ctrl-C does.

Python's default for SIGTERM ends the process where it stands, so no ``finally`` runs: the
``*.partial`` files of a run's outputs stayed until the next run of the same output. While
:func:`terminated_as_interrupted` is in force, SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread instead, and every path that removes what an
interrupted run wrote applies.

A process forked meanwhile (a pool's worker) starts with the default: its pool stops it with
SIGTERM at any point of its start. SIGTERM is blocked in the forking thread across the fork,
and the child sets the default before it unblocks it: a child born with the handler lost a
SIGTERM sent before Python's after-fork reset, and lived on, holding its pool.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_TERM = {signal.SIGTERM}
#: whether the fork under way (in this thread) blocked SIGTERM
_forking = threading.local()


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM while a command ran."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def _before_fork() -> None:
    _forking.blocked = signal.getsignal(signal.SIGTERM) is _raise_terminated
    if _forking.blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, _TERM)


def _after_fork_in_parent() -> None:
    if getattr(_forking, "blocked", False):
        _forking.blocked = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _TERM)


def _after_fork_in_child() -> None:
    if getattr(_forking, "blocked", False):
        _forking.blocked = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forking thread is the child's main
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _TERM)


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread within this block. Left as it is
    off the main thread (no handler can be set there) or where a handler of the program's own
    is set; a handler set within the block stays."""
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
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, previous)
