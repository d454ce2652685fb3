"""megaindex's dataset builder on real gloo ranks (spawned by megadist): rank 0 builds the
cache and the others load it; a rank that never reaches the builder is named, not waited for."""

import os
import time

import numpy
import pytest
import torch

from megadist.spawn import run_distributed
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig, Split
from megaindex.tokenizer import IdentifiedTokenizer


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(str(tmp_path / "corpus"))


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
