"""PlannedBatchSampler: the same batches, each naming the one its worker reads next."""

import pickle

import torch

from megafmt.protocols import PlannedBatch
from megaload import DataLoaderConfig, build_pretraining_data_loader
from megaload.planned import PlannedBatchSampler


def test_each_batch_carries_the_batch_lookahead_later():
    batches = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    planned = list(PlannedBatchSampler(batches, lookahead=2))
    assert planned == batches  # the same batches, in the same order
    assert [b.upcoming for b in planned] == [[4, 5], [6, 7], [8, 9], [], []]
    again = pickle.loads(pickle.dumps(planned[0]))  # what a DataLoader worker receives
    assert again == [0, 1] and again.upcoming == [4, 5]
    assert isinstance(again, PlannedBatch)


class Recorder:
    """A map-style dataset that records what it was told would come next."""

    def __init__(self, size):
        self.size = size
        self.announced = []

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return torch.tensor([idx])

    def __getitems__(self, indices):
        self.announced.append(indices.upcoming if isinstance(indices, PlannedBatch) else None)
        return [self[i] for i in indices]


class Prefetching(Recorder):
    """``megafmt.protocols.PlannedPrefetch``: it says whether telling it pays."""

    def __init__(self, size, prefetches=True):
        super().__init__(size)
        self.prefetches_samples = prefetches

    def prefetch_samples(self, indices):
        pass


def test_the_loader_plans_only_for_datasets_that_prefetch():
    config = DataLoaderConfig(micro_batch_size=2, num_workers=0)
    dataset = Prefetching(8)
    loader = build_pretraining_data_loader(dataset, 0, config)
    assert [batch.tolist() for batch in loader] == [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [7]]]
    assert dataset.announced == [[2, 3], [4, 5], [6, 7], []]
    state = loader.state_dict()
    assert state["consumed_samples"] == 8  # resume state is the plain sampler's
    assert loader.loader.batch_sampler.batch_sampler is loader.batch_sampler  # state it sets
    for dataset in (Recorder(4), Prefetching(4, prefetches=False)):  # local data: no plan
        plain = build_pretraining_data_loader(dataset, 0, config)
        assert not isinstance(plain.loader.batch_sampler, PlannedBatchSampler)
        assert [batch.tolist() for batch in plain] == [[[0], [1]], [[2], [3]]]
        assert dataset.announced == [None, None]
