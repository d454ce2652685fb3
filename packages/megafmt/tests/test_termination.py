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


def test_a_child_forked_within_the_block_is_ended_by_sigterm_as_by_the_default():
    """A pool's worker inherits the handler: its pool stops it with SIGTERM, at any point of
    its start (one that raised there printed a traceback and lived on)."""
    with terminated_as_interrupted():
        child = os.fork()
        if child == 0:  # the child: waits to be stopped
            threading.Event().wait(30)
            os._exit(0)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_a_handler_of_the_program_s_own_is_left_in_place():
    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with terminated_as_interrupted():
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
