"""SIGTERM as an interrupt: a command stopped by a scheduler's time limit or ``kill`` cleans up
as Ctrl-C does.

Python's default for SIGTERM ends the process where it stands, so no ``finally`` runs: the
``*.partial`` files of a run's outputs stayed until the next run of the same output. While
:func:`terminated_as_interrupted` is in force, SIGTERM raises :class:`Terminated` (a
``KeyboardInterrupt``) in the main thread instead, and every path that removes what an
interrupted run wrote applies. A process forked meanwhile (a pool's worker) starts with the
default: its pool stops it with SIGTERM, at any point of its start (a child born with the
handler loses a SIGTERM that arrives before Python's after-fork reset, and lives on).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

#: the process that set the handler (None: not set)
_owner: int | None = None


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM while a command ran."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _owner:  # a forked child: ended as by the default
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def _default_while_forking() -> None:
    """Before a fork of the process that set the handler: the default, for the child."""
    if os.getpid() == _owner:
        with suppress(ValueError):  # a fork from another thread: the handler's check then
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _handler_again() -> None:
    """In that process, after the fork: the handler again."""
    if os.getpid() == _owner:
        with suppress(ValueError):
            signal.signal(signal.SIGTERM, _raise_terminated)


os.register_at_fork(before=_default_while_forking, after_in_parent=_handler_again)


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread within this block. Left as it is
    off the main thread (no handler can be set there) or where a handler of the program's own
    is set."""
    global _owner
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    ):
        yield
        return
    _owner = os.getpid()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _owner = None
