"""build_sample_idx and the blending builders on cases worked out by hand, and their checks."""

import numpy
import pytest

from megaindex import (
    IndexBuildError,
    _numpy_backend,
    build_blending_indices,
    build_exhaustive_blending_indices,
    build_sample_idx,
)
from megaindex.helpers import build_gpt_tables, sample_count

# documents 0, 1, 2 hold 5, 3 and 4 tokens; the stream is document 2, then 0, then 1:
# document 2 covers tokens [0, 4), document 0 [4, 9), document 1 [9, 12)
SIZES = numpy.array([5, 3, 4], dtype=numpy.int32)
STREAM = numpy.array([2, 0, 1], dtype=numpy.int32)


@pytest.mark.parametrize(
    "drop_last,extra,expected",
    [
        # samples of 3 (+1 extra) tokens start at 0, 3, 6 and the last ends at 9:
        # 11 usable tokens give 3 whole samples
        (True, True, [[0, 0], [0, 3], [1, 2], [2, 0]]),
        # without the extra token a sample ending exactly at a document's end stays in it:
        # token 9 is position 1 offset 5, one past document 0's last token
        (False, False, [[0, 0], [0, 3], [1, 2], [1, 5], [2, 3]]),
        # a 4th, partial sample: the stream runs out, so it parks on the last token of the
        # last document (document 1, 3 tokens: offset 3 - 1)
        (False, True, [[0, 0], [0, 3], [1, 2], [2, 0], [2, 2]]),
    ],
)
def test_hand_worked_sample_index(drop_last, extra, expected):
    index = build_sample_idx(SIZES, STREAM, 3, 1, 12, drop_last, extra)
    assert index.dtype == numpy.int32
    assert index.tolist() == expected


def test_inputs_of_other_integer_dtypes_are_accepted():
    index = build_sample_idx(SIZES.astype(numpy.int64), STREAM.astype(numpy.uint8), 3, 1, 12)
    assert index.tolist() == [[0, 0], [0, 3], [1, 2], [2, 0]]


@pytest.mark.parametrize(
    "sizes,stream,length,error,message",
    [
        (SIZES.astype(float), STREAM, 3, TypeError, "sizes must hold integers, got dtype float64"),
        (SIZES, STREAM.reshape(3, 1), 3, ValueError, r"document_indices must be 1-D"),
        (
            numpy.array([2**31], dtype=numpy.int64),
            STREAM[:1] * 0,
            3,
            ValueError,
            r"sizes holds values 2147483648..2147483648, outside int32",
        ),
        (
            SIZES,
            numpy.array([2, 7, 1], dtype=numpy.int32),
            3,
            IndexError,
            r"document_index\[1\] = 7 is not a document id: expected 0..2",
        ),
        (SIZES, STREAM, 0, ValueError, "sequence_length must be a positive integer, got 0"),
        (SIZES, STREAM[:0], 3, ValueError, "12 tokens but no document"),
    ],
)
def test_bad_inputs_are_named(sizes, stream, length, error, message):
    with pytest.raises(error, match=message):
        build_sample_idx(sizes, stream, length, 1, 12)


def test_a_stream_ending_with_an_empty_document_cannot_keep_its_partial_sample():
    sizes = numpy.array([5, 0], dtype=numpy.int32)
    with pytest.raises(IndexBuildError, match="ends with an empty document") as raised:
        build_sample_idx(sizes, numpy.array([0, 1], dtype=numpy.int32), 3, 1, 5, False, True)
    # megatron-core asserts there: its callers catch an AssertionError (and ours a ValueError)
    assert isinstance(raised.value, AssertionError) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("extra", [True, False])
def test_no_tokens_give_one_row_and_no_sample(drop_last, extra):
    sizes = numpy.array([0, 0, 7], dtype=numpy.int32)
    for stream in ([], [0, 1]):
        index = build_sample_idx(sizes, numpy.array(stream, numpy.int32), 4, 1, 0, drop_last, extra)
        assert index.tolist() == [[0, 0]] and index.dtype == numpy.int32
    assert sample_count(1, 0, 4, drop_last, extra) == 0
    assert _numpy_backend.sample_count(1, 0, 4, drop_last, int(extra)) == 0  # C's division


def test_hand_worked_blending():
    index, sample = numpy.zeros(4, numpy.int16), numpy.zeros(4, numpy.int64)
    # step i picks the dataset whose count lags weight * max(i, 1) most, ties to the first
    build_blending_indices(index, sample, [0.5, 0.5], 2, 4, False)
    assert index.tolist() == [0, 1, 0, 1]
    assert sample.tolist() == [0, 0, 1, 1]


def test_hand_worked_exhaustive_blending():
    index, sample = numpy.zeros(3, numpy.int16), numpy.zeros(3, numpy.int64)
    # weights 1/3 and 2/3; dataset 0 leaves the draw after its single sample
    build_exhaustive_blending_indices(index, sample, [1, 2], 2)
    assert index.tolist() == [1, 0, 1]
    assert sample.tolist() == [0, 0, 1]


def test_blending_outputs_are_checked():
    good_index, good_sample = numpy.zeros(4, numpy.int16), numpy.zeros(4, numpy.int64)
    with pytest.raises(TypeError, match="dataset_index must be int16, got int32"):
        build_blending_indices(numpy.zeros(4, numpy.int32), good_sample, [1.0], 1, 4)
    with pytest.raises(TypeError, match="dataset_index must be a numpy array of int16, got list"):
        build_blending_indices([0] * 4, good_sample, [1.0], 1, 4)
    readonly = numpy.zeros(4, numpy.int64)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="dataset_sample_index must be writeable"):
        build_blending_indices(good_index, readonly, [1.0], 1, 4)
    with pytest.raises(ValueError, match="dataset_index must be C-contiguous"):
        build_blending_indices(numpy.zeros(8, numpy.int16)[::2], good_sample, [1.0], 1, 4)
    with pytest.raises(ValueError, match="size must be an integer >= 0, got -1"):
        build_blending_indices(good_index, good_sample, [1.0], 1, -1)
    with pytest.raises(ValueError, match="fewer than size"):
        build_blending_indices(good_index, good_sample, [1.0], 1, 5)
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        build_blending_indices(good_index, good_sample, [1.0, -1.0], 2, 4)
    with pytest.raises(ValueError, match="weights must hold num_datasets"):
        build_blending_indices(good_index, good_sample, [1.0], 2, 4)
    with pytest.raises(ValueError, match="sizes must all be positive"):
        build_exhaustive_blending_indices(good_index, good_sample, [2, 0], 2)
    with pytest.raises(ValueError, match=r"must hold sum\(sizes\) = 5 entries"):
        build_exhaustive_blending_indices(good_index, good_sample, [2, 3], 2)


def test_verbose_blending_reports_ratios(capsys):
    index, sample = numpy.zeros(4, numpy.int16), numpy.zeros(4, numpy.int64)
    build_blending_indices(index, sample, [0.5, 0.5], 2, 4, True)
    assert capsys.readouterr().out.splitlines() == [
        "dataset 0: weight 0.500000, achieved 0.500000",
        "dataset 1: weight 0.500000, achieved 0.500000",
    ]


@pytest.mark.parametrize(
    "arguments,message",
    [
        ((1, 100, 0), "sequence_length must be a positive integer, got 0"),
        ((0, 100, 8), "num_epochs must be a positive integer, got 0"),
        ((1, -1, 8), "tokens_per_epoch must be an integer >= 0, got -1"),
        ((2**31, 100, 8), r"must fit int32 and num_epochs \* tokens_per_epoch \(100\) int64"),
        ((2**20, 2**50, 8), "must fit int32 and num_epochs"),
    ],
)
def test_sample_count_arguments_are_checked(arguments, message):
    with pytest.raises(ValueError, match=message):
        sample_count(*arguments)


def test_hand_worked_sample_count():
    # 2 epochs of 50 tokens, less the extra token: 99 tokens make 12 samples of 8, or 13 with
    # the last partial one
    assert sample_count(2, 50, 8, True, True) == 12
    assert sample_count(2, 50, 8, False, True) == 13


def test_gpt_tables_are_drawn_from_random_states_seed():
    """Hand-checkable: one epoch of three documents shuffled by RandomState(seed), its walk,
    and the shuffle index drawn next from the same generator."""
    for seed in (0, 1234, 2**32 - 1):
        document_index, sample_index, shuffle_index = build_gpt_tables(
            SIZES, numpy.arange(3, dtype=numpy.int32), 1, False, seed, 3, 12
        )
        random_state = numpy.random.RandomState(seed)
        expected = numpy.arange(3, dtype=numpy.int32)
        random_state.shuffle(expected)
        assert document_index.tolist() == expected.tolist()
        walk = build_sample_idx(SIZES, expected, 3, 1, 12)
        assert sample_index.tolist() == walk.tolist() and sample_index.dtype == numpy.int32
        order = numpy.arange(3, dtype=numpy.uint32)
        random_state.shuffle(order)
        assert shuffle_index.tolist() == order.tolist() and shuffle_index.dtype == numpy.uint32


@pytest.mark.parametrize(
    "change,message",
    [
        ({"seed": 2**32}, r"seed must be an integer in 0..2\*\*32 - 1, got 4294967296"),
        ({"seed": -1}, "seed must be an integer"),
        ({"tokens_per_epoch": 0}, "tokens_per_epoch must be a positive integer, got 0"),
        ({"num_epochs": 2, "separate_final_epoch": True}, "samples_before_final_epoch must be"),
        (
            {"num_epochs": 2, "separate_final_epoch": True, "samples_before_final_epoch": 9},
            r"samples_before_final_epoch \(9\) exceeds the 7 samples",
        ),
        ({"sizes": -SIZES}, "sizes must be >= 0, found -5 at 0"),
        ({"documents": numpy.zeros(0, numpy.int32)}, "has 12 tokens but no document"),
    ],
)
@pytest.mark.parametrize("backend", ["cpp", "numpy"])
def test_gpt_tables_arguments_are_checked(change, message, backend, use_backend):
    """The same errors on both backends: found before either runs."""
    use_backend(backend)
    arguments = {
        "sizes": SIZES,
        "documents": numpy.arange(3, dtype=numpy.int32),
        "num_epochs": 1,
        "separate_final_epoch": False,
        "seed": 0,
        "sequence_length": 3,
        "tokens_per_epoch": 12,
    }
    with pytest.raises(ValueError, match=message):
        build_gpt_tables(**{**arguments, **change})


@pytest.mark.parametrize("backend", ["cpp", "numpy"])
def test_gpt_tables_check_only_the_lengths_of_the_split_s_documents(backend, use_backend):
    """A negative length is refused where the split reads it (naming its document), and not
    looked for in the rest of the corpus: a small split of a large corpus read every length."""
    use_backend(backend)
    sizes = numpy.array([4, 4, -7, 4, 4], dtype=numpy.int32)
    split = numpy.array([0, 1, 3], dtype=numpy.int32)
    document_index, _, _ = build_gpt_tables(sizes, split, 1, False, 0, 3, 12)
    assert sorted(document_index.tolist()) == [0, 1, 3]
    with pytest.raises(ValueError, match="sizes must be >= 0, found -7 at 2"):
        build_gpt_tables(sizes, numpy.array([1, 2], dtype=numpy.int32), 1, False, 0, 3, 1)


def test_gpt_tables_of_a_stream_ending_in_an_empty_document_are_refused():
    sizes = numpy.array([5, 0], dtype=numpy.int32)
    for seed in range(8):  # whichever document the shuffle puts last: one order ends in 1
        try:
            build_gpt_tables(sizes, numpy.arange(2, dtype=numpy.int32), 1, False, seed, 3, 5, False)
        except IndexBuildError as error:
            assert "ends with an empty document" in str(error)
            return
    pytest.fail("no seed put the empty document last")
