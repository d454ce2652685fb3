"""The per-batch kernels, ``helpers.WindowGatherer``, ``helpers.BlendGatherer`` and
``helpers.fill_document_causal_mask``: values checked by hand and against the token stream,
the same arrays and the same errors from the C++ and the numpy backend, and arguments refused
naming them."""

from __future__ import annotations

import numpy
import pytest

from megaindex import build_sample_idx, helpers
from megaindex.sample import segment_starts

BACKENDS = ("cpp", "numpy")


def outcome(function, *arguments):
    """What a call gives, comparable across backends: its result or its error."""
    try:
        return ("result", function(*arguments).tolist())
    except (IndexError, TypeError, ValueError) as error:
        return (type(error).__name__, str(error))


# documents 0 and 1 hold [10, 11, 12, 13] and [20, 21, 22, 23, 24, 25] (uint16, so byte
# pointers 0 and 8); the stream is documents 1, 0, 1:
#   20 21 22 23 24 25 | 10 11 12 13 | 20 21 22 23 24 25
# samples of 4 tokens (+1 extra) start every 4 tokens: at stream positions 0, 4, 8, that is
# (document_index position, offset) (0, 0), (0, 4), (1, 2), and the last ends at 12 = (2, 2)
def gather_windows(
    tokens, pointers, lengths, document_index, sample_index, shuffle_index, samples, extra, out
):
    """One batch of a freshly made WindowGatherer (``samples`` an int64 array): the counts
    each row got, as an int64 array."""
    gatherer = helpers.WindowGatherer(
        tokens, pointers, lengths, document_index, sample_index, shuffle_index, extra
    )
    return numpy.array(gatherer.gather(samples.tolist(), out), dtype=numpy.int64)


def corpus() -> dict:
    return dict(
        tokens=numpy.array([10, 11, 12, 13, 20, 21, 22, 23, 24, 25], numpy.uint16),
        pointers=numpy.array([0, 8], numpy.int64),
        lengths=numpy.array([4, 6], numpy.int32),
        document_index=numpy.array([1, 0, 1], numpy.int32),
        sample_index=numpy.array([[0, 0], [0, 4], [1, 2], [2, 2]], numpy.int32),
        shuffle_index=numpy.array([2, 0, 1], numpy.uint32),
        samples=numpy.array([0, 2, 1], numpy.int64),
        extra=1,
        out=numpy.full((3, 7), -1, numpy.int64),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_worked_windows(backend, use_backend):
    use_backend(backend)
    arguments = corpus()
    written = gather_windows(**arguments)
    assert written.dtype == numpy.int64
    assert written.tolist() == [5, 5, 5]
    # dataset samples 0, 2, 1 are shuffled samples 2, 1, 0; what follows each is left as it was
    assert arguments["out"].tolist() == [
        [12, 13, 20, 21, 22, -1, -1],  # stream tokens 8..12
        [24, 25, 10, 11, 12, -1, -1],  # 4..8
        [20, 21, 22, 23, 24, -1, -1],  # 0..4
    ]
    arguments["extra"] = 0
    arguments["out"][:] = -1
    assert gather_windows(**arguments).tolist() == [4, 4, 4]
    assert arguments["out"][:, :5].tolist() == [
        [12, 13, 20, 21, -1],
        [24, 25, 10, 11, -1],
        [20, 21, 22, 23, -1],
    ]


@pytest.mark.parametrize("token_dtype", ["uint8", "int8", "int16", "uint16", "int32", "int64"])
@pytest.mark.parametrize("seed", range(3))
def test_windows_are_the_stream_cut_every_sequence_length(token_dtype, seed, use_backend):
    rng = numpy.random.default_rng(seed)
    lengths = rng.integers(1, 30, 60).astype(numpy.int32)
    itemsize = numpy.dtype(token_dtype).itemsize
    pointers = numpy.concatenate([[0], numpy.cumsum(lengths[:-1], dtype=numpy.int64)]) * itemsize
    tokens = rng.integers(0, 100, int(lengths.sum())).astype(token_dtype)
    document_index = numpy.tile(numpy.arange(60, dtype=numpy.int32), 2)
    rng.shuffle(document_index)
    # the documents in stream order, read one by one
    stream = numpy.concatenate(
        [tokens[pointers[d] // itemsize :][: lengths[d]] for d in document_index]
    )
    sequence_length = int(rng.integers(1, 50))
    sample_index = build_sample_idx(lengths, document_index, sequence_length, 1, len(stream))
    count = len(sample_index) - 1
    samples = rng.integers(0, count, 40).astype(numpy.int64)
    for sample_dtype in (numpy.int32, numpy.int64):
        for shuffle_dtype in (numpy.uint32, numpy.int64):
            shuffle_index = rng.permutation(count).astype(shuffle_dtype)
            results = []
            for backend in BACKENDS:
                use_backend(backend)
                out = numpy.full((40, sequence_length + 1), -7, numpy.int64)
                written = gather_windows(
                    tokens,
                    pointers,
                    lengths,
                    document_index,
                    sample_index.astype(sample_dtype),
                    shuffle_index,
                    samples,
                    1,
                    out,
                )
                results.append((written.tolist(), out.tolist()))
            assert results[0] == results[1]
            starts = shuffle_index[samples].astype(numpy.int64) * sequence_length
            expected = [stream[start : start + sequence_length + 1].tolist() for start in starts]
            assert results[0] == ([sequence_length + 1] * 40, expected)


def corrupted(change: dict) -> dict:
    """The corpus's arguments with ``change``; ``out`` has a row per sample."""
    arguments = corpus()
    if "samples" in change:
        arguments["out"] = numpy.full((len(change["samples"]), 7), -1, numpy.int64)
    arguments.update(change)
    return arguments


# each a corrupt table or a window too small, and the message both backends give
CORRUPT = [
    ({"samples": numpy.array([0, 3], numpy.int64)}, "sample 3: outside shuffle_index's 3 entries"),
    ({"samples": numpy.array([-1], numpy.int64)}, "sample -1: outside shuffle_index's 3 entries"),
    (
        {"shuffle_index": numpy.array([3, 0, 1], numpy.uint32)},
        r"sample 0: shuffle_index\[0\] = 3 needs rows outside sample_index's 4",
    ),
    (
        {"shuffle_index": numpy.array([-1, 0, 1], numpy.int64)},
        r"sample 0: shuffle_index\[0\] = -1 needs rows outside sample_index's 4",
    ),
    (
        {"sample_index": numpy.array([[0, 0], [0, 4], [1, 2], [3, 2]], numpy.int32)},
        r"sample 0: spans document_index\[1\.\.3\], outside its 3 entries",
    ),
    (
        {"sample_index": numpy.array([[0, 0], [0, 4], [1, 2], [0, 2]], numpy.int64)},
        r"sample 0: spans document_index\[1\.\.0\], outside its 3 entries",
    ),
    (
        {"document_index": numpy.array([1, 7, 1], numpy.int32)},
        r"sample 0: document 7 at document_index\[1\] is not one of the 2 sequences",
    ),
    (
        {"pointers": numpy.array([-2, 8], numpy.int64)},
        "sample 0: document 0 starts at byte -2, not a token boundary of the .bin",
    ),
    (
        {"pointers": numpy.array([3, 8], numpy.int64)},
        "sample 0: document 0 starts at byte 3, not a token boundary of the .bin",
    ),
    (
        {"pointers": numpy.array([2**62, 8], numpy.int64)},
        rf"sample 0: document 0 starts at byte {2**62}, past the end of the .bin \(20 bytes\)",
    ),
    (  # document 1 moved to token 6 of 10: sample 0 reads its first 3 tokens, sample 2 all 6
        {"pointers": numpy.array([0, 12], numpy.int64)},
        r"sample 2: document 1 needs tokens up to 6 from token 6, past the end of the \.bin "
        r"\(10 tokens\)",
    ),
    (
        {"lengths": numpy.array([4, -3], numpy.int32)},
        r"sample 0: tokens \[0, 3\) are outside document 1, which has -3",
    ),
    (
        {"sample_index": numpy.array([[0, 0], [0, 4], [1, 5], [2, 2]], numpy.int32)},
        r"sample 0: tokens \[5, 4\) are outside document 0, which has 4",
    ),
    (  # an end offset whose + extra would wrap around in int64
        {"sample_index": numpy.array([[0, 0], [0, 4], [1, 2], [2, 2**63 - 1]], numpy.int64)},
        rf"sample 0: tokens \[0, {2**63}\) are outside document 1, which has 6",
    ),
    (
        {"out": numpy.full((3, 4), -1, numpy.int64)},
        "sample 0: needs room for more than the 4 tokens of a row of out",
    ),
]


@pytest.mark.parametrize("change,message", CORRUPT)
def test_corrupt_tables_are_the_same_index_error_on_both_backends(change, message, use_backend):
    outcomes, outs = [], []
    for backend in BACKENDS:
        use_backend(backend)
        arguments = corrupted(change)
        with pytest.raises(IndexError, match=message):
            gather_windows(**arguments)
        arguments["out"][:] = -1
        outcomes.append(outcome(gather_windows, *arguments.values()))
        outs.append(arguments["out"].tolist())
    assert outcomes[0] == outcomes[1]
    assert outs[0] == outs[1]  # the rows before the error are filled alike


def test_a_one_byte_corpus_pointer_that_would_wrap_is_refused(use_backend):
    arguments = corpus()
    arguments["tokens"] = arguments["tokens"].astype(numpy.uint8)
    arguments["pointers"] = numpy.array([0, 2**63 - 2], numpy.int64)
    for backend in BACKENDS:
        use_backend(backend)
        with pytest.raises(IndexError, match=f"starts at byte {2**63 - 2}, past the end"):
            gather_windows(**arguments)


def read_only(array: numpy.ndarray) -> numpy.ndarray:
    array.flags.writeable = False
    return array


# each an argument problem, and the error the helper raises before any backend runs
BAD_ARGUMENTS = [
    ({"tokens": [1, 2]}, TypeError, "tokens must be a numpy array of int8, .* or int64, got list"),
    (
        {"tokens": numpy.zeros(10, numpy.float32)},
        TypeError,
        "tokens must be int8, uint8, int16, uint16, int32 or int64, got float32",
    ),
    ({"tokens": numpy.zeros((2, 5), numpy.uint16)}, ValueError, r"tokens must have shape \(any,\)"),
    (
        {"tokens": numpy.zeros(20, numpy.uint16)[::2]},
        ValueError,
        r"tokens must be C-contiguous, got strides \(4,\)",
    ),
    ({"pointers": numpy.zeros(2, numpy.uint64)}, TypeError, "pointers must be int64, got uint64"),
    ({"lengths": numpy.zeros(2, numpy.int64)}, TypeError, "lengths must be int32, got int64"),
    (
        {"lengths": numpy.zeros(3, numpy.int32)},
        ValueError,
        r"lengths must have shape \(2,\), got \(3,\)",
    ),
    (
        {"document_index": numpy.zeros(3, numpy.int64)},
        TypeError,
        "document_index must be int32, got int64",
    ),
    (
        {"sample_index": numpy.zeros((4, 3), numpy.int32)},
        ValueError,
        r"sample_index must have shape \(any, 2\), got \(4, 3\)",
    ),
    (
        {"sample_index": numpy.zeros((4, 2), numpy.uint32)},
        TypeError,
        "sample_index must be int32 or int64, got uint32",
    ),
    (
        {"sample_index": numpy.asfortranarray(numpy.zeros((4, 2), numpy.int32))},
        ValueError,
        "sample_index must be C-contiguous",
    ),
    (
        {"shuffle_index": numpy.zeros(3, numpy.int32)},
        TypeError,
        "shuffle_index must be uint32 or int64, got int32",
    ),
    ({"extra": 2}, ValueError, "extra must be 0 or 1, got 2"),
    ({"out": numpy.zeros((3, 7), numpy.int32)}, TypeError, "out must be int64, got int32"),
    (
        {"out": numpy.zeros((2, 7), numpy.int64)},
        ValueError,
        r"out must have shape \(3, any\), got \(2, 7\)",
    ),
    ({"out": numpy.zeros(21, numpy.int64)}, ValueError, r"out must have shape \(3, any\)"),
    (
        {"out": read_only(numpy.zeros((3, 7), numpy.int64))},
        ValueError,
        "out must be writeable, got a read-only array",
    ),
]


@pytest.fixture
def no_backend(monkeypatch):
    """Fails the test if a helper reaches a backend."""
    monkeypatch.setattr(helpers, "implementation", lambda: pytest.fail("a backend was called"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change,error,message", BAD_ARGUMENTS)
def test_gather_windows_arguments_are_refused_naming_them(
    change, error, message, backend, use_backend
):
    # the extension refuses them itself (the helper then names what it refused); the numpy
    # fallback is guarded by the helper's checks before it runs
    use_backend(backend)
    arguments = corrupted(change)
    before = {name: value.copy() for name, value in arguments.items() if name == "out"}
    with pytest.raises(error, match=message):
        gather_windows(**arguments)
    if "out" in before and isinstance(arguments["out"], numpy.ndarray):
        numpy.testing.assert_array_equal(arguments["out"], before["out"])  # nothing written


def test_read_only_tables_are_taken_as_they_are(use_backend):
    # a memory-mapped corpus and cached tables are read-only views: never copied, accepted
    arguments = corpus()
    for name in ("tokens", "pointers", "lengths", "document_index", "sample_index"):
        read_only(arguments[name])
    for backend in BACKENDS:
        use_backend(backend)
        assert gather_windows(**arguments).tolist() == [5, 5, 5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_worked_document_mask(backend, use_backend):
    use_backend(backend)
    out = numpy.ones((3, 3), numpy.bool_)
    # tokens 0 and 1 are one document, token 2 begins the next
    helpers.fill_document_causal_mask(numpy.array([0, 0, 2], numpy.int64), out)
    assert out.tolist() == [[False, True, True], [False, False, True], [True, True, False]]


@pytest.mark.parametrize("seed", range(6))
def test_document_masks_agree(seed, use_backend):
    rng = numpy.random.default_rng(seed)
    length = int(rng.integers(1, 1200))  # past 256 rows the C++ fill uses threads
    starts = segment_starts(rng.integers(0, 4, length), 0)[0]
    masks = []
    for backend, threads in [("cpp", 1), ("cpp", 3), ("numpy", 1)]:
        use_backend(backend)
        out = numpy.empty((length, length), numpy.bool_)
        helpers.fill_document_causal_mask(starts, out, threads)
        masks.append(out)
    columns = numpy.arange(length)
    expected = (columns[None, :] < starts[:, None]) | (columns[None, :] > columns[:, None])
    for mask in masks:
        numpy.testing.assert_array_equal(mask, expected)


def test_segment_starts_outside_their_row_are_the_same_index_error(use_backend):
    outcomes = []
    for backend in BACKENDS:
        use_backend(backend)
        out = numpy.zeros((3, 3), numpy.bool_)
        starts = numpy.array([0, 2, 0], numpy.int64)
        with pytest.raises(IndexError, match=r"segment_start\[1\] = 2 is outside 0\.\.1"):
            helpers.fill_document_causal_mask(starts, out)
        assert not out.any()
        outcomes.append(outcome(helpers.fill_document_causal_mask, starts, out))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(
    "segment_start,out,threads,error,message",
    [
        (numpy.zeros(3, numpy.int64), numpy.zeros((2, 2), bool), 1, ValueError, r"\(3, 3\), got"),
        (numpy.zeros(3, numpy.int64), numpy.zeros((3, 4), bool), 1, ValueError, r"\(3, 3\), got"),
        (numpy.zeros(3, numpy.int64), numpy.zeros((3, 3), numpy.uint8), 1, TypeError, "bool"),
        (numpy.zeros(3, numpy.int32), numpy.zeros((3, 3), bool), 1, TypeError, "int64, got int32"),
        (numpy.zeros(3, numpy.int64), numpy.zeros((3, 3), bool).T, 1, ValueError, "C-contiguous"),
        (numpy.zeros(3, numpy.int64), read_only(numpy.zeros((3, 3), bool)), 1, ValueError, "writ"),
        (numpy.zeros(3, numpy.int64), numpy.zeros((3, 3), bool), 0, ValueError, "threads must"),
    ],
)
def test_document_mask_arguments_are_refused_by_the_helper(
    segment_start, out, threads, error, message, no_backend
):
    with pytest.raises(error, match=message):
        helpers.fill_document_causal_mask(segment_start, out, threads)


def window_gatherer(arguments: dict) -> helpers.WindowGatherer:
    tables = {k: v for k, v in arguments.items() if k not in ("samples", "out")}
    return helpers.WindowGatherer(**tables)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_blend_gathers_each_row_through_its_part(backend, use_backend):
    use_backend(backend)
    # part 0 is the hand-worked corpus; part 1 the same tables over other token values
    first, second = corpus(), corpus()
    second["tokens"] = second["tokens"] + 100
    parts = [window_gatherer(first), window_gatherer(second)]
    dataset_index = numpy.array([1, 0, 0, 1], numpy.int16)
    dataset_sample_index = numpy.array([2, 0, 1, 0], numpy.int64)
    blend = helpers.BlendGatherer(parts, dataset_index, dataset_sample_index)
    out = numpy.full((3, 7), -1, numpy.int64)
    assert blend.gather([3, 1, 0], out) == [5, 5, 5]
    # blend 3 is part 1's sample 0, blend 1 part 0's sample 0, blend 0 part 1's sample 2
    assert out.tolist() == [
        [112, 113, 120, 121, 122, -1, -1],
        [12, 13, 20, 21, 22, -1, -1],
        [124, 125, 110, 111, 112, -1, -1],
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_blend_gatherer_names_the_blend_sample_at_fault(backend, use_backend):
    use_backend(backend)
    parts = [window_gatherer(corpus())]
    index, samples = numpy.array([0, 1], numpy.int16), numpy.array([0, 7], numpy.int64)
    blend = helpers.BlendGatherer(parts, index, samples)
    out = numpy.zeros((1, 7), numpy.int64)
    with pytest.raises(IndexError, match="^blend sample 5: outside its 2 samples$"):
        blend.gather([5], out)
    with pytest.raises(IndexError, match="^blend sample 1: dataset_index holds 1, not one of"):
        blend.gather([1], out)
    index[1] = 0
    with pytest.raises(
        IndexError, match=r"^blend sample 1 \(dataset 0\): sample 7: outside shuffle_index's 3"
    ):
        blend.gather([1], out)
    with pytest.raises(TypeError, match="parts must be WindowGatherers"):
        helpers.BlendGatherer([object()], index, samples)
    with pytest.raises(ValueError, match=r"out must have shape \(2, any\)"):
        blend.gather([0, 1], out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_names_samples_that_are_not_ints(backend, use_backend):
    use_backend(backend)
    gatherer = window_gatherer(corpus())
    with pytest.raises(TypeError, match=r"samples must be a list of ints, got \[0, 1.5\]"):
        gatherer.gather([0, 1.5], numpy.zeros((2, 7), numpy.int64))
