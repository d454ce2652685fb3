"""One batch path: a blend groups a batch's rows by part, asks each part for its rows and has
the parts' class merge them in order, whatever that class (GPT, a third party's, SFT: see
tests/test_sft_blend_batches.py for SFT through megaload); the data-path Protocols are told apart
by their member names, and a dataset plugin that claims one only in part is refused."""

from collections import OrderedDict

import pytest
import torch
from torch.utils.data import default_collate

from megafmt import IndexedDataset, PluginError
from megafmt.protocols import BatchAssembly, CollatedBatch, PlannedPrefetch, protocol_members
from megafmt.registry import Registry
from megaindex import BlendedDataset, MegatronDataset, Split
from megaindex.batch_merge import in_row_order, merge_rows
from megaindex.plugins import DATASETS


class Plain(MegatronDataset):
    """A third party's class with only ``__getitem__``: MegatronDataset's batches and merge;
    30 samples."""

    index_split = Split.train

    def __init__(self, name):
        self.dataset_path, self.unique_identifiers = name, OrderedDict(name=name)

    def __len__(self):
        return 30

    def __getitem__(self, idx):
        return {"tokens": torch.full((3,), int(idx)), "loss_mask": torch.ones(3)}


class Ragged(Plain):
    """A third party's class whose rows differ in length: its own batches (padded to the
    longest row with -1) and merge; it records the rows each call asks for."""

    def __init__(self, name):
        super().__init__(name)
        self.asked = []

    def __getitem__(self, idx):
        length = int(idx) % 3 + 1
        return {"tokens": torch.arange(length), "loss_mask": torch.ones(length)}

    def __getitems__(self, indices):
        self.asked.append(list(indices))
        return CollatedBatch(_padded([self[idx] for idx in indices]))

    def merge_batches(self, batches, rows):
        return CollatedBatch(_padded(in_row_order(batches, rows)))


def _padded(samples):
    longest = max(len(sample["tokens"]) for sample in samples)
    return {
        key: torch.stack(
            [torch.nn.functional.pad(s[key], (0, longest - len(s[key])), value=-1) for s in samples]
        )
        for key in ("tokens", "loss_mask")
    }


def blend_of(cls, make_config):
    return BlendedDataset([cls("a"), cls("b")], [0.6, 0.4], 40, make_config())


def test_a_blend_of_a_third_party_class_batches_as_its_samples_one_by_one(make_config):
    blend = blend_of(Plain, make_config)
    indices = [0, 7, None, 3, 12, 39]
    batch = blend.__getitems__(indices)
    samples = [blend[idx] for idx in indices]
    expected = default_collate(samples)
    assert list(batch.collated) == list(expected)
    for key, value in expected.items():
        assert torch.equal(batch.collated[key], torch.as_tensor(value)), key
    assert batch.collated["loss_mask"][2].sum() == 0  # the padding row has no loss


def test_a_blend_asks_each_part_for_its_rows_and_merges_with_the_parts_class(make_config):
    blend = blend_of(Ragged, make_config)
    indices = list(range(10))
    batch = blend.__getitems__(indices).collated
    ids = blend.dataset_index[indices].tolist()
    samples = blend.dataset_sample_index[indices].tolist()
    for number, part in enumerate(blend.datasets):  # one call per part, its rows in order
        assert part.asked == [[s for i, s in zip(ids, samples, strict=True) if i == number]]
    expected = _padded([blend[idx] for idx in indices])
    for key in ("tokens", "loss_mask"):
        assert torch.equal(batch[key], expected[key]), key
    assert batch["dataset_id"].tolist() == ids


def test_merge_rows_puts_each_row_in_its_place_and_names_what_does_not_stack():
    first = CollatedBatch({"x": torch.tensor([[1], [2]]), "names": ["a", "b"]})
    second = CollatedBatch({"x": torch.tensor([[3]]), "names": ["c"]})
    merged = merge_rows([first, second], [[2, 0], [1]]).collated
    assert merged["x"].tolist() == [[2], [3], [1]] and merged["names"] == ["b", "c", "a"]
    wide = CollatedBatch({"x": torch.tensor([[3, 4]]), "names": ["c"]})
    with pytest.raises(ValueError, match=r"'x' has shapes \[\(2, 1\), \(1, 2\)\]"):
        merge_rows([first, wide], [[0, 1], [2]])
    with pytest.raises(ValueError, match="batch 1 has 1 rows but 2 are placed"):
        merge_rows([first, second], [[0, 1], [2, 3]])


def test_a_blend_of_a_class_that_is_no_batch_assembly_batches_as_its_samples(make_config):
    """Parts of a class that only makes samples (megatron-core's own dataset classes, say) are
    read one by one, collated and merged row by row, as MegatronDataset's defaults read."""

    class OnlyItems:
        index_split = Split.train

        def __init__(self, name):
            self.unique_identifiers = OrderedDict(name=name)
            self.offset = 100 if name == "b" else 0

        def __len__(self):
            return 50

        def __getitem__(self, idx):
            return {"tokens": torch.arange(3) + idx + self.offset, "loss_mask": torch.ones(3)}

    assert not isinstance(OnlyItems("a"), BatchAssembly)
    blend = BlendedDataset([OnlyItems("a"), OnlyItems("b")], [0.5, 0.5], 20, make_config())
    indices = [0, 5, None, 1, 19]
    batch = blend.__getitems__(indices).collated
    expected = default_collate([blend[idx] for idx in indices])
    assert list(batch) == list(expected)
    for key, value in expected.items():
        assert torch.equal(batch[key], torch.as_tensor(value)), key
    assert set(batch["dataset_id"].tolist()) == {0, 1}
    assert batch["loss_mask"][2].sum() == 0  # the padding row has no loss


def test_protocols_are_told_apart_by_their_member_names(corpus):
    """An IndexedDataset prefetches reads (PrefetchingSource), not samples; a dict subclass
    with a ``__getitems__`` of its own does not pass for a dataset that assembles batches."""
    assert not isinstance(IndexedDataset(corpus), PlannedPrefetch)

    class Lookup(dict):
        def __getitems__(self, keys):
            return [self[key] for key in keys]

    assert not isinstance(Lookup(), BatchAssembly)
    assert isinstance(Plain("a"), BatchAssembly)
    assert protocol_members(BatchAssembly) == ["__getitems__", "merge_batches"]
    assert protocol_members(PlannedPrefetch) == ["prefetch_samples", "prefetches_samples"]


def test_a_dataset_plugin_claiming_a_protocol_in_part_is_refused_at_registration():
    registry = Registry("test.datasets", "test dataset", claimable=(BatchAssembly, PlannedPrefetch))

    class HalfPrefetching(Plain):
        def prefetch_samples(self, indices):
            pass

    with pytest.raises(PluginError) as raised:
        registry.register("half", HalfPrefetching)
    assert str(raised.value).startswith("test dataset 'half' (<class ") and str(
        raised.value
    ).endswith(
        "has prefetch_samples of megafmt.protocols.PlannedPrefetch but lacks "
        "prefetches_samples: implement all of prefetch_samples, prefetches_samples, or none"
    )

    class NoMerge:
        def __getitems__(self, indices):
            return []

    with pytest.raises(PluginError, match="has __getitems__ of .*BatchAssembly but lacks merge"):
        registry.register("no-merge", NoMerge)
    registry.register("plain", Plain)  # all of BatchAssembly, none of PlannedPrefetch
    for name in ("gpt", "mock", "fim", "sft"):  # the shipped classes pass the same check
        assert isinstance(DATASETS.get(name), type)
