"""Blends against megatron-core: parsing, every mid-level and blended table, the blended cache
shared both ways, and samples with their dataset_id."""

import os

import numpy
import pytest
import torch
from blendtesting import deciding_ties, dyadic_weights
from megatron.core.datasets.blended_dataset import BlendedDataset as MegatronBlendedDataset
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder as MegatronBuilder,
)
from megatron.core.datasets.blended_megatron_dataset_config import (
    parse_and_normalize_split as megatron_parse_split,
)
from megatron.core.datasets.gpt_dataset import GPTDataset as MegatronGPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronConfig
from megatron.core.datasets.gpt_dataset import MockGPTDataset as MegatronMockGPTDataset
from megatron.core.datasets.utils import get_blend_from_list as megatron_blend_from_list
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

import megaindex
from megafmt.testing import VOCAB, write_corpus

# megatron-core's BlendedDataset asks torch.distributed for the rank unguarded
pytestmark = pytest.mark.usefixtures("single_process_group")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Five corpora of different sizes and document lengths."""
    directory = tmp_path_factory.mktemp("blend")
    return [
        write_corpus(str(directory / f"corpus{number}"), documents, seed=number, longest=longest)
        for number, (documents, longest) in enumerate(
            [(300, 60), (120, 30), (500, 90), (80, 200), (200, 10)]
        )
    ]


@pytest.mark.parametrize(
    "items",
    [
        ["a"],
        ["30", "a", "70", "b"],
        ["a", "b", "c"],
        ["a", "b"],
        ["0.2", "x", "0.3", "y", "5", "z"],
        [" 1 ", " p "],
    ],
)
def test_blend_lists_parse_alike(items):
    assert megaindex.get_blend_from_list(items) == megatron_blend_from_list(items)


@pytest.mark.parametrize("split", ["99,1,0", "969, 30, 1", "98,2", "1", "2,3,5"])
def test_splits_parse_alike(split):
    assert megaindex.parse_and_normalize_split(split) == megatron_parse_split(split)


def build_both(
    directory, sizes, dataset_classes=(MegatronGPTDataset, megaindex.GPTDataset), **fields
):
    common = dict(
        random_seed=1234,
        sequence_length=24,
        tokenizer=NullTokenizer(VOCAB),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    common.update(fields)
    theirs = MegatronBuilder(
        dataset_classes[0],
        sizes,
        lambda: True,
        MegatronConfig(path_to_cache=os.path.join(directory, "megatron"), **common),
    ).build()
    ours = megaindex.BlendedMegatronDatasetBuilder(
        dataset_classes[1],
        sizes,
        lambda: True,
        megaindex.GPTDatasetConfig(path_to_cache=os.path.join(directory, "ours"), **common),
    ).build()
    return theirs, ours


def assert_same_dataset(theirs, ours, samples=True):
    assert type(theirs).__name__ == type(ours).__name__
    assert theirs.unique_description == ours.unique_description
    if isinstance(theirs, MegatronBlendedDataset):
        for name in ("dataset_index", "dataset_sample_index"):
            reference, mine = getattr(theirs, name), getattr(ours, name)
            assert mine.dtype == reference.dtype, name
            numpy.testing.assert_array_equal(mine, reference, err_msg=name)
        for reference, mine in zip(theirs.datasets, ours.datasets, strict=True):
            assert_same_dataset(reference, mine, samples=False)
    else:
        for name in ("document_index", "sample_index", "shuffle_index"):
            numpy.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
            assert getattr(ours, name).dtype == getattr(theirs, name).dtype
    assert len(ours) == len(theirs)
    if samples:
        for idx in [*range(min(len(theirs), 30)), *range(max(len(theirs) - 1, 30), len(theirs))]:
            reference, mine = theirs[idx], ours[idx]
            assert list(mine) == list(reference)
            for key, value in reference.items():
                if key == "dataset_id":
                    assert mine[key] == value and type(mine[key]) is type(value)
                else:
                    assert torch.equal(mine[key], value), (idx, key)


BLENDS = [
    pytest.param([0.3, 0.7], 2, [2000, 100, 20], id="two-weighted"),
    pytest.param([0.05, 0.6, 0.15, 0.1, 0.1], 5, [3000, 200, 50], id="five-skewed"),
    pytest.param(None, 3, [1500, 80, 10], id="three-from-sizes"),
    pytest.param(None, 4, [None, None, None], id="four-exhaustive"),
    pytest.param([1, 3], 2, [800, 60, 0], id="integer-weights-empty-test"),
]


@pytest.mark.parametrize("weights,count,sizes", BLENDS)
def test_blends_equal(corpora, tmp_path, weights, count, sizes):
    items = []
    for number in range(count):
        items += ([str(weights[number])] if weights else []) + [corpora[number]]
    blend = megaindex.get_blend_from_list(items)
    theirs, ours = build_both(str(tmp_path), sizes, blend=blend, split="90,8,2")
    for reference, mine in zip(theirs, ours, strict=True):
        if reference is None:
            assert mine is None
            continue
        assert_same_dataset(reference, mine)


def test_per_split_blends_equal(corpora, tmp_path):
    per_split = [
        ([corpora[0], corpora[1]], [0.4, 0.6]),
        ([corpora[2]], None),
        ([corpora[3], corpora[4]], None),
    ]
    theirs, ours = build_both(str(tmp_path), [1000, 50, 30], blend_per_split=per_split)
    for reference, mine in zip(theirs, ours, strict=True):
        assert_same_dataset(reference, mine)


def test_multiple_validation_sets_equal(corpora, tmp_path):
    per_split = [([corpora[0]], None), ([corpora[1], corpora[2]], None), None]
    theirs, ours = build_both(
        str(tmp_path), [500, None, None], blend_per_split=per_split, multiple_validation_sets=True
    )
    assert isinstance(ours[1], list) and len(ours[1]) == 2
    for reference, mine in zip(theirs[1], ours[1], strict=True):
        assert_same_dataset(reference, mine)


def test_mock_equal(tmp_path):
    theirs, ours = build_both(
        str(tmp_path),
        [300, 30, 30],
        dataset_classes=(MegatronMockGPTDataset, megaindex.MockGPTDataset),
    )
    for reference, mine in zip(theirs, ours, strict=True):
        assert_same_dataset(reference, mine)


def cache_files(directory):
    return {
        name: os.stat(os.path.join(directory, name)).st_mtime_ns
        for name in sorted(os.listdir(directory))
    }


@pytest.mark.parametrize("first", ["megatron", "ours"])
def test_blended_cache_is_shared_both_ways(corpora, tmp_path, first):
    cache = str(tmp_path / "shared")
    common = dict(
        random_seed=9,
        sequence_length=24,
        tokenizer=NullTokenizer(VOCAB),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        blend=([corpora[0], corpora[2]], [0.25, 0.75]),
        split="95,5,0",
        path_to_cache=cache,
    )
    megatron_build = lambda: MegatronBuilder(  # noqa: E731
        MegatronGPTDataset, [1000, 40, 0], lambda: True, MegatronConfig(**common)
    ).build()
    our_build = lambda: megaindex.BlendedMegatronDatasetBuilder(  # noqa: E731
        megaindex.GPTDataset, [1000, 40, 0], lambda: True, megaindex.GPTDatasetConfig(**common)
    ).build()
    builds = {"megatron": megatron_build, "ours": our_build}
    second = "ours" if first == "megatron" else "megatron"
    made = builds[first]()
    before = cache_files(cache)
    assert any("BlendedDataset" in name for name in before)
    loaded = builds[second]()
    assert cache_files(cache) == before  # nothing rebuilt or rewritten
    for a, b in zip(made, loaded, strict=True):
        if a is not None:
            theirs, ours = (a, b) if first == "megatron" else (b, a)
            assert_same_dataset(theirs, ours)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "flags",
    [{}, {"reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True}],
    ids=["plain", "resets"],
)
def test_blend_batches_through_the_loader_equal_megatrons(corpora, tmp_path, workers, flags):
    """megaload over megaindex's blend (each batch gathered in one native call and collated in
    one pass) against Megatron-LM's loader (torch's DataLoader, default collation) over
    megatron-core's blend, batch for batch."""
    from torch.utils.data import DataLoader

    from megaload import DataLoaderConfig, MegatronPretrainingSampler, build_pretraining_data_loader

    blend = (corpora[:3], [0.5, 0.3, 0.2])
    theirs, ours = build_both(str(tmp_path), [240, 0, 0], blend=blend, split="1,0,0", **flags)
    theirs, ours = theirs[0], ours[0]
    assert ours.blend_gatherer().native() is not None  # the one-call path is the one compared
    reference = DataLoader(
        theirs, batch_sampler=MegatronPretrainingSampler(len(theirs), 0, 4, 0, 1), num_workers=0
    )
    config = DataLoaderConfig(micro_batch_size=4, num_workers=workers, pin_memory=False)
    batches = 0
    for expected, batch in zip(
        reference, build_pretraining_data_loader(ours, 0, config), strict=True
    ):
        assert list(batch) == list(expected)
        for key, value in expected.items():
            assert batch[key].dtype == value.dtype, key
            assert torch.equal(batch[key], value), key
        batches += 1
    assert batches == 60


@pytest.mark.parametrize("seed", range(32))
def test_blending_indices_of_many_datasets_equal_megatrons(seed):
    # from 64 datasets on, ours come from a tournament tree, megatron-core's from a scan of
    # every dataset at every sample: the same choices, ties and near ties included
    from megatron.core.datasets import helpers_cpp

    from megaindex.helpers import build_blending_indices

    rng = numpy.random.default_rng(seed)
    datasets = int(rng.integers(64, 4096))
    kind = seed % 8
    if kind == 0:  # sizes spread over four orders of magnitude, as in a real mix
        weights = numpy.exp(rng.uniform(0, numpy.log(1e4), datasets))
    elif kind == 1:  # all equal: ties at every sample
        weights = numpy.ones(datasets)
    elif kind == 2:  # a few values, and datasets never drawn
        weights = rng.choice([0.0, 1.0, 2.0, 3.0], datasets)
        weights[0] = 1.0
    elif kind == 3:  # weights a rounding apart
        weights = numpy.nextafter(1.0, rng.choice([0.0, 2.0], datasets))
    elif kind == 4:
        weights = rng.random(datasets)
    elif kind == 5:  # one dominant corpus and thousands of tiny ones
        weights = numpy.full(datasets, 1e-6)
        weights[int(rng.integers(datasets))] = 1.0
    elif kind == 6:  # not normalized, near ties (the helper takes them; the tree's margin does
        # not hold)
        weights = 1000 * (1 + rng.random(datasets) * 1e-12)
    else:  # 1, 2 or 4 parts in a power of two, summing to 1: exact ties between corpora of
        # different weights, which the lowest id wins
        weights = dyadic_weights(rng, datasets)
    if kind not in (6, 7):
        weights = weights / weights.sum()
    size = int(rng.integers(1, 40_000))
    if kind == 7:  # past half the weights' power of two, where such ties decide samples
        size = max(size, 16_384)
        assert deciding_ties(weights, size) > 0
    ours = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
    theirs = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
    build_blending_indices(*ours, weights, datasets, size, False)
    helpers_cpp.build_blending_indices(*theirs, weights, datasets, size, False)
    numpy.testing.assert_array_equal(ours[0], theirs[0])
    numpy.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("seed", range(8))
def test_exhaustive_blending_of_many_datasets_equals_megatrons(seed):
    # a blend weighted by its datasets' sizes draws each of their samples once: from 64
    # datasets on through the same tree, a dataset leaving it once drawn whole
    from megatron.core.datasets import helpers_cpp

    from megaindex.helpers import build_exhaustive_blending_indices

    rng = numpy.random.default_rng(seed)
    datasets = int(rng.integers(64, 3000))
    if seed % 2:  # equal sizes: ties at every sample
        sizes = numpy.full(datasets, int(rng.integers(1, 8)), numpy.int64)
    else:  # sizes over three orders of magnitude
        sizes = numpy.exp(rng.uniform(0, numpy.log(1e3), datasets)).astype(numpy.int64) + 1
    total = int(sizes.sum())
    ours = numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64)
    theirs = numpy.zeros(total, numpy.int16), numpy.zeros(total, numpy.int64)
    build_exhaustive_blending_indices(*ours, sizes, datasets)
    helpers_cpp.build_exhaustive_blending_indices(*theirs, sizes, datasets)
    numpy.testing.assert_array_equal(ours[0], theirs[0])
    numpy.testing.assert_array_equal(ours[1], theirs[1])
