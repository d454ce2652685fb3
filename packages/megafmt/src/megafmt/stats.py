"""Summary figures of a corpus, as ``mega info`` prints them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy

from megafmt.errors import MissingFileError
from megafmt.format import get_bin_path, get_idx_path
from megafmt.index import Index
from megafmt.prefix_hints import missing_file_message
from megafmt.remote import file_size, local_index_path
from megafmt.verification import check_consistency

PERCENTILES = (50, 90, 99)
CONSISTENCY_CHECKED = (
    "passed: .bin size, pointers, lengths and document indices (the check at open)"
)


@dataclass(frozen=True)
class LengthSummary:
    """The distribution of a length (tokens per sequence or per document)."""

    count: int
    mean: float
    min: int
    max: int
    percentiles: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, lengths: numpy.ndarray) -> LengthSummary:
        if len(lengths) == 0:
            return cls(0, 0.0, 0, 0, {p: 0 for p in PERCENTILES})
        # nearest-rank percentiles: the smallest length with at least p% of values at or below it
        points = numpy.percentile(lengths, PERCENTILES, method="inverted_cdf")
        return cls(
            count=len(lengths),
            mean=float(lengths.mean(dtype=numpy.float64)),
            min=int(lengths.min()),
            max=int(lengths.max()),
            percentiles={p: int(v) for p, v in zip(PERCENTILES, points, strict=False)},
        )


@dataclass(frozen=True)
class CorpusStats:
    """What ``mega info`` reports about one corpus."""

    path_prefix: str
    dtype: str
    dtype_code: int
    sequences: int
    documents: int
    tokens: int
    idx_bytes: int
    bin_bytes: int
    multimodal: bool
    sequence_lengths: LengthSummary
    document_lengths: LengthSummary
    consistency: str = CONSISTENCY_CHECKED
    """What was checked before the figures were computed (a corpus that fails raises)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def document_lengths(lengths: numpy.ndarray, document_indices: numpy.ndarray) -> numpy.ndarray:
    """Tokens in each document, from sequence lengths and document boundaries."""
    ends = numpy.zeros(len(lengths) + 1, dtype=numpy.int64)
    numpy.cumsum(lengths, out=ends[1:])
    return ends[document_indices[1:]] - ends[document_indices[:-1]]


def _existing_size(path: str) -> int:
    size = file_size(path)
    if size is None:
        raise MissingFileError(f"{path}: {missing_file_message(path, 'token file')}")
    return size


def corpus_stats(path_prefix: str) -> CorpusStats:
    """Counts, sizes and length distributions of the corpus at ``path_prefix``, after the
    consistency check every opened corpus gets (a corpus that fails it raises
    :class:`~megafmt.errors.FormatError`: figures of a damaged corpus would mislead)."""
    bin_path = get_bin_path(path_prefix)
    index = Index(local_index_path(path_prefix), name=get_idx_path(path_prefix))
    bin_bytes = _existing_size(bin_path)
    check_consistency(index, bin_path, bin_bytes)
    lengths = index.sequence_lengths
    return CorpusStats(
        path_prefix=path_prefix,
        dtype=numpy.dtype(index.dtype).name,
        dtype_code=index.dtype_code,
        sequences=index.sequence_count,
        documents=max(index.document_count - 1, 0),
        tokens=int(lengths.sum(dtype=numpy.int64)),
        idx_bytes=index.nbytes,
        bin_bytes=bin_bytes,
        multimodal=index.has_modes,
        sequence_lengths=LengthSummary.of(lengths),
        document_lengths=LengthSummary.of(document_lengths(lengths, index.document_indices)),
    )
