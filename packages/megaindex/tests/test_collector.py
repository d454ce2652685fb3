import gc
import os
import threading

import pytest

from megaindex import BlendedMegatronDatasetBuilder, ConfigError, GPTDataset
from megaindex.collector import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


class RecordingDataset(GPTDataset):
    """Notes whether the collector ran while it was built."""

    collector_states: list[bool] = []

    def __init__(self, *args, **kwargs):
        RecordingDataset.collector_states.append(gc.isenabled())
        super().__init__(*args, **kwargs)


def test_a_build_runs_with_the_collector_paused_and_restores_it(collector_on, make_config):
    RecordingDataset.collector_states = []
    config = make_config()
    BlendedMegatronDatasetBuilder(RecordingDataset, [100, 10, 5], lambda: True, config).build()
    assert RecordingDataset.collector_states == [False, False, False]
    assert gc.isenabled()


def test_a_failed_build_restores_the_collector(collector_on, make_config):
    with pytest.raises(ConfigError, match="no .bin/.idx corpus"):
        BlendedMegatronDatasetBuilder(
            GPTDataset, [100, 10, 5], lambda: True, make_config(blend=(["/nowhere/x"], None))
        ).build()
    assert gc.isenabled()


def test_nested_and_concurrent_pauses_restore_it_when_the_last_ends(collector_on):
    inner_started, outer_ended = threading.Event(), threading.Event()
    seen = []

    def other_build():
        with collector_paused():
            inner_started.set()
            outer_ended.wait(30)
            seen.append(gc.isenabled())  # the first build ended: still paused for this one

    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
        thread = threading.Thread(target=other_build)
        thread.start()
        assert inner_started.wait(30)
    outer_ended.set()
    thread.join(30)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    was = gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


def test_a_process_forked_during_a_build_has_the_collector_back(collector_on):
    with collector_paused():
        pid = os.fork()
        if pid == 0:  # the child: no build runs here
            with collector_paused():
                paused = not gc.isenabled()
            os._exit(0 if gc.isenabled() and paused else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gc.isenabled()
