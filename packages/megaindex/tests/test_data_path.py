"""The data path's declared Protocols (megafmt.protocols), as megaindex's datasets implement them:
every class declares every capability, blends delegate to their parts, and each way of reading
a window gives the same samples."""

import pickle

import numpy
import pytest
import torch
from torch.utils.data import default_collate

from megafmt import IndexedDataset
from megafmt.protocols import (
    BatchAssembly,
    CollatedBatch,
    MappedTokenSource,
    PlannedBatch,
    PlannedPrefetch,
    PrefetchingSource,
    SpanSource,
    SplitMember,
    StoredTokenSource,
    TokenSource,
    split_name,
)
from megafmt.testing import write_corpus
from megaindex import (
    BlendedDataset,
    BlendedMegatronDatasetBuilder,
    GPTDataset,
    MockGPTDataset,
    Split,
)
from megaindex.windows import MappedWindowReader, SpanWindowReader, WindowReader

FLAGS = [
    {},
    {"reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True},
    {"create_attention_mask": False, "add_extra_token_to_sequence": False},
]


def build(cls, config, sizes=(200, 20, 0)):
    return BlendedMegatronDatasetBuilder(cls, list(sizes), lambda: True, config).build()


def blend_of_three(make_config, corpus, tmp_path, **flags):
    others = [write_corpus(str(tmp_path / f"part{i}"), documents=80, seed=i) for i in (1, 2)]
    config = make_config(blend=([corpus, *others], [0.5, 0.3, 0.2]), split="90,10,0", **flags)
    return build(GPTDataset, config)[0]


def assert_batches_equal(batch, expected):
    assert list(batch) == list(expected)
    for key, value in expected.items():
        assert batch[key].dtype == value.dtype, key
        assert torch.equal(batch[key], value), key


def test_every_dataset_declares_every_capability(make_config, corpus, tmp_path):
    gpt = build(GPTDataset, make_config())[0]
    mock = build(MockGPTDataset, make_config(blend=None, split="99,1,0"))[0]
    blend = blend_of_three(make_config, corpus, tmp_path)
    for dataset in (gpt, mock, blend):
        assert isinstance(dataset, BatchAssembly)
        assert isinstance(dataset, PlannedPrefetch)
        assert isinstance(dataset, SplitMember)
        assert split_name(dataset) == "train"
        assert not dataset.prefetches_samples  # local data: nothing to fetch ahead
    source = IndexedDataset(corpus)
    for capability in (TokenSource, SpanSource, MappedTokenSource, PrefetchingSource):
        assert isinstance(source, capability)
    assert isinstance(source, StoredTokenSource) and not source.prefetches
    assert isinstance(gpt.windows, MappedWindowReader)


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "file-reader"])
@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "resets", "no-mask-no-extra"])
def test_a_blend_collates_its_batch_in_one_pass(make_config, corpus, tmp_path, flags, mapped):
    blend = blend_of_three(make_config, corpus, tmp_path, mmap_bin_files=mapped, **flags)
    # mapped parts: the whole batch in one native call; else each part reads its rows
    assert (blend.blend_gatherer().native() is not None) == mapped
    ids = blend.dataset_index.tolist()
    indices = [ids.index(2), 5, 17, ids.index(1), len(blend) - 1, 3]  # rows of every part
    batch = blend.__getitems__(PlannedBatch(indices, upcoming=[7, 8]))
    assert isinstance(batch, CollatedBatch) and len(batch) == len(indices)
    expected = default_collate([blend[i] for i in indices])
    assert_batches_equal(batch.collated, expected)
    assert_batches_equal(default_collate(list(batch)), expected)  # any collate_fn takes it


class Recording(IndexedDataset):
    """A local corpus that says it fetches ahead, and records what it is told."""

    prefetched: list

    @property
    def prefetches(self):
        return True

    def prefetch(self, reads):
        self.prefetched.append(list(reads))


def test_a_blend_tells_each_part_its_own_samples(make_config, corpus, tmp_path):
    config = make_config(split="100,0,0")
    prefixes = [corpus, write_corpus(str(tmp_path / "other"), documents=200, seed=4)]
    parts = []
    for prefix in prefixes:
        source = Recording(prefix)
        source.prefetched = []
        parts.append(
            GPTDataset(
                source,
                prefix,
                numpy.arange(len(source), dtype=numpy.int32),
                60,
                Split.train,
                config,
            )
        )
    blend = BlendedDataset(parts, [0.5, 0.5], 100, config)
    assert blend.prefetches_samples
    batch = blend.__getitems__(PlannedBatch([0, 1, 2], upcoming=[3, 4]))
    for number, part in enumerate(parts):
        told = part.dataset.prefetched
        assert len(told) == 1  # one announcement per batch
        samples = [
            int(s)
            for i, s in zip(blend.dataset_index[:5], blend.dataset_sample_index[:5], strict=True)
            if i == number
        ]
        assert told[0] == part.windows.reads(samples)
    assert torch.equal(batch.collated["tokens"][2], blend[2]["tokens"])


class GetOnly:
    """A low-level dataset with megatron-core's minimum: sequence_lengths and get()."""

    def __init__(self, dataset):
        self.inner = dataset
        self.sequence_lengths = dataset.sequence_lengths

    def get(self, idx, offset=0, length=None):
        return self.inner.get(idx, offset=offset, length=length)


@pytest.mark.parametrize("flags", FLAGS, ids=["plain", "resets", "no-mask-no-extra"])
def test_every_window_reader_gives_the_same_samples(make_config, corpus, flags):
    config = make_config(path_to_cache=None, **flags)
    indices = numpy.arange(270, dtype=numpy.int32)
    sources = [
        IndexedDataset(corpus),  # mapped: one native call per batch
        IndexedDataset(corpus, mmap=False),  # read_spans
        GetOnly(IndexedDataset(corpus)),  # get() per document
    ]
    datasets = [GPTDataset(s, corpus, indices, 150, Split.train, config) for s in sources]
    readers = [type(d.windows) for d in datasets]
    assert readers == [MappedWindowReader, SpanWindowReader, WindowReader]
    picks = [0, 3, None, len(datasets[0]) - 1]
    expected = datasets[0].__getitems__(picks).collated
    for dataset in datasets:
        assert_batches_equal(dataset.__getitems__(picks).collated, expected)
        assert_batches_equal(default_collate([dataset[i] for i in picks]), expected)


class Reversing(GPTDataset):
    """Rearranges each sample through the declared hook."""

    shapes_samples = True

    def shape_sample(self, idx, text):
        return text[::-1].copy()


def test_the_shaping_hook_is_applied_to_every_sample(make_config):
    config = make_config(path_to_cache=None)
    plain, reversing = build(GPTDataset, config)[0], build(Reversing, config)[0]
    text, _ = plain._query_document_sample_shuffle_indices(4)
    expected = torch.from_numpy(text[::-1].copy())
    assert torch.equal(reversing[4]["tokens"], expected[:-1])
    assert torch.equal(reversing.__getitems__([9, 4]).collated["labels"][1], expected[1:])


class WithImage(MockGPTDataset):
    """Makes its own samples in __getitem__, as megatron-core's MockMultimodalDataset does."""

    def __getitem__(self, idx):
        return {**super().__getitem__(idx), "image": torch.zeros(3)}


def test_a_subclass_making_its_own_samples_is_served_one_by_one(make_config):
    dataset = build(WithImage, make_config(blend=None, split="99,1,0"))[0]
    assert not dataset.assembles_batches
    batch = dataset.__getitems__([1, 2])
    assert [sorted(sample) for sample in batch] == [sorted(dataset[1])] * 2
    assert "image" in default_collate(batch)


def test_a_dataset_travels_to_workers_as_its_files(make_config):
    train = build(GPTDataset, make_config(), sizes=(20000, 0, 0))[0]
    copy = pickle.loads(pickle.dumps(train))
    # the cached tables were not pickled by value
    assert len(pickle.dumps(train)) < train.tables["shuffle_index"].nbytes / 4
    assert_batches_equal(
        copy.__getitems__([1, 2, 3]).collated, train.__getitems__([1, 2, 3]).collated
    )


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "file-reader"])
def test_padding_and_negative_indices_in_batches(make_config, corpus, tmp_path, mapped):
    blend = blend_of_three(make_config, corpus, tmp_path, mmap_bin_files=mapped)
    gpt = blend.datasets[0]
    for dataset in (blend, gpt):
        batch = dataset.__getitems__([3, None, -1]).collated
        # None: sample 0's tokens with no loss; -1: the last sample, as numpy counts
        expected = default_collate([dataset[3], dataset[0], dataset[len(dataset) - 1]])
        expected["loss_mask"][1] = 0.0
        assert_batches_equal(batch, expected)
        assert_batches_equal(
            default_collate([dataset[None]]),
            default_collate([dataset[0]])
            | {"loss_mask": torch.zeros_like(dataset[0]["loss_mask"])[None]},
        )
        with pytest.raises(IndexError, match=f"sample -{len(dataset) + 1} out of range"):
            dataset[-len(dataset) - 1]


def test_relative_prefixes_and_caches_pickle_absolute(make_config, tmp_path, monkeypatch):
    # the same relative names in two folders, different corpora: a copy unpickled in the other
    # folder (a spawn or forkserver worker's working directory) reads its own corpus and tables
    datasets = {}
    for name, seed in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        for part in ("one", "two"):
            write_corpus(part, documents=80, seed=seed + 10 * (part == "two"))
        config = make_config(
            blend=(["one", "two"], [0.6, 0.4]), split="90,10,0", path_to_cache="cache"
        )
        datasets[name] = build(GPTDataset, config)[0]
    indices = list(range(12))
    first = datasets["a"]
    assert isinstance(first, BlendedDataset)
    expected = first.__getitems__(indices).collated
    # built in "a", pickled and unpickled in "b"
    pickled = [pickle.dumps(dataset) for dataset in (first, first.datasets[0])]
    blend, part = (pickle.loads(data) for data in pickled)
    assert_batches_equal(blend.__getitems__(indices).collated, expected)
    assert part.dataset.path_prefix == str(tmp_path / "a" / "one")
    assert torch.equal(part[0]["tokens"], first.datasets[0][0]["tokens"])
    assert not torch.equal(
        datasets["b"].__getitems__(indices).collated["tokens"], expected["tokens"]
    )
