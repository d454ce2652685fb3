"""megaindex's dataset builder on real gloo ranks (spawned by megadist): rank 0 builds the
cache and the others load it; a rank that never reaches the builder is named, not waited for;
a rank still building is named with what it was doing; ranks given different configs fail
together before any of them uses a cache."""

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


def _config(prefix, cache, **overrides):
    fields = dict(
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
    return GPTDatasetConfig(**{**fields, **overrides})


def _build_on_rank(prefix, cache, holds_data):
    rank = torch.distributed.get_rank()
    config = _config(prefix, cache)
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
    config = _config(prefix, cache, random_seed=1, sequence_length=16, split="1", barrier_timeout=5)
    BlendedMegatronDatasetBuilder(GPTDataset, [50, None, None], lambda: True, config).build()
    return "built"


@pytest.mark.distributed
def test_a_rank_that_skips_the_builder_is_named_instead_of_hanging(corpus, tmp_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        run_distributed(
            _rank_two_skips_the_builder, 3, corpus, str(tmp_path / "cache"), timeout=300
        )
    report = str(caught.value)
    for rank in (0, 1):
        assert f"rank {rank}:" in report
    assert report.count("BarrierTimeoutError: rank") == 2
    assert "for ranks [2] (of 3): rank 2 never reached the dataset builder" in report
    assert time.monotonic() - start < 90


def _build_with_rank_overrides(prefix, cache, overrides):
    """Build on every rank, with ``overrides[rank]`` applied to that rank's config."""
    rank = torch.distributed.get_rank()
    config = _config(prefix, cache, barrier_timeout=30, **overrides[rank])
    BlendedMegatronDatasetBuilder(GPTDataset, [500, 20, 5], lambda: True, config).build()
    return "built"


@pytest.mark.distributed
def test_ranks_given_different_configs_fail_together_before_using_a_cache(corpus, tmp_path):
    cache = tmp_path / "cache"
    overrides = [{}, {"random_seed": 99, "sequence_length": 16, "path_to_cache": None}]
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        run_distributed(_build_with_rank_overrides, 2, corpus, str(cache), overrides, timeout=300)
    report = str(caught.value)
    print(f"{time.monotonic() - start:.1f} s\n{report}")  # the errors, shown with -s
    assert report.count("ConfigMismatchError: rank") == 2
    for rank in (0, 1):
        assert f"rank {rank}: the ranks were given different dataset configs" in report
    assert "random_seed: ranks [0] have 1234, ranks [1] have 99" in report
    assert "sequence_length: ranks [0] have 32, ranks [1] have 16" in report
    assert "path_to_cache" not in report  # rank-local: a folder of its own is allowed
    assert not cache.exists()  # no rank built or loaded an index


def _rank_zero_builds_slowly(prefix, cache):
    rank = torch.distributed.get_rank()
    if rank == 0:  # a cold cache whose build outlasts the others' barrier_timeout
        original = GPTDataset.__init__

        def slow(self, *args, **kwargs):
            time.sleep(6)
            original(self, *args, **kwargs)

        GPTDataset.__init__ = slow
    config = _config(prefix, cache, split="1", barrier_timeout=2)
    BlendedMegatronDatasetBuilder(GPTDataset, [50, None, None], lambda: True, config).build()
    return "built"


@pytest.mark.distributed
def test_a_barrier_timeout_names_the_rank_still_building_and_what_it_builds(corpus, tmp_path):
    with pytest.raises(RuntimeError) as caught:
        run_distributed(_rank_zero_builds_slowly, 2, corpus, str(tmp_path / "cache"), timeout=300)
    report = str(caught.value)
    print(report)  # the errors, shown with -s
    assert "BarrierTimeoutError: rank 1 waited 2 s at a dataset-building barrier for ranks [0]" in (
        report
    )
    assert f"rank 0 was building (or loading from the cache) the train index of {corpus}" in report
    assert "raise barrier_timeout" in report
    assert "never reached" not in report
