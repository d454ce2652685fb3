import os
import time

import numpy
import pytest
import torch

from megafmt.distributed_testing import run_distributed
from megaindex import (
    BlendedMegatronDatasetBuilder,
    ConfigError,
    GPTDataset,
    GPTDatasetConfig,
    MockGPTDataset,
    Split,
)
from megaindex.tokenizer import IdentifiedTokenizer


def test_mock_builds_three_even_splits_without_a_cache(tokenizer):
    config = GPTDatasetConfig(
        random_seed=3,
        sequence_length=64,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        MockGPTDataset, [100, 10, 10], lambda: True, config
    ).build()
    assert len(train) >= 100 and len(valid) >= 10 and len(test) >= 10
    assert train.index_source.kind == "memory"
    # mock documents count up from 1 and end with EOD
    document = train.dataset.get(0)
    assert document[:3].tolist() == [1, 2, 3] and document[-1] == tokenizer.eod


def test_split_ranges_are_contiguous(make_config):
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [100, 10, 5], lambda: True, make_config()
    ).build()
    # 300 sequences split 90,8,2: [0, 270), [270, 294), [294, 300)
    assert (train.indices[0], train.indices[-1], len(train.indices)) == (0, 269, 270)
    assert (valid.indices[0], len(valid.indices)) == (270, 24)
    assert (test.indices[0], len(test.indices)) == (294, 6)


def test_per_split_blends_of_one_prefix(make_config, corpus):
    config = make_config(
        blend=None, split=None, blend_per_split=[([corpus], None), None, ([corpus], None)]
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [100, None, 5], lambda: True, config
    ).build()
    assert valid is None
    assert len(train.indices) == len(test.indices) == 300


def test_weights_without_sizes_are_refused(make_config, corpus):
    config = make_config(blend=([corpus], [1.0]))
    with pytest.raises(ConfigError, match="the train split has weights but no size"):
        BlendedMegatronDatasetBuilder(GPTDataset, [None, 1, 1], lambda: True, config)
    with pytest.raises(ConfigError, match="sizes must hold one entry per split"):
        BlendedMegatronDatasetBuilder(GPTDataset, [1, 1], lambda: True, config)


def _build_on_rank(prefix, cache, holds_data):
    rank = torch.distributed.get_rank()
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=32,
        blend=([prefix], None),
        split="90,8,2",
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    datasets = BlendedMegatronDatasetBuilder(
        GPTDataset, [500, 20, 5], lambda: holds_data[rank], config
    ).build()
    return [
        None if d is None else (d.index_source.kind, numpy.asarray(d.sample_index).tolist())
        for d in datasets
    ]


@pytest.mark.distributed
def test_rank_zero_builds_and_the_others_load(corpus, tmp_path):
    cache = os.path.join(tmp_path, "cache")
    results = run_distributed(_build_on_rank, 3, corpus, cache, [True, True, False])
    for split in Split:
        built, loaded, absent = (rank[split.value] for rank in results)
        assert built[0] == "built" and loaded[0] == "cache"
        assert built[1] == loaded[1]
        assert absent is None


def _rank_two_skips_the_builder(prefix, cache):
    rank = torch.distributed.get_rank()
    if rank == 2:
        return "skipped"
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=16,
        blend=([prefix], None),
        split="1",
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        barrier_timeout=5,
    )
    BlendedMegatronDatasetBuilder(GPTDataset, [50, None, None], lambda: True, config).build()
    return "built"


@pytest.mark.distributed
def test_a_rank_that_skips_the_builder_is_named_instead_of_hanging(corpus, tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        run_distributed(_rank_two_skips_the_builder, 3, corpus, str(tmp_path / "cache"), timeout=90)
    report = str(caught.value)
    for rank in (0, 1):
        assert f"rank {rank}:" in report
    assert report.count("BarrierTimeoutError: rank") == 2
    assert "for ranks [2] (of 3), which never arrived" in report
    assert time.monotonic() - start < 90
