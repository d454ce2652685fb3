"""The iterators Megatron-LM wraps around its loaders: replay of a step, and cycling."""

import pytest

from megaload import (
    DataLoaderConfig,
    NoDataError,
    RerunDataIterator,
    build_pretraining_data_loader,
    cyclic_iter,
)


def test_rerun_iterator_replays_the_last_items():
    iterator = RerunDataIterator(range(10))
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    iterator.rewind()
    assert [next(iterator) for _ in range(4)] == [0, 1, 2, 3]
    iterator.advance()
    iterator.rewind()
    assert next(iterator) == 4


def test_rerun_iterator_replays_a_step_of_any_length_from_its_first_micro_batch():
    iterator = RerunDataIterator(range(1000))
    assert [next(iterator) for _ in range(100)] == list(range(100))
    iterator.advance()
    assert [next(iterator) for _ in range(200)] == list(range(100, 300))  # one long step
    iterator.rewind()
    assert [next(iterator) for _ in range(150)] == list(range(100, 250))  # replay, cut short
    iterator.rewind()  # again: from the step's first micro-batch, then on to new ones
    assert [next(iterator) for _ in range(201)] == list(range(100, 301))


def test_rerun_iterator_keeps_nothing_when_not_saving_and_checkpoints_a_replay():
    quiet = RerunDataIterator(range(100), saving=False)
    assert [next(quiet) for _ in range(50)] == list(range(50))
    assert quiet.state_dict()["saved_microbatches"] == []  # a run without reruns holds nothing
    iterator = RerunDataIterator(range(10))
    assert [next(iterator) for _ in range(4)] == [0, 1, 2, 3]
    iterator.rewind()
    assert next(iterator) == 0
    # Megatron-LM's keys: the step's items, and a replay standing after the first
    state = iterator.state_dict()
    assert state == {"saved_microbatches": [0, 1, 2, 3], "replaying": True, "replay_pos": 1}
    restored = RerunDataIterator(range(4, 10))  # the source continues after what was read
    restored.load_state_dict(state)
    assert [next(restored) for _ in range(5)] == [1, 2, 3, 4, 5]


class Numbers:
    """Sample i is the number i."""

    def __len__(self):
        return 8

    def __getitem__(self, idx):
        return {"tokens": idx}


def test_cyclic_iter_cycles_and_stops_on_a_loader_that_yields_nothing():
    assert [x for x, _ in zip(cyclic_iter([1, 2]), range(5), strict=False)] == [1, 2, 1, 2, 1]
    with pytest.raises(NoDataError, match="a pass over list yielded nothing"):
        next(cyclic_iter([]))
    config = DataLoaderConfig(micro_batch_size=2, num_workers=0)
    consumed = build_pretraining_data_loader(Numbers(), 8, config)  # every sample was read
    with pytest.raises(NoDataError, match="a pass over MegatronDataLoader yielded nothing"):
        next(cyclic_iter(consumed))
    # a loader that ends: its first pass is read whole, then the empty second pass stops it
    stream = cyclic_iter(build_pretraining_data_loader(Numbers(), 4, config))
    assert [batch["tokens"].tolist() for batch in (next(stream), next(stream))] == [
        [4, 5],
        [6, 7],
    ]
    with pytest.raises(NoDataError):
        next(stream)
