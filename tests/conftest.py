"""Cross-package tests: compatibility with megatron-core, and behaviour across packages."""

import numpy
import pytest

import megafmt

#: the vocabulary of the test corpora: ids 0..999, and 1000 ends a document (NullTokenizer(1000))
VOCAB = 1000


def write_corpus(prefix, documents=300, seed=0, shortest=1, longest=60):
    """``documents`` random documents of ``shortest``..``longest`` - 1 tokens plus EOD."""
    rng = numpy.random.default_rng(seed)
    builder = megafmt.IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(documents):
        length = int(rng.integers(shortest, longest))
        tokens = [*rng.integers(0, VOCAB, length).tolist(), VOCAB]
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="session")
def corpus_writer():
    """``write_corpus(prefix, documents=300, seed=0, shortest=1, longest=60)``."""
    return write_corpus


def pytest_collection_modifyitems(items):
    for item in items:
        if "/compat/" in str(item.path):
            item.add_marker(pytest.mark.compat)
