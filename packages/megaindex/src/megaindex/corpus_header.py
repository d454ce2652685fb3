"""What a configuration assumes about a corpus, checked against its ``.idx`` header.

megatron-core opens a corpus listed in ``sequences_per_dataset`` without reading the header of
its ``.idx``: the sequence and document counts come from that list, and the token dtype from
the tokenizer's vocabulary size (``GPTDatasetConfig.token_dtype_code``: int32 above 65536 ids,
else uint16). Wrong counts fail one of its asserts later (or, with ``fast_cache_load``, are
used as they are); a wrong dtype reads wrong tokens silently, on every path.

megaindex opens the corpus with megafmt, which reads the 34-byte header and checks the sizes of
the ``.idx`` and ``.bin`` against it (one small read of a file that is mapped anyway), and then
compares what the configuration assumed, on every path, ``fast_cache_load`` or not:

* the counts: a disagreement is a :class:`~megaindex.errors.SequenceCountError` (an
  ``AssertionError``, as megatron-core's) naming the corpus, the counts given and the counts
  found; a corpus the list leaves out is a ``KeyError`` there and a
  :class:`~megaindex.errors.MissingSequenceCountError` here.
* the dtype: the header wins, with a warning. The header is what the writer recorded about
  these very bytes, while the vocabulary-derived dtype is a guess whose threshold (65536) is
  not the writer's (Megatron's preprocess writes int32 from 65500 ids up): a vocabulary of
  65500 to 65536 ids disagrees with every corpus Megatron wrote for it, which is no fault of
  the user's configuration, so refusing would only block a correct job. Reading by the
  header, the tokens are always the ones in the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy

from megafmt import DType, IndexedDataset
from megaindex.errors import MissingSequenceCountError, SequenceCountError


def expected_counts(
    sequences_per_dataset: Mapping[str, Any] | None, dataset_path: str
) -> tuple[int, int] | None:
    """The (sequence count, document count) ``sequences_per_dataset`` gives ``dataset_path``,
    or None when no list is given (megatron-core ignores an empty one too)."""
    if not sequences_per_dataset:
        return None
    try:
        counts = sequences_per_dataset[dataset_path]
    except KeyError:
        raise MissingSequenceCountError(
            f"sequences_per_dataset has no entry for {dataset_path!r} (it lists "
            f"{len(sequences_per_dataset)} corpora); expected [sequence count, document count] "
            "for every corpus of the blend"
        ) from None
    values = tuple(counts) if isinstance(counts, (list, tuple)) else (counts,)
    if len(values) != 2 or not all(isinstance(v, (int, numpy.integer)) for v in values):
        raise SequenceCountError(
            f"sequences_per_dataset[{dataset_path!r}]: expected [sequence count, document "
            f"count], found {counts!r}"
        )
    return int(values[0]), int(values[1])


def check_counts(dataset: IndexedDataset, dataset_path: str, expected: tuple[int, int]) -> None:
    """Raise when ``expected`` (from ``sequences_per_dataset``) is not what the header of
    ``dataset``'s ``.idx`` says."""
    index = dataset.index
    found = (index.sequence_count, index.document_count)
    if found != expected:
        raise SequenceCountError(
            f"sequences_per_dataset[{dataset_path!r}] gives {expected[0]} sequences and "
            f"{expected[1]} document indices, but the header of {index.path} says {found[0]} "
            f"and {found[1]} (its {index.nbytes} bytes agree with the header); regenerate the "
            "list (Megatron-LM's tools/build_sequences_per_dataset.py) for this corpus"
        )


def check_token_dtype(dataset: IndexedDataset, dataset_path: str, assumed_code: int) -> None:
    """Warn when the dtype the vocabulary implies is not the header's (the header is used)."""
    index = dataset.index
    if index.dtype_code == assumed_code:
        return
    assumed = numpy.dtype(DType.dtype_from_code(assumed_code)).name
    warnings.warn(
        f"{dataset_path}: the tokenizer's vocabulary implies {assumed} tokens (dtype code "
        f"{assumed_code}), but the header of {index.path} says "
        f"{numpy.dtype(index.dtype).name} (code {index.dtype_code}): reading by the header "
        "(megatron-core, given sequences_per_dataset, would read the .bin as "
        f"{assumed} and get wrong tokens)",
        stacklevel=3,
    )
