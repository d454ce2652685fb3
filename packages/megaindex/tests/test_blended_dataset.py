import os
from collections import OrderedDict

import numpy
import pytest

from megafmt.testing import write_corpus
from megaindex import (
    BlendedDataset,
    BlendedMegatronDatasetBuilder,
    ConfigError,
    GPTDataset,
    IndexBuildError,
    MegatronDataset,
    Split,
)


class Tiny(MegatronDataset):
    """A stand-in mid-level dataset of ``size`` samples."""

    def __init__(self, name, size):
        self.name, self.size, self.index_split = name, size, Split.train
        self.dataset_path = name
        self.unique_identifiers = OrderedDict(name=name)

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"sample": (self.name, int(idx))}


def test_samples_carry_their_dataset_id(make_config):
    blend = BlendedDataset([Tiny("a", 10), Tiny("b", 10)], [1.0, 3.0], 8, make_config())
    # greedy by the lag of each count behind weight * max(i, 1), ties to the first dataset:
    # worked by hand for weights 1/4 and 3/4 (step 4 is a tie, 0 - 0 against 3 - 3)
    assert blend.dataset_index.tolist() == [1, 0, 1, 1, 0, 1, 1, 1]
    assert blend[1] == {"dataset_id": 0, "sample": ("a", 0)}
    assert blend[7] == {"dataset_id": 1, "sample": ("b", 5)}
    assert blend.index_source.kind == "built"


def test_exhaustive_blend_uses_every_sample(make_config):
    blend = BlendedDataset([Tiny("a", 2), Tiny("b", 3)], [2, 3], None, make_config())
    assert len(blend) == 5
    assert sorted(
        zip(blend.dataset_index.tolist(), blend.dataset_sample_index.tolist(), strict=False)
    ) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def test_blended_cache_is_reused_and_checked(make_config):
    config = make_config()
    datasets = [Tiny("a", 100), Tiny("b", 100)]
    first = BlendedDataset(datasets, [0.5, 0.5], 50, config)
    again = BlendedDataset(datasets, [0.5, 0.5], 50, config)
    assert (first.index_source.kind, again.index_source.kind) == ("built", "cache")
    numpy.testing.assert_array_equal(first.dataset_index, again.dataset_index)
    path = again._cache_entry().table_path("dataset_index")
    numpy.save(path, numpy.zeros(49, dtype=numpy.int16))
    with pytest.warns(
        UserWarning,
        match=r"dataset_index.npy: a int16 array of shape \(49,\), "
        r"expected int16 of shape \(50,\)",
    ):
        rebuilt = BlendedDataset(datasets, [0.5, 0.5], 50, config)
    assert rebuilt.index_source.kind == "built"


def test_a_built_blend_reads_its_tables_after_another_process_saved_the_same_over_them(
    make_config,
):
    datasets = [Tiny("a", 100), Tiny("b", 100)]
    built = BlendedDataset(datasets, [0.5, 0.5], 50, make_config())
    assert built.index_source.kind == "built"  # its tables are mapped when first read
    expected = BlendedDataset(datasets, [0.5, 0.5], 50, make_config(path_to_cache=None))
    for table in ("dataset_index", "dataset_sample_index"):
        path = built._cache_entry().table_path(table)
        with open(path, "rb") as stream:
            data = stream.read()
        with open(path + ".new", "wb") as stream:
            stream.write(data)  # another file with the same tables: a second save of them
        os.replace(path + ".new", path)
    numpy.testing.assert_array_equal(built.dataset_index, expected.dataset_index)
    numpy.testing.assert_array_equal(built.dataset_sample_index, expected.dataset_sample_index)
    assert [built[i]["sample"] for i in range(50)] == [expected[i]["sample"] for i in range(50)]


def test_oversampling_names_the_dataset_and_its_expected_size(make_config):
    # weights 1/4 and 3/4 of 40 samples give dataset "b" a share of 30: it holds only 28
    with pytest.raises(
        IndexBuildError,
        match=r"the train blend draws 30 samples from dataset 1 "
        r"\(b\), 2 more than the 28 it holds; its share of the blend is 30, and "
        r"with mid_level_dataset_surplus=0.005 it should hold at least 31",
    ):
        BlendedDataset([Tiny("a", 100), Tiny("b", 28)], [1.0, 3.0], 40, make_config())


@pytest.mark.parametrize(
    "datasets,weights,size,message",
    [
        ([Tiny("a", 1)], [1.0, 2.0], 5, "1 datasets but 2 weights"),
        ([Tiny("a", 1), Tiny("b", 1)], [1.0, 0.0], 5, "weights must be positive"),
        ([Tiny("a", 1), Tiny("b", 1)], [1, 2.0], 5, "must all be of one type"),
        ([Tiny("a", 1), Tiny("b", 1)], [1.5, 2.0], None, "must be whole"),
    ],
)
def test_invalid_blends(make_config, datasets, weights, size, message):
    with pytest.raises(ConfigError, match=message):
        BlendedDataset(datasets, weights, size, make_config())


def test_builder_blends_several_prefixes(make_config, corpus, tmp_path):
    other = write_corpus(str(tmp_path / "other"), documents=100, seed=3)
    config = make_config(blend=([corpus, other], [0.3, 0.7]), split="90,10,0")
    train, _valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [500, 40, 0], lambda: True, config
    ).build()
    assert isinstance(train, BlendedDataset) and len(train) == 500
    shares = numpy.bincount(train.dataset_index) / len(train)
    assert shares.tolist() == pytest.approx([0.3, 0.7], abs=0.002)
    assert test is None
    assert train[0]["dataset_id"] in (0, 1)


def test_builder_names_missing_prefixes(make_config, corpus, tmp_path):
    config = make_config(blend=([corpus, str(tmp_path / "typo")], None), split="1")
    with pytest.raises(ConfigError, match="no .bin/.idx corpus at: .*typo"):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, 0, 0], lambda: True, config).build()


def test_a_blend_of_many_corpora_keeps_few_files_open(make_config, tmp_path, monkeypatch):
    import os

    from megafmt import dataset as megafmt_dataset
    from megafmt.readers.pool import ReaderPool

    prefixes = [write_corpus(str(tmp_path / f"part{i}"), documents=20, seed=i) for i in range(60)]
    config = make_config(blend=(prefixes, None), split="1", mmap_bin_files=False)
    monkeypatch.setattr(megafmt_dataset, "POOL", ReaderPool(8))
    before = len(os.listdir("/proc/self/fd"))
    blend = BlendedMegatronDatasetBuilder(GPTDataset, [300, 0, 0], lambda: True, config).build()[0]
    # every source is read, each through its own (file) reader, 8 of them open at most
    assert sorted({int(blend.dataset_index[i]) for i in range(len(blend))}) == list(range(60))
    samples = [blend[i]["tokens"] for i in range(len(blend))]
    assert len(os.listdir("/proc/self/fd")) - before <= 8
    assert sum(d.dataset._bin_reader is not None for d in blend.datasets) <= 8
    again = BlendedMegatronDatasetBuilder(GPTDataset, [300, 0, 0], lambda: True, config).build()[0]
    assert all(again[i]["tokens"].equal(samples[i]) for i in range(0, len(blend), 11))


def test_whole_float_weights_count_samples_without_a_size(make_config):
    blend = BlendedDataset([Tiny("a", 2), Tiny("b", 3)], [2.0, 3.0], None, make_config())
    assert numpy.bincount(blend.dataset_index).tolist() == [2, 3]
