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

Python runs a handler in the main thread at its next check, and a system call it makes
returns early only for a signal delivered to it: a SIGTERM that came just before the main
thread blocked in a read (of a pipe whose writer waits), or that another thread took (the main
thread blocking it across a fork), left it blocked, the handler never run. A watcher thread,
woken by Python's wakeup file descriptor, sends SIGTERM to the main thread itself until the
handler has run; the handler raises once, and later SIGTERMs find it terminating already.
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


#: how often the watcher sends SIGTERM to the main thread until its handler has run
NUDGE_SECONDS = 0.2
#: the watcher thread's name
WATCHER = "megafmt-sigterm-watch"
#: set once the handler raised: the process is terminating
_terminating = threading.Event()


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM while a command ran."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    if _terminating.is_set():  # a repeat (or the watcher's): the first is being handled
        return
    _terminating.set()
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def _watch(wakeups: int, stop: threading.Event) -> None:
    """Read the signals Python's handler notes on ``wakeups``; after a SIGTERM, send it to the
    main thread until its handler has run (or the block ends)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _TERM)  # the process's SIGTERMs go elsewhere
    main = threading.main_thread().ident
    while not stop.is_set():
        try:
            noted = os.read(wakeups, 64)
        except BlockingIOError:
            stop.wait(NUDGE_SECONDS)
            continue
        except OSError:  # closed: the block ended
            return
        if signal.SIGTERM not in noted:
            continue
        while not stop.wait(NUDGE_SECONDS) and not _terminating.is_set():
            signal.pthread_kill(main, signal.SIGTERM)


def watcher_threads() -> int:
    """How many threads of this module run (the watcher's: 0 or 1). A preprocess forks its
    workers beside it: it holds nothing a child needs, and a child has none of it."""
    return sum(thread.name == WATCHER for thread in threading.enumerate())


@contextmanager
def _nudged_main_thread() -> Iterator[None]:
    """A watcher (:func:`_watch`) for the block: the main thread is sure to run its SIGTERM
    handler, even blocked in a system call when the signal came."""
    wakeups, noted = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = signal.set_wakeup_fd(noted, warn_on_full_buffer=False)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(wakeups, stop), name=WATCHER, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        signal.set_wakeup_fd(previous)
        os.close(noted)
        os.close(wakeups)


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
        signal.set_wakeup_fd(-1)  # the parent's watcher reads it, not the child's
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
    _terminating.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with _nudged_main_thread():
            yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, previous)
