"""SFT against the seed commit's code: the SFT tokenizer's prompt formats and the SFTDataset's
samples (as pretrain_gpt.py --sft builds them), sample by sample, from the jsonl and from its
pre-tokenized form."""

from __future__ import annotations

import itertools
import json
import random

import numpy
import pytest
import torch
from seedref import SeedRaised

from megafmt.preprocess import BadInputError
from megafmt.sft import JsonlLineIndex, SFTTokenizer, split_conversations, write_tokenized
from megafmt.sft.testing import random_messages, write_sft_jsonl, write_sft_tokenizer
from megaindex import BlendedMegatronDatasetBuilder, SFTDataset, SFTDatasetConfig

pytestmark = pytest.mark.compat

FORMATS = ["nemotron-h-aligned", "nemotron-nano-v2", "identity", "default"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(write_sft_tokenizer(tmp_path_factory.mktemp("sft-tokenizer")))


@pytest.mark.parametrize("prompt_format", FORMATS)
def test_tokenize_conversation_equals_the_seed_s(seed, tokenizer_dir, prompt_format):
    rng = random.Random(len(prompt_format))
    conversations = [c for _ in range(60) for c in split_conversations(random_messages(rng))]
    theirs, eod, pad = seed.call("seed_sft:tokenize", tokenizer_dir, prompt_format, conversations)
    ours = SFTTokenizer(tokenizer_dir, prompt_format)
    assert (ours.eod, ours.pad) == (eod, pad)
    for conversation, expected in zip(conversations, theirs, strict=True):
        tokens, target = ours.tokenize_conversation(conversation, True, False)
        assert (tokens.tolist(), target.tolist()) == expected, conversation


def ours_samples(path, tokenizer, settings, count, skip_bad_lines=False):
    config = SFTDatasetConfig(
        random_seed=settings["seed"],
        sequence_length=settings["sequence_length"],
        blend=([path], None),
        split=settings["split"],
        tokenizer=tokenizer,
        context_parallel_size=settings["context_parallel_size"],
        skip_bad_lines=skip_bad_lines,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        "sft", settings["sizes"], lambda: True, config
    ).build()
    assert isinstance(train, SFTDataset)
    return train, [train[i] for i in range(count)]


def assert_same_samples(ours, theirs):
    for number, (mine, expected) in enumerate(zip(ours, theirs, strict=True)):
        assert list(mine) == list(expected), number
        for key, value in expected.items():
            found = mine[key].numpy()
            assert found.dtype == value.dtype, (number, key)
            numpy.testing.assert_array_equal(found, value, err_msg=f"sample {number}, {key}")


CASES = [
    # (prompt format, sequence length, CP size, split, line count, conversations per line)
    ("nemotron-h-aligned", 64, 1, "100,0,0", 30, 2),
    ("nemotron-h-aligned", 37, 2, "70,20,10", 40, 3),
    ("nemotron-nano-v2", 128, 1, "100,0,0", 25, 3),
    ("nemotron-nano-v2", 48, 4, "90,10,0", 30, 1),
    ("identity", 40, 1, "100,0,0", 20, 2),
    ("default", 96, 2, "100,0,0", 20, 2),
]


@pytest.mark.parametrize(("prompt_format", "length", "cp", "split", "lines", "per_line"), CASES)
def test_samples_equal_the_seed_s_from_jsonl_and_pre_tokenized(
    seed, tokenizer_dir, tmp_path, prompt_format, length, cp, split, lines, per_line
):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, lines, seed=length, conversations=per_line)
    count = 2 * lines + 3  # past the end: indices wrap
    settings = {
        "seed": 1234,
        "sequence_length": length,
        "split": split,
        "sizes": [count, 4, 4],
        "context_parallel_size": cp,
    }
    seed_len, theirs = seed.call(
        "seed_sft:samples", path, tokenizer_dir, prompt_format, settings, count
    )
    tokenizer = SFTTokenizer(tokenizer_dir, prompt_format)
    dataset, ours = ours_samples(path, tokenizer, settings, count)
    assert len(dataset) == seed_len == count
    assert_same_samples(ours, theirs)
    write_tokenized(JsonlLineIndex(path), tokenizer, str(tmp_path / "tok"))
    _, stored = ours_samples(str(tmp_path / "tok"), tokenizer, settings, count)
    assert_same_samples(stored, theirs)


def test_samples_of_a_seed_random_sweep(seed, tokenizer_dir, tmp_path):
    """Seeded random configurations: formats, lengths (tiny ones cut most packs), CP sizes."""
    rng = random.Random(13)
    for case in range(6):
        prompt_format = rng.choice(FORMATS[:3])
        path = str(tmp_path / f"sweep{case}.jsonl")
        write_sft_jsonl(path, rng.randint(5, 25), seed=case, conversations=rng.randint(1, 4))
        settings = {
            "seed": rng.randint(0, 999),
            "sequence_length": rng.choice([8, 16, 33, 80, 200]),
            "split": rng.choice(["100,0,0", "80,20,0"]),
            "sizes": [rng.randint(1, 40), 3, 3],
            "context_parallel_size": rng.choice([1, 2, 4]),
        }
        settings["sequence_length"] += -settings["sequence_length"] % (
            2 * settings["context_parallel_size"]
        )
        count = settings["sizes"][0]
        _, theirs = seed.call(
            "seed_sft:samples", path, tokenizer_dir, prompt_format, settings, count
        )
        _, ours = ours_samples(path, SFTTokenizer(tokenizer_dir, prompt_format), settings, count)
        assert_same_samples(ours, theirs)


def test_negative_indices_read_the_seed_s_samples_one_by_one_and_batched(
    seed, tokenizer_dir, tmp_path
):
    """The seed's ``__getitem__`` wraps any index modulo the split's lines (``-1``: the last
    line, whatever ``len`` is); ours does, and ``__getitems__`` reads each index as
    ``__getitem__`` does, so a batch holds the samples read one by one."""
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 7, seed=4, conversations=2)
    settings = {  # 11 samples over 7 lines: -1 % 11 and -1 % 7 pick different lines
        "seed": 5,
        "sequence_length": 40,
        "split": "100,0,0",
        "sizes": [11, 2, 2],
        "context_parallel_size": 1,
    }
    indices = [-1, -2, -7, -8, -11, -12, -30, 3, 13]
    theirs = seed.call(
        "seed_sft:samples_at", path, tokenizer_dir, "nemotron-h-aligned", settings, indices
    )
    dataset, _ = ours_samples(path, SFTTokenizer(tokenizer_dir), settings, 0)
    one_by_one = [dataset[idx] for idx in indices]
    batch = dataset.__getitems__(indices).collated
    assert_same_samples(one_by_one, theirs)
    for row, sample in enumerate(one_by_one):
        boundaries = len(sample["cu_seqlens"])  # the batch repeats the last one to its longest
        padded = batch["cu_seqlens"][row]
        assert (padded[boundaries:] == sample["cu_seqlens"][-1]).all(), row
        batched = {key: batch[key][row] for key in batch}
        assert_same_samples([{**batched, "cu_seqlens": padded[:boundaries]}], [theirs[row]])


def turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


#: lines the seed trains on in each format that megafmt used to refuse: masking formats check
#: turns as the seed's tokenizer does (roles lower-cased; the turn before the first is the
#: conversation's last), the others take any turns
SEED_TRAINS_ON = {
    "nemotron-h-aligned": [
        [turn("assistant", "hello"), turn("user", "why")],
        [turn("system", "sys"), turn("User", "a"), turn("Assistant", "b"), turn("user", "cat")],
    ],
    "nemotron-nano-v2": [[turn("assistant", "ok 42"), turn("tool", "mat")]],
    "identity": [
        [turn("user", "hello"), turn("assistant", "")],
        [turn("assistant", "world"), turn("system", "sat"), turn("assistant", "on a mat")],
        [turn("robot", "tokens"), turn("user", "why")],
    ],
}


@pytest.mark.parametrize("prompt_format", sorted(SEED_TRAINS_ON))
def test_lines_the_seed_trains_on_are_trained_on_in_its_order(
    seed, tokenizer_dir, tmp_path, prompt_format
):
    """Lines the seed's tokenizer takes in this format (and that megafmt once refused as a
    whole jsonl), among ordinary ones: every sample the seed's, line for line."""
    path = tmp_path / "chat.jsonl"
    records = write_sft_jsonl(path, 6, seed=3, conversations=2)
    for offset, messages in enumerate(SEED_TRAINS_ON[prompt_format]):
        records.insert(1 + 2 * offset, messages)
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in records))
    count = 2 * len(records)
    settings = {
        "seed": 7,
        "sequence_length": 48,
        "split": "100,0,0",
        "sizes": [count, 2, 2],
        "context_parallel_size": 1,
    }
    _, theirs = seed.call(
        "seed_sft:samples", str(path), tokenizer_dir, prompt_format, settings, count
    )
    _, ours = ours_samples(str(path), SFTTokenizer(tokenizer_dir, prompt_format), settings, count)
    assert_same_samples(ours, theirs)


def test_a_line_the_seed_fails_on_is_an_error_naming_its_line(seed, tokenizer_dir, tmp_path):
    """An empty assistant turn in a masking format: the seed fails reading that line (a
    ValueError), ours names file and line, or skips and counts it with skip_bad_lines."""
    path = tmp_path / "chat.jsonl"
    records = write_sft_jsonl(path, 4, seed=5)
    records.insert(2, [turn("user", "why"), turn("assistant", "")])
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in records))
    settings = {
        "seed": 7,
        "sequence_length": 48,
        "split": "100,0,0",
        "sizes": [5, 2, 2],
        "context_parallel_size": 1,
    }
    theirs = seed.call(
        "seed_sft:samples_at", str(path), tokenizer_dir, "nemotron-h-aligned", settings, [2]
    )
    assert theirs == ["ValueError"]
    tokenizer = SFTTokenizer(tokenizer_dir)
    with pytest.raises(BadInputError, match=r"chat\.jsonl, line 3 .*empty assistant turn"):
        ours_samples(str(path), tokenizer, settings, 1)
    with pytest.warns(UserWarning, match="skipped 1 bad lines"):
        dataset, _ = ours_samples(str(path), tokenizer, settings, 0, skip_bad_lines=True)
    assert dataset.dataset.lines.tolist() == [1, 2, 4, 5]


def test_packing_keeps_conversations_whole_and_loss_on_answers(tokenizer_dir, tmp_path):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 30, seed=9, conversations=3)
    tokenizer = SFTTokenizer(tokenizer_dir)
    settings = {"seed": 1, "sequence_length": 512, "split": "100,0,0", "sizes": [30, None, None]}
    dataset, samples = ours_samples(path, tokenizer, {**settings, "context_parallel_size": 1}, 30)
    for idx, sample in enumerate(samples):
        conversations = dataset.conversations(idx)
        cu = sample["cu_seqlens"].tolist()
        assert len(cu) == len(conversations) + 1 and cu[-1] == 512  # none split, none dropped
        for (tokens, targets), start, _end in zip(conversations, cu, cu[1:], strict=False):
            assert sample["tokens"][start : start + len(tokens)].tolist() == tokens.tolist()
            assert sample["position_ids"][start : start + len(tokens)].tolist() == list(
                range(len(tokens))
            )
            # the label of position p is the target of token p + 1: loss only on answer tokens
            answer = (targets[1:] != -100) & (targets[1:] != tokenizer.pad)
            assert (
                sample["loss_mask"][start : start + len(tokens) - 1].bool().tolist()
                == answer.tolist()
            )
        assert int(sample["max_seqlen"]) == max(b - a for a, b in itertools.pairwise(cu))


def test_a_pack_longer_than_the_sequence_is_cut_with_a_counted_warning(tokenizer_dir, tmp_path):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 4, seed=2, conversations=4)
    settings = {"seed": 1, "sequence_length": 16, "split": "100,0,0", "sizes": [4, None, None]}
    dataset, _ = ours_samples(
        path, SFTTokenizer(tokenizer_dir), {**settings, "context_parallel_size": 1}, 0
    )
    with pytest.warns(UserWarning, match=r"longer than sequence_length 16: \d+ tokens cut"):
        sample = dataset[0]
    assert dataset.cut_conversations == 1 and sample["cu_seqlens"].tolist()[-1] == 16
    batch = dataset.__getitems__([0, 1, None]).collated
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["tokens"].shape == (3, 16)
    assert batch["loss_mask"][2].sum() == 0  # a padding sample takes no loss


def test_the_seed_refuses_what_megafmt_refuses(seed, tokenizer_dir):
    empty_answer = [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]
    theirs, _, _ = seed.call(
        "seed_sft:tokenize", tokenizer_dir, "nemotron-h-aligned", [empty_answer]
    )
    assert theirs == ["ValueError"]
    with pytest.raises(SeedRaised):
        seed.call("seed_sft:tokenize", tokenizer_dir, "chatml", [])
