"""The pre-tokenized SFT corpus's ``.lossmask`` under faults: truncated while it is read (a
FormatError naming it, where a mapping killed the process with SIGBUS) and a folder where it
goes (refused before any file is written, where the run failed after the pair was committed)."""

from __future__ import annotations

import os
import pickle

import pytest

pytest.importorskip("tokenizers")

from megafmt import FormatError, get_bin_path, get_idx_path
from megafmt.manifest import read_manifest
from megafmt.sft import (
    JsonlLineIndex,
    SFTTokenizer,
    TokenizedConversations,
    check_vocabulary,
    get_loss_mask_path,
    write_tokenized,
)
from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer
from megafmt.sft.tokenized import preprocess_sft


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return SFTTokenizer(str(write_sft_tokenizer(tmp_path_factory.mktemp("sft-tokenizer"))))


def test_a_loss_mask_truncated_while_read_is_a_format_error(tmp_path, tokenizer):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 20, seed=1)
    write_tokenized(JsonlLineIndex(path), tokenizer, str(tmp_path / "c"))
    stored = TokenizedConversations(str(tmp_path / "c"))
    copy = pickle.loads(pickle.dumps(stored))  # as a loader worker receives it
    first = stored.tokenized_conversations(0)
    mask = get_loss_mask_path(str(tmp_path / "c"))
    os.truncate(mask, 3)
    truncated = r"c\.lossmask: unexpected end of file at byte \d+ .*truncated"
    with pytest.raises(FormatError, match=truncated):
        stored.tokenized_conversations(len(stored) - 1)
    # the worker's copy opens the mask at its first read: the size it finds is refused
    with pytest.raises(FormatError, match=r"c\.lossmask: reopened with 3 bytes, expected \d+"):
        copy.tokenized_conversations(len(copy) - 1)
    assert len(first) >= 1


def test_a_folder_where_the_loss_mask_goes_is_refused_before_anything_is_written(
    tmp_path, tokenizer
):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 3)
    prefix = str(tmp_path / "c")
    os.mkdir(get_loss_mask_path(prefix))
    with pytest.raises(IsADirectoryError, match=r"c\.lossmask: a folder is where"):
        write_tokenized(JsonlLineIndex(path), tokenizer, prefix)
    assert not os.path.exists(get_bin_path(prefix)) and not os.path.exists(get_idx_path(prefix))
    assert not any(name.endswith(".partial") for name in os.listdir(tmp_path))


def test_the_manifest_records_the_tokenizer_and_another_one_is_refused(tmp_path, tokenizer):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 5)
    nano = "nemotron-nano-v2"
    prefix = preprocess_sft(path, str(tmp_path / "out"), tokenizer.path, nano)
    made = read_manifest(prefix)["tokenizer"]
    assert made["type"] == "SFTTokenizer" and made["prompt_format"] == nano
    assert made["fingerprint"] == SFTTokenizer(tokenizer.path, nano).fingerprint
    assert made["vocab_size"] == tokenizer.vocab_size
    TokenizedConversations(prefix, SFTTokenizer(tokenizer.path, nano))  # the same: fine
    with pytest.raises(FormatError, match=rf"prompt_format '{nano}' -> 'nemotron-h-aligned'"):
        TokenizedConversations(prefix, SFTTokenizer(tokenizer.path))  # another prompt format
    smaller = write_sft_tokenizer(tmp_path / "smaller", vocab_size=270)  # other, fewer ids
    with pytest.raises(FormatError, match=r"vocab_size \d+ -> 270, fingerprint") as error:
        TokenizedConversations(prefix, SFTTokenizer(str(smaller), nano))
    assert f"pre-tokenized with the SFT tokenizer at {tokenizer.path}" in str(error.value)
    TokenizedConversations(prefix)  # no tokenizer to compare: read as it is


def test_a_loss_mask_of_another_corpus_of_the_same_size_is_refused(tmp_path, tokenizer):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 30, seed=4)
    prefix = preprocess_sft(path, str(tmp_path / "out"), tokenizer.path)
    mask = get_loss_mask_path(prefix)
    with open(mask, "rb") as stream:
        own = stream.read()
    copied = tmp_path / "copy.lossmask"  # the same bytes written anew: still its own
    copied.write_bytes(own)
    os.replace(copied, mask)
    TokenizedConversations(prefix)
    # another corpus's mask of the same size: its own positions are prompts there, and so on
    with open(mask, "wb") as stream:
        stream.write(bytes(1 - byte for byte in own))
    with pytest.raises(FormatError, match=r"its \.lossmask is not the one mega preprocess --sft"):
        TokenizedConversations(prefix)


def test_a_smaller_vocabulary_than_the_corpus_was_made_with_is_refused(tmp_path, tokenizer):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 3)
    prefix = preprocess_sft(path, str(tmp_path / "out"), tokenizer.path)
    check_vocabulary(prefix, tokenizer.vocab_size)  # the same: fine
    check_vocabulary(prefix, tokenizer.vocab_size + 128)  # a padded one: fine
    with pytest.raises(FormatError, match=rf"vocabulary of {tokenizer.vocab_size} ids .* of 256"):
        check_vocabulary(prefix, 256)


def test_a_pair_changed_under_its_loss_mask_is_refused(tmp_path, tokenizer):
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 10, seed=5)
    prefix = preprocess_sft(path, str(tmp_path / "out"), tokenizer.path)
    TokenizedConversations(prefix)
    with open(get_bin_path(prefix), "r+b") as stream:  # one token's byte, the size kept
        first = stream.read(1)
        stream.seek(0)
        stream.write(bytes([first[0] ^ 1]))
    with pytest.raises(FormatError, match=r"its \.bin/\.idx is not the one mega preprocess --sft"):
        TokenizedConversations(prefix)
