"""The index builders, with megatron-core's names and signatures (``megatron.core.datasets.
helpers``): inputs are checked here, then the active backend (:mod:`megaindex.backend`) runs.

Inputs of another integer dtype are converted when their values fit; a value that does not fit,
a non-integer dtype, a wrong shape or an output array that cannot be filled in place is an error
that names the argument, what was expected and what was found.
"""

from __future__ import annotations

from typing import Any

import numpy

from megaindex.backends import implementation

INT32_MAX = numpy.iinfo(numpy.int32).max
MAX_DATASETS = numpy.iinfo(numpy.int16).max


def _integers(name: str, values: Any, dtype: type) -> numpy.ndarray:
    """``values`` as a 1-D contiguous array of ``dtype``, checked to fit."""
    array = numpy.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.dtype != dtype and array.size:
        info = numpy.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise ValueError(
                f"{name} holds values {low}..{high}, outside {numpy.dtype(dtype).name} "
                f"({info.min}..{info.max})"
            )
    return numpy.ascontiguousarray(array, dtype=dtype)


def _positive(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def shuffle(random_state: numpy.random.RandomState, array: numpy.ndarray) -> None:
    """``random_state.shuffle(array)``: the same permutation and the same state afterwards, run
    by the backend (the C++ one prefetches the swaps, several times faster on large arrays)."""
    problems = [
        problem
        for problem, bad in (
            (f"{array.ndim}-D", array.ndim != 1),
            ("not contiguous", not array.flags.c_contiguous),
            ("read-only", not array.flags.writeable),
        )
        if bad
    ]
    if problems:
        raise ValueError(
            f"shuffle needs a writeable, contiguous 1-D array; this one is {', '.join(problems)}"
        )
    if len(array) < 2:
        random_state.shuffle(array)
        return
    name, key, pos, has_gauss, cached_gaussian = random_state.get_state()
    key = numpy.array(key, dtype=numpy.uint32)
    pos = implementation().legacy_shuffle(key, int(pos), array)
    random_state.set_state((name, key, pos, has_gauss, cached_gaussian))


def sample_index_dtype(sizes: numpy.ndarray, num_documents: int) -> type:
    """The sample index dtype for a stream of ``num_documents`` documents of these ``sizes``:
    int32 when every position and offset fits it, else int64 (megatron-core's choice)."""
    largest = max(num_documents, int(sizes.max()) if len(sizes) else 0)
    return numpy.int32 if largest <= INT32_MAX else numpy.int64


def sample_count(
    num_epochs: int,
    tokens_per_epoch: int,
    sequence_length: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> int:
    """The number of samples ``build_sample_idx`` cuts from the stream (its rows minus one)."""
    return int(
        implementation().sample_count(
            num_epochs,
            tokens_per_epoch,
            sequence_length,
            bool(drop_last_partial_sequence),
            1 if add_extra_token_to_sequence else 0,
        )
    )


def build_sample_idx(
    sizes: numpy.ndarray,
    document_indices: numpy.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> numpy.ndarray:
    """The 2-D sample index: row k holds (position in ``document_indices``, token offset) where
    sample k starts; row k + 1 where it ends. ``sizes`` are the token counts of each document
    id, ``document_indices`` the document ids in stream order (all epochs)."""
    sizes = _integers("sizes", sizes, numpy.int32)
    document_indices = _integers("document_indices", document_indices, numpy.int32)
    sequence_length = _positive("sequence_length", sequence_length)
    num_epochs = _positive("num_epochs", num_epochs)
    tokens_per_epoch = _positive("tokens_per_epoch", tokens_per_epoch)
    if len(document_indices) == 0 or len(sizes) == 0:
        raise ValueError("build_sample_idx needs at least one document")
    if sizes.min() < 0:
        raise ValueError(f"sizes must be >= 0, found {sizes.min()} at {int(sizes.argmin())}")
    extra = 1 if add_extra_token_to_sequence else 0
    num_samples = sample_count(
        num_epochs, tokens_per_epoch, sequence_length, drop_last_partial_sequence, extra
    )
    if num_samples < 0:
        raise ValueError(f"{num_epochs} epochs of {tokens_per_epoch} tokens cannot fill one sample")
    dtype = sample_index_dtype(sizes, len(document_indices))
    build = (
        implementation().build_sample_index_int32
        if dtype is numpy.int32
        else (implementation().build_sample_index_int64)
    )
    sample_index = build(sizes, document_indices, sequence_length, num_samples, extra)
    if sample_index[-1, 1] < 0:  # megatron-core fails the same build on an assert
        raise ValueError(
            "the stream ends with an empty document, so the last partial sample would start at "
            "token offset -1; drop empty documents or keep drop_last_partial_sequence"
        )
    return sample_index


def _output(name: str, array: Any, dtype: type, size: int | None = None) -> numpy.ndarray:
    if not isinstance(array, numpy.ndarray) or array.dtype != dtype or array.ndim != 1:
        found = (
            f"{array.dtype} array of shape {array.shape}"
            if isinstance(array, numpy.ndarray)
            else type(array).__name__
        )
        raise TypeError(
            f"{name} must be a 1-D numpy {numpy.dtype(dtype).name} array to fill "
            f"in place, got {found}"
        )
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError(f"{name} must be contiguous and writeable")
    if size is not None and len(array) != size:
        raise ValueError(f"{name} has {len(array)} entries, expected {size}")
    return array


def build_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    weights: Any,
    num_datasets: int,
    size: int,
    verbose: bool = False,
) -> None:
    """Fill ``dataset_index`` (int16) and ``dataset_sample_index`` (int64) for ``size`` samples
    drawn greedily so that every prefix follows ``weights`` as closely as possible."""
    weights = numpy.ascontiguousarray(weights, dtype=numpy.float64)
    if weights.ndim != 1 or len(weights) != num_datasets:
        raise ValueError(
            f"weights must hold num_datasets ({num_datasets}) values, got shape {weights.shape}"
        )
    if not 0 < num_datasets <= MAX_DATASETS:
        raise ValueError(f"num_datasets must be in 1..{MAX_DATASETS}, got {num_datasets}")
    if not numpy.all(numpy.isfinite(weights)) or (weights < 0).any():
        raise ValueError(f"weights must be finite and >= 0, got {weights.tolist()}")
    size = int(size)
    dataset_index = _output("dataset_index", dataset_index, numpy.int16)
    dataset_sample_index = _output("dataset_sample_index", dataset_sample_index, numpy.int64)
    if len(dataset_index) < size or len(dataset_sample_index) < size:
        raise ValueError(
            f"the output arrays hold {len(dataset_index)} and "
            f"{len(dataset_sample_index)} entries, fewer than size ({size})"
        )
    implementation().build_blending_indices(
        weights, dataset_index[:size], dataset_sample_index[:size]
    )
    if verbose:
        achieved = numpy.bincount(dataset_index[:size], minlength=num_datasets) / max(size, 1)
        for dataset, (wanted, got) in enumerate(zip(weights, achieved, strict=True)):
            print(f"dataset {dataset}: weight {wanted:.6f}, achieved {got:.6f}")


def build_exhaustive_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    sizes: Any,
    num_datasets: int,
) -> None:
    """Fill the outputs (``sum(sizes)`` entries) so that every sample of every dataset is used
    exactly once, interleaved in proportion to the sizes."""
    sizes = _integers("sizes", sizes, numpy.int64)
    if len(sizes) != num_datasets or not 0 < num_datasets <= MAX_DATASETS:
        raise ValueError(
            f"sizes must hold num_datasets ({num_datasets}) values, at most "
            f"{MAX_DATASETS}; got {len(sizes)}"
        )
    if (sizes <= 0).any():
        raise ValueError(f"sizes must all be positive, got {sizes.tolist()}")
    total = int(sizes.sum())
    dataset_index = _output("dataset_index", dataset_index, numpy.int16)
    dataset_sample_index = _output("dataset_sample_index", dataset_sample_index, numpy.int64)
    if len(dataset_index) < total or len(dataset_sample_index) < total:
        raise ValueError(f"the output arrays must hold sum(sizes) = {total} entries")
    implementation().build_exhaustive_blending_indices(
        sizes, dataset_index[:total], dataset_sample_index[:total]
    )


def gather_windows(
    tokens: numpy.ndarray,
    pointers: numpy.ndarray,
    lengths: numpy.ndarray,
    document_index: numpy.ndarray,
    sample_index: numpy.ndarray,
    shuffle_index: numpy.ndarray,
    samples: numpy.ndarray,
    extra: int,
    out: numpy.ndarray,
) -> numpy.ndarray:
    """TEMPORARY: per-sample loop until the batch kernel lands."""
    written = numpy.empty(len(samples), dtype=numpy.int64)
    for row, idx in enumerate(samples.tolist()):
        sample = int(shuffle_index[idx])
        (begin, begin_offset), (end, end_offset) = sample_index[sample : sample + 2].tolist()
        written[row] = implementation().gather_sample(
            tokens,
            pointers,
            lengths,
            document_index,
            begin,
            begin_offset,
            end,
            end_offset,
            extra,
            out[row],
        )
    return written


def fill_document_causal_mask(
    segment_start: numpy.ndarray, out: numpy.ndarray, threads: int = 1
) -> None:
    """TEMPORARY until the checked helper lands."""
    implementation().fill_document_causal_mask(segment_start, out, threads)
