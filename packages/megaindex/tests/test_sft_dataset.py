"""SFTDataset and its packing, by hand, with a tokenizer stand-in (no tokenizer library): each
turn's content is a list of ids, prompts masked. The seed-commit comparison is in
tests/compat/test_sft_compat.py."""

from __future__ import annotations

import json
import pickle

import numpy
import pytest
import torch

from megaindex import BlendedMegatronDatasetBuilder, SFTDataset, SFTDatasetConfig
from megaindex.errors import ConfigError, EmptySplitError
from megaindex.sft_pack import IGNORE_INDEX, pack_conversations

PAD, EOD = 0, 1


class IdsTokenizer:
    """A turn's content is its ids, space separated; user and system turns are prompt."""

    eod, pad, vocab_size = EOD, PAD, 1000
    unique_identifiers = {"class": "IdsTokenizer"}

    def tokenize_conversation(self, conversation, return_target, add_generation_prompt):
        tokens, target = [], []
        for turn in conversation:
            ids = [int(i) for i in turn["content"].split()]
            tokens += ids
            target += ids if turn["role"] == "assistant" else [IGNORE_INDEX] * len(ids)
        return numpy.array(tokens), numpy.array(target)


def conversation(prompt, answer):
    return (numpy.array(prompt + answer), numpy.array([IGNORE_INDEX] * len(prompt) + answer))


def test_packs_are_padded_to_the_row_and_positions_restart_per_conversation():
    pack = pack_conversations([conversation([5, 6], [7]), conversation([8], [9, 10])], 8, PAD)
    assert pack.tokens.tolist() == [5, 6, 7, 8, 9, 10, 0, 0, 0]
    assert pack.targets.tolist() == [-100, -100, 7, -100, 9, 10, 0, 0, 0]
    assert pack.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert pack.cu_seqlens == [0, 3, 8] and (pack.cut_tokens, pack.left_out) == (0, 0)


def test_context_parallelism_pads_each_conversation_to_a_multiple_of_2cp():
    pack = pack_conversations([conversation([5], [6, 7]), conversation([8], [9])], 12, PAD, 2)
    assert pack.tokens.tolist() == [5, 6, 7, 0, 8, 9, 0, 0, 0, 0, 0, 0, 0]
    assert pack.positions.tolist()[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert pack.cu_seqlens == [0, 4, 12]


def test_a_long_pack_is_cut_and_the_rest_counted():
    conversations = [
        conversation([5, 6], [7]),
        conversation([8, 9], [10, 11]),
        conversation([3], [4]),
    ]
    pack = pack_conversations(conversations, 5, PAD)
    assert pack.tokens.tolist() == [5, 6, 7, 8, 9, 0]  # 5 tokens and a pad
    assert pack.targets.tolist() == [-100, -100, 7, -100, -100, 0]
    assert pack.cu_seqlens == [0, 3, 5] and (pack.cut_tokens, pack.left_out) == (2, 1)


def test_a_line_without_tokens_is_an_error():
    with pytest.raises(ConfigError, match="no tokens"):
        pack_conversations([conversation([], [])], 4, PAD)


def write_jsonl(path, lines):
    with open(path, "w") as stream:
        for messages in lines:
            stream.write(json.dumps({"messages": messages}) + "\n")


def turns(*pairs):
    messages = []
    for system, user, answer in pairs:
        messages += [{"role": "system", "content": system}] if system else []
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return messages


@pytest.fixture
def dataset(tmp_path):
    path = str(tmp_path / "chat.jsonl")
    write_jsonl(
        path,
        [
            turns(("2", "3 4", "5"), ("2", "6", "7 8")),
            turns((None, "9", "10 11 12 13 14 15 16 17 18 19")),
            turns(("2", "3", "4")),
        ],
    )
    config = SFTDatasetConfig(
        random_seed=1,
        sequence_length=8,
        blend=([path], None),
        split="100,0,0",
        tokenizer=IdsTokenizer(),
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        "sft", [7, None, None], lambda: True, config
    ).build()
    return train


def test_samples_shift_the_pack_and_wrap_over_the_lines(dataset):
    assert isinstance(dataset, SFTDataset) and len(dataset) == 7
    sample = dataset[0]
    assert sample["tokens"].tolist() == [2, 3, 4, 5, 2, 6, 7, 8]
    assert sample["labels"].tolist() == [-100, -100, 5, -100, -100, 7, 8, 0]
    assert sample["loss_mask"].tolist() == [0, 0, 1, 0, 0, 1, 1, 0]
    assert sample["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert sample["cu_seqlens"].tolist() == [0, 4, 8] and sample["cu_seqlens"].dtype == torch.int32
    assert sample["max_seqlen"].dtype == torch.int32 and int(sample["max_seqlen"]) == 4
    for key, value in dataset[3].items():  # 3 wraps to line 0
        assert torch.equal(value, sample[key]), key


def test_a_cut_sample_warns_with_counts(dataset):
    where = r"sample 1 \(line 1 of .*chat\.jsonl \(line 2 of the file\)\)"
    with pytest.warns(UserWarning, match=where + r" is longer .* 3 tokens cut"):
        sample = dataset[1]
    assert sample["cu_seqlens"].tolist() == [0, 8] and dataset.cut_conversations == 1


def test_a_batch_pads_cu_seqlens_with_its_last_boundary(dataset):
    batch = dataset.__getitems__([0, 2, None]).collated
    assert batch["cu_seqlens"].tolist() == [[0, 4, 8], [0, 8, 8], [0, 4, 8]]
    assert batch["tokens"].shape == (3, 8) and batch["max_seqlen"].tolist() == [4, 8, 4]
    assert batch["loss_mask"][2].sum() == 0 and torch.equal(batch["tokens"][2], batch["tokens"][0])


def test_the_dataset_pickles_for_loader_workers(dataset):
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy[2]["tokens"].tolist() == dataset[2]["tokens"].tolist()


def test_attention_masks_and_resets_are_refused(dataset):
    dataset.config.create_attention_mask = True
    with pytest.raises(ConfigError, match="create_attention_mask must be off"):
        dataset[0]


def test_samples_asked_of_an_empty_split_are_refused_at_build(tmp_path):
    path = str(tmp_path / "chat.jsonl")
    write_jsonl(path, [turns(("2", "3", "4"))] * 3)
    config = SFTDatasetConfig(
        random_seed=1,
        sequence_length=8,
        blend=([path], None),
        split="99,1,0",  # 1% of 3 lines: none
        tokenizer=IdsTokenizer(),
    )
    with pytest.raises(EmptySplitError, match="5 SFT samples are asked of the valid split of"):
        BlendedMegatronDatasetBuilder("sft", [3, 5, None], lambda: True, config).build()
    # asked for nothing, it builds as the seed builds it
    train, valid, _ = BlendedMegatronDatasetBuilder(
        "sft", [3, 0, None], lambda: True, config
    ).build()
    assert len(train) == 3 and (valid is None or len(valid) == 0)


def test_a_pretokenized_corpus_refuses_a_smaller_megatron_style_tokenizer(tmp_path):
    pytest.importorskip("tokenizers")
    from megafmt.sft import preprocess_sft
    from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer

    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 4)
    tokenizer_dir = str(write_sft_tokenizer(tmp_path / "tokenizer"))
    prefix = preprocess_sft(path, str(tmp_path / "out"), tokenizer_dir)

    def build(vocab_size):
        tokenizer = IdsTokenizer()
        tokenizer.vocab_size = vocab_size
        config = SFTDatasetConfig(
            random_seed=1, sequence_length=8, blend=([prefix], None), split="100,0,0",
            tokenizer=tokenizer,
        )  # fmt: skip
        return BlendedMegatronDatasetBuilder("sft", [2, None, None], lambda: True, config).build()

    assert len(build(1000)[0]) == 2  # a larger vocabulary reads it
    with pytest.raises(ValueError, match="trained with a tokenizer of 256"):
        build(256)
