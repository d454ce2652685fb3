"""The index builders, with megatron-core's names and signatures (``megatron.core.datasets.
helpers``), and the per-batch kernels of GPTDataset: inputs are checked here, then the active
backend (:mod:`megaindex.backends`: the C++ extension or the numpy fallback) runs.

Errors follow one convention, the same on both backends:

- A problem with an argument itself is found here, before any backend runs, and the message
  names the argument, what was expected and what was found: ``TypeError`` for an object that is
  not a numpy array or has the wrong dtype, ``ValueError`` for a wrong number of dimensions or
  shape, a non-contiguous array, a read-only output or a value out of its range.
- A problem found in the data while the work runs (a corrupt index: a document id, pointer,
  offset or position outside what it refers to) is an ``IndexError`` whose message is the same
  from the C++ and the numpy backend.
- A sample index that megatron-core's build refuses on an ``assert`` (a stream ending in an
  empty document, its last partial sample kept) is an :class:`~megaindex.errors.IndexBuildError`,
  a ``ValueError`` and an ``AssertionError``.

The builders convert inputs of another integer dtype when their values fit (they are built
once). ``WindowGatherer``, ``BlendGatherer`` and ``fill_document_causal_mask`` run per batch on
large tables and take every array as it is, never copying it: an array of another dtype is
refused, not converted. Outputs are always filled in place and must be exactly what is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy

from megaindex.backends import backend, implementation
from megaindex.errors import IndexBuildError


def _dtypes(*types: type) -> frozenset[numpy.dtype]:
    return frozenset(numpy.dtype(kind) for kind in types)


INT32_MAX = numpy.iinfo(numpy.int32).max
INT64_MAX = numpy.iinfo(numpy.int64).max
#: the largest seed numpy's RandomState takes
SEED_MAX = numpy.iinfo(numpy.uint32).max
#: shuffle indices of this many samples or more are int64 (megatron-core's limit)
UINT32_SHUFFLE_LIMIT = numpy.iinfo(numpy.uint32).max - 1
MAX_DATASETS = numpy.iinfo(numpy.int16).max
#: the dtypes a .bin holds that gather_windows widens to int64 (megafmt's integer dtypes)
TOKEN_DTYPES = _dtypes(numpy.uint8, numpy.int8, numpy.int16, numpy.uint16, numpy.int32, numpy.int64)
#: megatron-core's sample index and shuffle index dtypes (the int64 ones for huge datasets)
SAMPLE_INDEX_DTYPES = _dtypes(numpy.int32, numpy.int64)
SHUFFLE_INDEX_DTYPES = _dtypes(numpy.uint32, numpy.int64)
#: sample-index rows walked per step when the caller follows the walk (8 MB of int32 rows)
SAMPLE_INDEX_ROWS_PER_STEP = 1 << 20
#: what shuffle permutes: document indices (int32) and shuffle indices
SHUFFLE_DTYPES = _dtypes(numpy.int32, numpy.uint32, numpy.int64)
INT16 = _dtypes(numpy.int16)
INT32 = _dtypes(numpy.int32)
INT64 = _dtypes(numpy.int64)
BOOL = _dtypes(numpy.bool_)


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


def _non_negative(name: str, value: int) -> int:
    if int(value) != value or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _positive(name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


#: arrays shorter than this are shuffled by numpy itself: handing the generator's state to the
#: backend and back costs about 85 us, what numpy takes for some 5,000 elements (a blend of
#: thousands of small corpora shuffles thousands of short arrays)
NUMPY_SHUFFLES_BELOW = 4096


def shuffle(random_state: numpy.random.RandomState, array: numpy.ndarray) -> None:
    """``random_state.shuffle(array)``: the same permutation and the same state afterwards, run
    by the backend (the C++ one prefetches the swaps, several times faster on large arrays)."""
    array = _array("array", array, SHUFFLE_DTYPES, (None,), writeable=True)
    if len(array) < NUMPY_SHUFFLES_BELOW:
        random_state.shuffle(array)
        return
    state = random_state.get_state(legacy=False)
    if state["bit_generator"] != "MT19937":  # another generator's draws: numpy's own shuffle
        random_state.shuffle(array)
        return
    key = numpy.array(state["state"]["key"], dtype=numpy.uint32)
    pos = implementation().legacy_shuffle(key, int(state["state"]["pos"]), array)
    state["state"] = {"key": key, "pos": pos}
    random_state.set_state(state)


def sample_index_dtype(sizes: numpy.ndarray, num_documents: int) -> type:
    """The sample index dtype for a stream of ``num_documents`` documents of these ``sizes``:
    int32 when every position and offset fits it, else int64 (megatron-core's choice)."""
    if sizes.dtype.kind in "iu" and numpy.iinfo(sizes.dtype).max <= INT32_MAX:
        largest = num_documents  # the dtype bounds every size: no pass over a corpus's sizes
    else:
        largest = max(num_documents, int(sizes.max()) if len(sizes) else 0)
    return numpy.int32 if largest <= INT32_MAX else numpy.int64


def shuffle_index_dtype(total_size: int) -> type:
    """megatron-core's shuffle-index dtype: uint32 while it can hold every index, else int64."""
    return numpy.int64 if total_size >= UINT32_SHUFFLE_LIMIT else numpy.uint32


def sample_count(
    num_epochs: int,
    tokens_per_epoch: int,
    sequence_length: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> int:
    """The number of samples ``build_sample_idx`` cuts from the stream (its rows minus one)."""
    num_epochs = _positive("num_epochs", num_epochs)
    sequence_length = _positive("sequence_length", sequence_length)
    tokens_per_epoch = _non_negative("tokens_per_epoch", tokens_per_epoch)
    if max(num_epochs, sequence_length) > INT32_MAX or num_epochs * tokens_per_epoch > INT64_MAX:
        raise ValueError(
            f"num_epochs ({num_epochs}) and sequence_length ({sequence_length}) must fit int32 "
            f"and num_epochs * tokens_per_epoch ({tokens_per_epoch}) int64"
        )
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
    *,
    walked: Callable[[int], None] | None = None,
) -> numpy.ndarray:
    """The 2-D sample index: row k holds (position in ``document_indices``, token offset) where
    sample k starts; row k + 1 where it ends. ``sizes`` are the token counts of each document
    id, ``document_indices`` the document ids in stream order (all epochs).

    With ``walked``, the index is filled ``SAMPLE_INDEX_ROWS_PER_STEP`` rows at a time and
    ``walked(position)`` called after each: ``document_indices`` before ``position`` is not
    read again (a caller can release those pages of a mapped document index)."""
    sizes = _integers("sizes", sizes, numpy.int32)
    document_indices = _integers("document_indices", document_indices, numpy.int32)
    sequence_length = _positive("sequence_length", sequence_length)
    num_epochs = _positive("num_epochs", num_epochs)
    tokens_per_epoch = _non_negative("tokens_per_epoch", tokens_per_epoch)
    if len(sizes) and sizes.min() < 0:
        raise ValueError(f"sizes must be >= 0, found {sizes.min()} at {int(sizes.argmin())}")
    dtype = sample_index_dtype(sizes, len(document_indices))
    if tokens_per_epoch == 0:  # an empty split: no sample, one row (megatron-core's result)
        return numpy.zeros((1, 2), dtype=dtype)
    if len(document_indices) == 0 or len(sizes) == 0:
        raise ValueError(f"build_sample_idx has {tokens_per_epoch} tokens but no document")
    extra = 1 if add_extra_token_to_sequence else 0
    num_samples = sample_count(
        num_epochs, tokens_per_epoch, sequence_length, drop_last_partial_sequence, extra
    )
    if walked is None:
        build = (
            implementation().build_sample_index_int32
            if dtype is numpy.int32
            else (implementation().build_sample_index_int64)
        )
        sample_index = build(sizes, document_indices, sequence_length, num_samples, extra)
    else:
        sample_index = numpy.empty((num_samples + 1, 2), dtype=dtype)
        for first in range(0, num_samples + 1, SAMPLE_INDEX_ROWS_PER_STEP):
            last = min(first + SAMPLE_INDEX_ROWS_PER_STEP, num_samples + 1)
            implementation().fill_sample_index(
                sizes, document_indices, sequence_length, extra, sample_index, first, last
            )
            walked(int(sample_index[last - 1, 0]))
    if sample_index[-1, 1] < 0:
        raise _ends_in_empty_document()
    return sample_index


def _ends_in_empty_document() -> IndexBuildError:
    """What megatron-core's build fails an assert on: a last partial sample at offset -1."""
    return IndexBuildError(
        "the stream ends with an empty document, so the last partial sample would start at "
        "token offset -1; drop empty documents or keep drop_last_partial_sequence"
    )


def build_gpt_tables(
    sizes: numpy.ndarray,
    documents: numpy.ndarray,
    num_epochs: int,
    separate_final_epoch: bool,
    seed: int,
    sequence_length: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
    samples_before_final_epoch: int | None = None,
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """GPTDataset's three tables of the split made of ``documents`` (ids into ``sizes``), as
    megatron-core draws them from ``numpy.random.RandomState(seed)``: the document index
    (``documents`` once per epoch, shuffled, the last epoch apart with
    ``separate_final_epoch``), the sample index (:func:`build_sample_idx`) and the shuffle
    index (the samples before the last epoch, ``samples_before_final_epoch``, shuffled apart
    from the rest when the last epoch is separate). One call: a blend of thousands of small
    corpora builds thousands of these."""
    sizes = _integers("sizes", sizes, numpy.int32)
    documents = _integers("documents", documents, numpy.int32)
    num_epochs = _positive("num_epochs", num_epochs)
    sequence_length = _positive("sequence_length", sequence_length)
    tokens_per_epoch = _positive("tokens_per_epoch", tokens_per_epoch)
    if int(seed) != seed or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer in 0..2**32 - 1, got {seed!r}")
    # the lengths the split's walk reads, not the whole corpus's: a small split of a corpus of
    # 146M documents checked 584 MB of lengths (an id out of range is the walk's own error)
    read = documents[(documents >= 0) & (documents < len(sizes))]
    lengths = sizes[read]
    if len(lengths) and lengths.min() < 0:
        found = int(lengths.argmin())
        raise ValueError(f"sizes must be >= 0, found {lengths[found]} at {int(read[found])}")
    if len(documents) == 0:
        raise ValueError(f"build_gpt_tables has {tokens_per_epoch} tokens but no document")
    extra = 1 if add_extra_token_to_sequence else 0
    num_samples = sample_count(
        num_epochs, tokens_per_epoch, sequence_length, drop_last_partial_sequence, extra
    )
    first = num_samples
    if separate_final_epoch and num_epochs > 1:
        if samples_before_final_epoch is None:
            raise ValueError("samples_before_final_epoch must be given: the last epoch is separate")
        first = _non_negative("samples_before_final_epoch", samples_before_final_epoch)
        if first > num_samples:
            raise ValueError(
                f"samples_before_final_epoch ({first}) exceeds the {num_samples} samples"
            )
    tables = implementation().build_gpt_tables(
        sizes,
        documents,
        num_epochs,
        bool(separate_final_epoch),
        int(seed),
        sequence_length,
        extra,
        num_samples,
        first,
        sample_index_dtype(sizes, num_epochs * len(documents)) is numpy.int64,
        shuffle_index_dtype(num_samples) is numpy.int64,
    )
    if tables[1][-1, 1] < 0:
        raise _ends_in_empty_document()
    return tables


def _dtype_names(dtypes: frozenset[numpy.dtype]) -> str:
    names = [dtype.name for dtype in sorted(dtypes, key=lambda dtype: dtype.num)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _array(
    name: str,
    array: Any,
    dtypes: frozenset[numpy.dtype],
    shape: tuple[int | None, ...],
    writeable: bool = False,
) -> numpy.ndarray:
    """``array`` itself, never a copy, checked to be a C-contiguous numpy array of one of
    ``dtypes`` whose shape matches ``shape`` (None: any size), writeable if asked. Called per
    batch, so the checks are plain comparisons."""
    if not isinstance(array, numpy.ndarray):
        raise TypeError(
            f"{name} must be a numpy array of {_dtype_names(dtypes)}, got {type(array).__name__}"
        )
    if array.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {array.dtype}")
    found = array.shape
    fits = len(found) == len(shape)
    for axis, size in enumerate(shape):  # a loop: a generator costs a microsecond more
        if fits and size is not None and size != found[axis]:
            fits = False
    if not fits:
        sizes = ["any" if size is None else str(size) for size in shape]
        wanted = f"({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"
        raise ValueError(f"{name} must have shape {wanted}, got {found}")
    flags = array.flags
    if not flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {array.strides}")
    if writeable and not flags.writeable:
        raise ValueError(f"{name} must be writeable, got a read-only array")
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
    if int(size) != size or size < 0:
        raise ValueError(f"size must be an integer >= 0, got {size!r}")
    size = int(size)
    dataset_index = _array("dataset_index", dataset_index, INT16, (None,), True)
    dataset_sample_index = _array(
        "dataset_sample_index", dataset_sample_index, INT64, (None,), True
    )
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
    total = sum(sizes.tolist())  # Python integers: a sum past int64 is not wrapped
    dataset_index = _array("dataset_index", dataset_index, INT16, (None,), True)
    dataset_sample_index = _array(
        "dataset_sample_index", dataset_sample_index, INT64, (None,), True
    )
    if len(dataset_index) < total or len(dataset_sample_index) < total:
        raise ValueError(f"the output arrays must hold sum(sizes) = {total} entries")
    implementation().build_exhaustive_blending_indices(
        sizes, dataset_index[:total], dataset_sample_index[:total]
    )


def fill_document_causal_mask(
    segment_start: numpy.ndarray, out: numpy.ndarray, threads: int = 1
) -> None:
    """Fill ``out`` (bool ``[L, L]``, True = masked) with the causal attention mask of a window
    of L tokens that packs several documents: row r attends to columns ``segment_start[r]`` to
    r, ``segment_start`` (int64 ``[L]``) being where the document holding token r begins (see
    :func:`megaindex.sample.segment_starts`). ``threads`` splits the rows of long windows."""
    segment_start = _array("segment_start", segment_start, INT64, (None,))
    length = len(segment_start)
    out = _array("out", out, BOOL, (length, length), writeable=True)
    threads = _positive("threads", threads)
    implementation().fill_document_causal_mask(segment_start, out, threads)


def fim_assemble(
    sample: numpy.ndarray,
    inserted: numpy.ndarray,
    runs: numpy.ndarray,
    out: numpy.ndarray,
    pad: int,
) -> int:
    """Lay out a fill-in-the-middle sample: the runs ``runs`` lists (int64 ``[K, 3]`` rows of
    source, start, stop; source 0 is ``sample``, 1 is ``inserted``, both int64 ``[N]``) are
    written one after another into ``out`` (int64 ``[W]``), cut at W tokens and filled up with
    ``pad``. Returns how many tokens the runs hold before the cut. ``out`` must not overlap
    ``sample`` or ``inserted``: the runs read them while it is written."""
    sample = _array("sample", sample, INT64, (None,))
    inserted = _array("inserted", inserted, INT64, (None,))
    runs = _array("runs", runs, INT64, (None, 3))
    out = _array("out", out, INT64, (None,), writeable=True)
    if numpy.may_share_memory(out, sample) or numpy.may_share_memory(out, inserted):
        raise ValueError("out must not overlap sample or inserted: copy the sample first")
    return implementation().fim_assemble(sample, inserted, runs, out, int(pad))


class _BatchKernel:
    """What WindowGatherer and BlendGatherer share: a native kernel bound once, called per
    batch. The extension checks a batch's arguments itself (the checks here then only name what
    it refused); the numpy fallback is checked first."""

    _kernel: Any
    _checks_itself: bool

    def _bind(self, kernel: Any) -> None:
        self._kernel = kernel
        self._checks_itself = backend() == "cpp"

    def gather(self, samples: list[int], out: numpy.ndarray) -> list[int]:
        """Fill the rows of ``out`` with the windows of ``samples``; the tokens each got."""
        if self._checks_itself:
            try:
                return self._kernel.gather(samples, out)
            except (TypeError, ValueError):
                _check_batch(samples, out)
                raise
        _check_batch(samples, out)
        return self._kernel.gather(samples, out)

    def __reduce__(self) -> Any:
        raise TypeError(f"a {type(self).__name__} holds native state: make one in each process")


class WindowGatherer(_BatchKernel):
    """GPTDataset's windows of one corpus and one split's tables: ``gather(samples, out)``
    writes the tokens of dataset samples ``samples`` into the rows of ``out``, widened to
    int64, and returns how many each row got; later positions of a row are left as they are,
    for the caller to pad.

    Row b holds sample ``s = shuffle_index[samples[b]]``: with ``(begin, begin_offset) =
    sample_index[s]`` and ``(end, end_offset) = sample_index[s + 1]``, the documents
    ``document_index[begin..end]`` back to back, the first from ``begin_offset``, the last up
    to ``end_offset + extra`` (exclusive), those between whole.

    ``tokens`` is the whole ``.bin`` as one 1-D array (uint8, int8, int16, uint16, int32 or
    int64; read-only views of a memory map are fine), ``pointers`` (int64) and ``lengths``
    (int32) the byte offset and token count of each sequence, ``document_index`` (int32),
    ``sample_index`` (int32 or int64, ``[N + 1, 2]``) and ``shuffle_index`` (uint32 or int64,
    ``[N]``) GPTDataset's tables, ``extra`` 0 or 1 (``add_extra_token_to_sequence``); each
    batch gives ``samples`` (a list of dataset indices) and ``out``, a writeable int64
    ``[len(samples), W]`` array. No array is copied: they are checked once, here, and kept. A
    value of the tables that points outside what it refers to, or a sample longer than W, is
    an IndexError naming the sample, the document and the value.
    """

    def __init__(
        self,
        tokens: numpy.ndarray,
        pointers: numpy.ndarray,
        lengths: numpy.ndarray,
        document_index: numpy.ndarray,
        sample_index: numpy.ndarray,
        shuffle_index: numpy.ndarray,
        extra: int,
    ) -> None:
        _array("tokens", tokens, TOKEN_DTYPES, (None,))
        _array("pointers", pointers, INT64, (None,))
        _array("lengths", lengths, INT32, (len(pointers),))
        _array("document_index", document_index, INT32, (None,))
        _array("sample_index", sample_index, SAMPLE_INDEX_DTYPES, (None, 2))
        _array("shuffle_index", shuffle_index, SHUFFLE_INDEX_DTYPES, (None,))
        if extra not in (0, 1) or isinstance(extra, float):
            raise ValueError(f"extra must be 0 or 1, got {extra!r}")
        self._bind(
            implementation().WindowGatherer(
                tokens, pointers, lengths, document_index, sample_index, shuffle_index, int(extra)
            )
        )


class BlendGatherer(_BatchKernel):
    """A blend's windows: ``gather(indices, out)`` writes blend sample ``indices[b]`` (sample
    ``dataset_sample_index[i]`` of part ``dataset_index[i]``, read by that part's
    :class:`WindowGatherer`) into row b of ``out`` and returns how many tokens each row got;
    the whole batch in one call, whatever parts its rows come from. ``dataset_index`` (int16)
    and ``dataset_sample_index`` (int64) are BlendedDataset's tables, checked once, here. An
    index outside the tables, or a part's error, is an IndexError naming the blend sample."""

    def __init__(
        self,
        parts: list[WindowGatherer],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> None:
        if not all(isinstance(part, WindowGatherer) for part in parts):
            raise TypeError(f"parts must be WindowGatherers, got {parts!r}")
        _array("dataset_index", dataset_index, INT16, (None,))
        _array("dataset_sample_index", dataset_sample_index, INT64, (len(dataset_index),))
        self._bind(
            implementation().BlendGatherer(
                [part._kernel for part in parts], dataset_index, dataset_sample_index
            )
        )


def _check_batch(samples: Any, out: Any) -> None:
    """Raise the error that names what is wrong with a batch's arguments, if anything."""
    if not isinstance(samples, list) or any(type(sample) is not int for sample in samples):
        raise TypeError(f"samples must be a list of ints, got {samples!r}")
    _array("out", out, INT64, (len(samples), None), writeable=True)
