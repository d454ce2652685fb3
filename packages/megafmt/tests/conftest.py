from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy
import pytest

from megafmt import IndexedDatasetBuilder, get_bin_path, get_idx_path

#: the tokenizer backend's self-check runs in every test that asks for it: a verdict remembered
#: on disk by an earlier run (of other code, in a working tree) would stand in for it
os.environ.setdefault("MEGAFMT_BACKEND_CHECKS", "off")

Documents = Sequence[Sequence[Sequence[int]]]


def build(
    prefix: str,
    documents: Documents,
    dtype: type = numpy.int32,
    modes: Sequence[Sequence[int]] | None = None,
) -> str:
    """Write ``documents`` (each a list of sequences) with the builder; returns the prefix."""
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype, multimodal=modes is not None)
    for number, document in enumerate(documents):
        for position, sequence in enumerate(document):
            mode = modes[number][position] if modes is not None else 0
            builder.add_item(numpy.array(sequence, dtype=dtype), mode)
        builder.end_document()
    builder.finalize(get_idx_path(prefix))
    return prefix


@pytest.fixture
def make_corpus(tmp_path) -> Callable[..., str]:
    """``make_corpus(documents, dtype=..., modes=..., name=...)`` writes a corpus in tmp_path."""

    def make(documents: Documents, dtype: type = numpy.int32, modes=None, name="corpus") -> str:
        return build(os.path.join(tmp_path, name), documents, dtype, modes)

    return make
