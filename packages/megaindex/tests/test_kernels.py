"""The per-sample kernel ``helpers.fill_document_causal_mask``: values checked by hand, the
same arrays and the same errors from the C++ and the numpy backend, and arguments refused
before either runs."""

from __future__ import annotations

import numpy
import pytest

from megaindex import backends, helpers
from megaindex.sample import segment_starts

BACKENDS = ("cpp", "numpy")


@pytest.fixture
def use_backend(monkeypatch):
    """``use_backend(name)`` makes the helpers run on that backend for the rest of the test."""

    def use(name: str) -> None:
        monkeypatch.setenv("MEGAINDEX_BACKEND", name)
        backends.implementation.cache_clear()

    yield use
    backends.implementation.cache_clear()


def outcome(function, *arguments):
    """What a call gives, comparable across backends: its result or its error."""
    try:
        return ("result", function(*arguments).tolist())
    except (IndexError, TypeError, ValueError) as error:
        return (type(error).__name__, str(error))


def read_only(array: numpy.ndarray) -> numpy.ndarray:
    array.flags.writeable = False
    return array


@pytest.fixture
def no_backend(monkeypatch):
    """Fails the test if a helper reaches a backend."""
    monkeypatch.setattr(helpers, "implementation", lambda: pytest.fail("a backend was called"))


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
