from __future__ import annotations

import os

import pytest

from megafmt.testing import VOCAB, write_corpus
from megaindex import GPTDatasetConfig, backends
from megaindex.tokenizer import IdentifiedTokenizer


@pytest.fixture
def corpus(tmp_path) -> str:
    """The prefix of a corpus of 300 random documents ending with EOD (``write_corpus``)."""
    return write_corpus(os.path.join(tmp_path, "corpus"))


@pytest.fixture
def tokenizer() -> IdentifiedTokenizer:
    """megatron-core's NullTokenizer over the corpus's vocabulary: EOD is VOCAB."""
    return IdentifiedTokenizer.null(VOCAB)


@pytest.fixture
def make_config(corpus, tokenizer, tmp_path):
    """``make_config(**overrides)``: a GPTDatasetConfig over the corpus fixture (or another
    config class, ``config_class``, such as GPTFIMDatasetConfig)."""

    def make(config_class: type = GPTDatasetConfig, **overrides) -> GPTDatasetConfig:
        fields = dict(
            random_seed=1234,
            sequence_length=32,
            blend=([corpus], None),
            split="90,8,2",
            tokenizer=tokenizer,
            path_to_cache=os.path.join(tmp_path, "cache"),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
        )
        fields.update(overrides)
        return config_class(**fields)

    return make


@pytest.fixture
def use_backend(monkeypatch):
    """``use_backend(name)`` makes the helpers run on that backend for the rest of the test."""

    def use(name: str) -> None:
        monkeypatch.setenv("MEGAINDEX_BACKEND", name)
        backends.implementation.cache_clear()

    yield use
    backends.implementation.cache_clear()
