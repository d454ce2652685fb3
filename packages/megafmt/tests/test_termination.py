"""SIGTERM as an interrupt while a ``mega`` command runs (megafmt.termination)."""

import os
import signal
import threading

import pytest

from megafmt.termination import Terminated, default_termination, terminated_as_interrupted


def test_sigterm_raises_terminated_within_the_block_and_the_default_comes_back():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(Terminated, match="stopped by SIGTERM"), terminated_as_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(5)  # the handler raises at the next bytecode, not 5 s later
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C cleanup applies


def test_a_handler_of_the_program_s_own_is_left_in_place():
    seen = []

    def own(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with terminated_as_interrupted():
            assert signal.getsignal(signal.SIGTERM) is own
            default_termination()  # a worker's reset leaves another handler alone too
            assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_nothing_changes_and_a_worker_takes_back_the_default():
    states = []

    def elsewhere():
        with terminated_as_interrupted():
            states.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert states == [signal.SIG_DFL]
    with terminated_as_interrupted():
        default_termination()  # as a forked worker's initializer does
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
