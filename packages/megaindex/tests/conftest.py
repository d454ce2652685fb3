from __future__ import annotations

import os

import numpy
import pytest

from megafmt import IndexedDatasetBuilder
from megaindex import GPTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer

VOCAB = 1000
EOD = VOCAB  # megatron-core's NullTokenizer(1000) ends documents with id 1000


def write_corpus(prefix: str, documents: int = 300, seed: int = 0, max_length: int = 60) -> str:
    """A corpus of random documents, each ending with EOD."""
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(documents):
        tokens = [*rng.integers(0, VOCAB, int(rng.integers(1, max_length))).tolist(), EOD]
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture
def corpus_writer():
    """``write_corpus(prefix, documents=300, seed=0, max_length=60)``."""
    return write_corpus


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_corpus(os.path.join(tmp_path, "corpus"))


@pytest.fixture
def tokenizer() -> IdentifiedTokenizer:
    return IdentifiedTokenizer.null(VOCAB)


@pytest.fixture
def make_config(corpus, tokenizer, tmp_path):
    """``make_config(**overrides)``: a GPTDatasetConfig over the corpus fixture."""

    def make(**overrides) -> GPTDatasetConfig:
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
        return GPTDatasetConfig(**fields)

    return make
