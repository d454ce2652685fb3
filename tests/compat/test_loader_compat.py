"""megaload over megaindex against Megatron-LM's loader over megatron-core's GPTDataset: the same
batches, key for key, on every rank, with and without DataLoader workers."""

import itertools
import os

import pytest
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import (
    BlendedMegatronDatasetBuilder as MegatronBuilder,
)
from megatron.core.datasets.gpt_dataset import GPTDataset as MegatronGPTDataset
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MegatronConfig
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
from torch.utils.data import DataLoader

import megaindex
from megafmt.testing import VOCAB, write_corpus
from megaload import DataLoaderConfig, MegatronPretrainingSampler, build_pretraining_data_loader


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(
        str(tmp_path_factory.mktemp("loader") / "corpus"), documents=400, longest=40
    )


def datasets(corpus, directory, **flags):
    fields = dict(
        random_seed=3,
        sequence_length=32,
        blend=([corpus], None),
        split="1",
        tokenizer=NullTokenizer(VOCAB),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    fields.update(flags)
    theirs = MegatronBuilder(
        MegatronGPTDataset,
        [300, None, None],
        lambda: True,
        MegatronConfig(path_to_cache=os.path.join(directory, "m"), **fields),
    ).build()[0]
    ours = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTDataset,
        [300, None, None],
        lambda: True,
        megaindex.GPTDatasetConfig(path_to_cache=os.path.join(directory, "o"), **fields),
    ).build()[0]
    return theirs, ours


def assert_same_batches(reference, mine):
    count = 0
    for theirs, ours in zip(reference, mine, strict=True):
        assert list(ours) == list(theirs)
        for key, value in theirs.items():
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
            assert torch.equal(ours[key], value), key
        count += 1
    assert count > 0


FLAGS = list(itertools.product([False, True], repeat=3))


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join("1" if x else "0" for x in f))
def test_batches_equal_megatrons_loader(corpus, tmp_path, flags):
    reset_positions, reset_mask, eod_loss = flags
    theirs, ours = datasets(
        corpus,
        str(tmp_path),
        reset_position_ids=reset_positions,
        reset_attention_mask=reset_mask,
        eod_mask_loss=eod_loss,
    )
    for rank in range(2):
        reference = DataLoader(
            theirs,
            batch_sampler=MegatronPretrainingSampler(len(theirs), 8, 4, rank, 2),
            num_workers=0,
        )
        mine = build_pretraining_data_loader(
            ours,
            8,
            DataLoaderConfig(
                micro_batch_size=4, data_parallel_rank=rank, data_parallel_size=2, num_workers=0
            ),
        )
        assert_same_batches(reference, mine)


def test_batches_equal_with_two_workers(corpus, tmp_path):
    theirs, ours = datasets(corpus, str(tmp_path))
    reference = DataLoader(
        theirs, batch_sampler=MegatronPretrainingSampler(len(theirs), 0, 4, 0, 1), num_workers=2
    )
    mine = build_pretraining_data_loader(
        ours, 0, DataLoaderConfig(micro_batch_size=4, num_workers=2)
    )
    assert_same_batches(reference, mine)


def test_a_padded_last_batch_carries_zero_loss(corpus, tmp_path):
    _, ours = datasets(corpus, str(tmp_path))
    config = DataLoaderConfig(
        micro_batch_size=4,
        data_parallel_size=2,
        data_parallel_rank=1,
        drop_last=False,
        pad_last_batch=True,
        num_workers=0,
    )
    last = list(build_pretraining_data_loader(ours, len(ours) - 5, config))[-1]
    # 5 samples left for 2 ranks of 4: rank 1 gets the fifth and three padding samples
    assert last["tokens"].shape == (4, 32)
    assert last["loss_mask"][0].sum() > 0 and last["loss_mask"][1:].sum() == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_megatrons_own_loader_takes_our_dataset(corpus, tmp_path, workers):
    """Only the dataset's import changed: Megatron-LM's loader (torch's DataLoader, default
    collation) gives the same batches over megaindex's GPTDataset as over megatron-core's."""
    theirs, ours = datasets(corpus, str(tmp_path), reset_attention_mask=True)

    def megatron_loader(dataset):
        sampler = MegatronPretrainingSampler(len(dataset), 0, 4, 0, 1)
        return DataLoader(dataset, batch_sampler=sampler, num_workers=workers)

    assert_same_batches(megatron_loader(theirs), megatron_loader(ours))
