"""SIGTERM as an interrupt while a ``mega`` command runs (megafmt.termination)."""

import os
import signal
import threading

import pytest

from megafmt.termination import Terminated, terminated_as_interrupted


def test_sigterm_raises_terminated_within_the_block_and_the_default_comes_back():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(Terminated, match="stopped by SIGTERM"), terminated_as_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(5)  # the handler raises at the next bytecode, not 5 s later
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C cleanup applies


def forked_and_stopped() -> int:
    """Fork a child that waits to be stopped, send it SIGTERM at once (before its after-fork
    reset, most likely); its exit status."""
    child = os.fork()
    if child == 0:
        threading.Event().wait(30)
        os._exit(0)
    os.kill(child, signal.SIGTERM)
    return os.waitpid(child, 0)[1]


@pytest.mark.parametrize("where", ["main thread", "another thread"])
def test_a_child_forked_within_the_block_is_ended_by_sigterm_as_by_the_default(where):
    """A pool's worker (forked from the main thread, or a pool's own thread) is stopped by
    its pool with SIGTERM at any point of its start: one born with the handler lost a SIGTERM
    sent before Python's after-fork reset and lived on (the pool waited for it forever)."""
    statuses = []
    with terminated_as_interrupted():
        if where == "main thread":
            statuses.append(forked_and_stopped())
        else:
            thread = threading.Thread(target=lambda: statuses.append(forked_and_stopped()))
            thread.start()
            thread.join()
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the parent keeps it
    assert os.WIFSIGNALED(statuses[0]) and os.WTERMSIG(statuses[0]) == signal.SIGTERM


def test_a_handler_of_the_program_s_own_is_left_in_place():
    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with terminated_as_interrupted():
            assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:  # one set within the block (by a command) stays, across a fork and after the block
        with terminated_as_interrupted():
            signal.signal(signal.SIGTERM, own)
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_nothing_changes():
    states = []

    def elsewhere():
        with terminated_as_interrupted():
            states.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert states == [signal.SIG_DFL]


SIGTERM_TAKEN_BY_ANOTHER_THREAD = """
import os, signal, threading, time
from megafmt.termination import Terminated, terminated_as_interrupted

def take_it():  # a thread other than the main one takes the process's SIGTERM
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

readable, _ = os.pipe()
try:
    with terminated_as_interrupted():
        threading.Thread(target=take_it, daemon=True).start()
        os.read(readable, 1)  # blocked: nothing is ever written (a pipe whose writer waits)
except Terminated:
    print("terminated")
"""


def test_a_sigterm_another_thread_takes_still_ends_a_main_thread_blocked_in_a_read():
    # Python runs the handler in the main thread, whose read returns early only for a signal
    # delivered to it: without the watcher's nudge it stays blocked for good
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_TAKEN_BY_ANOTHER_THREAD],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == ["terminated"], done.stderr
