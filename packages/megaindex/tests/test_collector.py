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


class Node:
    """An object the collector tracks, which can hold a cycle."""

    def __init__(self):
        self.other = None


def _in_generation(obj, generation: int) -> bool:
    return any(tracked is obj for tracked in gc.get_objects(generation))


def test_the_objects_a_build_made_move_to_the_oldest_generation_unwalked(collector_on):
    import weakref

    with collector_paused():
        kept = [Node() for _ in range(5000)]  # what a build hands back: it lives on
        cycle = Node()
        cycle.other = Node()
        cycle.other.other = cycle
        gone = weakref.ref(cycle)
        del cycle
        young_in_build = gc.get_count()[0]
    assert young_in_build >= 5000
    # unwalked: a young collection would have left them in generation 1
    assert _in_generation(kept[0], 2) and not _in_generation(kept[0], 1)
    assert gone() is not None  # cyclic garbage waits for a full collection ...
    gc.collect()
    assert gone() is None  # ... which frees it


def test_objects_frozen_before_a_build_stay_frozen(collector_on):
    gc.freeze()  # a program that froze its objects before forking workers
    frozen = gc.get_freeze_count()
    try:
        with collector_paused():
            made = Node()
        assert gc.get_freeze_count() == frozen
        assert gc.isenabled()
        assert not _in_generation(made, 2)  # left where the collector put it
    finally:
        gc.unfreeze()


def test_what_a_failed_build_made_is_left_to_the_young_collection(collector_on):
    with pytest.raises(RuntimeError), collector_paused():
        made = Node()
        raise RuntimeError("the build failed")
    assert not _in_generation(made, 2)
