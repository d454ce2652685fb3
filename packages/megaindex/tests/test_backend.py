"""The C++ extension is built, and it agrees with the numpy fallback on every builder (the
per-batch kernels: test_kernels.py)."""

import importlib
import warnings

import numpy
import pytest
from blendtesting import deciding_ties, dyadic_weights

import megaindex
from megaindex import _numpy_backend, backends
from megaindex import helpers as helpers_module

ext = importlib.import_module("megaindex._ext")


def test_the_cpp_backend_is_built_and_active():
    assert backends.backend() == "cpp"
    assert megaindex.backend() == "cpp"


@pytest.fixture
def fresh_backend(monkeypatch):
    backends.implementation.cache_clear()
    yield monkeypatch
    backends.implementation.cache_clear()


def test_env_selects_numpy(fresh_backend):
    fresh_backend.setenv("MEGAINDEX_BACKEND", "numpy")
    assert backends.backend() == "numpy"


def test_unknown_env_value_is_an_error(fresh_backend):
    fresh_backend.setenv("MEGAINDEX_BACKEND", "fortran")
    with pytest.raises(backends.BackendError, match="expected one of auto, cpp, numpy"):
        backends.implementation()


def test_missing_extension_falls_back_once_with_a_warning(fresh_backend):
    real = importlib.import_module

    def without_ext(name, *args):
        if name == "megaindex._ext":
            raise ImportError("not built")
        return real(name, *args)

    fresh_backend.setattr(backends.importlib, "import_module", without_ext)
    with pytest.warns(RuntimeWarning, match="C\\+\\+ extension is not available"):
        assert backends.backend() == "numpy"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.backend() == "numpy"  # cached: no second warning
    backends.implementation.cache_clear()
    fresh_backend.setenv("MEGAINDEX_BACKEND", "cpp")
    with pytest.raises(backends.BackendError, match="MEGAINDEX_BACKEND=cpp but"):
        backends.implementation()


def random_stream(rng, documents, epochs):
    sizes = rng.integers(0, 50, documents).astype(numpy.int32)
    sizes[0] = max(sizes[0], 3)
    sizes[-1] = max(sizes[-1], 1)
    document_index = numpy.tile(numpy.arange(documents, dtype=numpy.int32), epochs)
    rng.shuffle(document_index[:-1])  # keep a non-empty document last
    return sizes, document_index


@pytest.mark.parametrize("seed", range(40))
def test_sample_index_agrees(seed):
    rng = numpy.random.default_rng(seed)
    epochs = int(rng.integers(1, 4))
    sizes, document_index = random_stream(rng, int(rng.integers(1, 150)), epochs)
    tokens = int(sizes.sum())
    sequence_length = int(rng.integers(1, 40))
    for drop_last in (True, False):
        for extra in (0, 1):
            count = ext.sample_count(epochs, tokens, sequence_length, drop_last, extra)
            assert count == _numpy_backend.sample_count(
                epochs, tokens, sequence_length, drop_last, extra
            )
            for kernel in ("build_sample_index_int32", "build_sample_index_int64"):
                ours = getattr(ext, kernel)(sizes, document_index, sequence_length, count, extra)
                theirs = getattr(_numpy_backend, kernel)(
                    sizes, document_index, sequence_length, count, extra
                )
                assert ours.dtype == theirs.dtype
                numpy.testing.assert_array_equal(ours, theirs)


def assert_blends_agree(weights: numpy.ndarray, size: int) -> None:
    """The extension's blending indices of ``size`` samples equal the numpy backend's."""
    outputs = []
    for module in (ext, _numpy_backend):
        index, sample = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
        module.build_blending_indices(weights, index, sample)
        outputs.append((index, sample))
    for ours, theirs in zip(*outputs, strict=True):
        numpy.testing.assert_array_equal(ours, theirs)


def assert_exhaustive_blends_agree(sizes: numpy.ndarray) -> None:
    """The extension's exhaustive blending indices of ``sizes`` equal the numpy backend's."""
    outputs = []
    for module in (ext, _numpy_backend):
        index = numpy.zeros(sizes.sum(), numpy.int16)
        sample = numpy.zeros(sizes.sum(), numpy.int64)
        module.build_exhaustive_blending_indices(sizes, index, sample)
        outputs.append((index, sample))
    for ours, theirs in zip(*outputs, strict=True):
        numpy.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("seed", range(20))
def test_blending_agrees(seed):
    rng = numpy.random.default_rng(seed)
    datasets = int(rng.integers(1, 7 if seed % 2 else 41))
    weights = rng.random(datasets) + 0.01
    if seed % 4 == 2:  # ties between datasets (the first must win), and datasets never drawn
        weights = rng.choice([0.0, 1.0, 2.0], datasets)
        weights[0] = 1.0
    weights /= weights.sum()
    size = int(rng.integers(1, 2000))
    assert_blends_agree(weights, size)

    sizes = rng.integers(1, 200, datasets).astype(numpy.int64)
    assert_exhaustive_blends_agree(sizes)


@pytest.mark.parametrize("datasets", [64, 700, 2400])
@pytest.mark.parametrize(
    "kind", ["spread", "equal", "few values", "a rounding apart", "exact ties"]
)
def test_blending_of_many_datasets_agrees(kind, datasets):
    # from 64 datasets on the extension draws through a tournament tree (its leaves by weight);
    # the numpy backend scans every dataset at every sample
    rng = numpy.random.default_rng(len(kind) + datasets)
    weights = {
        "spread": lambda: numpy.exp(rng.uniform(0, numpy.log(1e4), datasets)),
        "equal": lambda: numpy.ones(datasets),
        "few values": lambda: rng.choice([0.0, 1.0, 2.0], datasets) + numpy.eye(1, datasets)[0],
        "a rounding apart": lambda: numpy.nextafter(1.0, rng.choice([0.0, 2.0], datasets)),
        "exact ties": lambda: dyadic_weights(rng, datasets),
    }[kind]()
    weights /= weights.sum()
    size = 8192 if kind == "exact ties" else 1500  # past half the weights' power of two
    if kind == "exact ties":
        assert deciding_ties(weights, size) > 0
    assert_blends_agree(weights, size)


@pytest.mark.parametrize("datasets", [64, 2100])
def test_exhaustive_blending_of_many_datasets_agrees(datasets):
    # the extension's tree, datasets leaving it once drawn whole, against the numpy scan
    sizes = numpy.random.default_rng(5).integers(1, 3, datasets).astype(numpy.int64)
    assert_exhaustive_blends_agree(sizes)


def test_public_helpers_run_on_either_backend(fresh_backend):
    sizes = numpy.array([5, 3, 4], dtype=numpy.int32)
    document_index = numpy.array([2, 0, 1], dtype=numpy.int32)
    results = []
    for choice in ("cpp", "numpy"):
        fresh_backend.setenv("MEGAINDEX_BACKEND", choice)
        backends.implementation.cache_clear()
        results.append(helpers_module.build_sample_idx(sizes, document_index, 3, 1, 12))
    numpy.testing.assert_array_equal(*results)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("dtype", [numpy.int32, numpy.uint32, numpy.int64])
def test_shuffle_is_random_states_shuffle(seed, dtype, fresh_backend):
    rng = numpy.random.default_rng(seed)
    # sizes on both sides of NUMPY_SHUFFLES_BELOW, and large ones
    size = int(rng.integers(0, 12_000)) if seed % 4 else int(rng.integers(100_000, 300_000))
    for choice in ("cpp", "numpy"):
        fresh_backend.setenv("MEGAINDEX_BACKEND", choice)
        backends.implementation.cache_clear()
        reference, ours = numpy.random.RandomState(seed), numpy.random.RandomState(seed)
        reference.random_sample(int(rng.integers(0, 700)))  # start mid-way through the key
        ours.set_state(reference.get_state())
        expected = numpy.arange(size, dtype=dtype)
        shuffled = expected.copy()
        reference.shuffle(expected)
        helpers_module.shuffle(ours, shuffled)
        numpy.testing.assert_array_equal(shuffled, expected)
        # the generator is left where RandomState.shuffle leaves it
        assert ours.randint(0, 2**31, 5).tolist() == reference.randint(0, 2**31, 5).tolist()


# the C++ shuffle draws 2**14 targets at a time: sizes on either side of a block's end
@pytest.mark.parametrize("size", [2**14, 2**14 + 1, 2**14 + 2, 2 * 2**14 + 1, 3 * 2**14 - 1])
def test_shuffle_is_random_states_shuffle_at_block_ends(size):
    for seed in range(3):
        reference, ours = numpy.random.RandomState(seed), numpy.random.RandomState(seed)
        expected, shuffled = numpy.arange(size), numpy.arange(size)
        reference.shuffle(expected)
        helpers_module.shuffle(ours, shuffled)
        numpy.testing.assert_array_equal(shuffled, expected)
        assert ours.randint(0, 2**31) == reference.randint(0, 2**31)


@pytest.mark.parametrize("generator", [numpy.random.PCG64, numpy.random.Philox])
def test_a_random_state_over_another_generator_shuffles_as_numpy_does(generator):
    # the backend replays MT19937 only; a RandomState over another bit generator (not
    # megatron-core's, but one a caller may hand in) is shuffled by numpy itself
    for size in (4095, 4096, 70_000):
        reference, ours = (numpy.random.RandomState(generator(7)) for _ in range(2))
        expected, shuffled = numpy.arange(size), numpy.arange(size)
        reference.shuffle(expected)
        helpers_module.shuffle(ours, shuffled)
        numpy.testing.assert_array_equal(shuffled, expected)
        assert ours.randint(0, 2**31) == reference.randint(0, 2**31)


def test_shuffle_refuses_arrays_it_cannot_permute_in_place():
    random_state = numpy.random.RandomState(0)
    with pytest.raises(ValueError, match=r"array must be C-contiguous, got strides \(16,\)"):
        helpers_module.shuffle(random_state, numpy.arange(10)[::2])
    readonly = numpy.arange(10)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="array must be writeable, got a read-only array"):
        helpers_module.shuffle(random_state, readonly)
    with pytest.raises(ValueError, match=r"array must have shape \(any,\), got \(2, 5\)"):
        helpers_module.shuffle(random_state, numpy.zeros((2, 5), numpy.int64))
    # the C++ backend permutes the index dtypes only; the numpy one must refuse the rest too
    with pytest.raises(TypeError, match="array must be int32, uint32 or int64, got float64"):
        helpers_module.shuffle(random_state, numpy.zeros(10))


@pytest.mark.parametrize("seed", range(24))
def test_gpt_tables_agree(seed):
    """The three tables in one call: the extension's equal the numpy backend's (RandomState
    itself), over seeds of RandomState's whole range, a separate last epoch or not, both dtypes
    of each table."""
    rng = numpy.random.default_rng(seed)
    epochs = int(rng.integers(1, 5))
    sizes, _ = random_stream(rng, int(rng.integers(1, 6000 if seed % 3 else 150)), 1)
    documents = numpy.arange(int(rng.integers(0, len(sizes))), len(sizes), dtype=numpy.int32)
    sequence_length, extra = int(rng.integers(1, 60)), int(rng.integers(0, 2))
    tokens = int(sizes[documents].sum())
    samples = ext.sample_count(epochs, tokens, sequence_length, True, extra) if tokens else 0
    separate = epochs > 1 and seed % 2 == 0
    first = int(rng.integers(0, samples + 1)) if separate else samples
    arguments = [sizes, documents, epochs, separate, int(rng.integers(0, 2**32))]
    arguments += [sequence_length, extra, samples, first, seed % 4 == 1, seed % 4 == 2]
    ours = ext.build_gpt_tables(*arguments)
    theirs = _numpy_backend.build_gpt_tables(*arguments)
    for name, mine, reference in zip(("document", "sample", "shuffle"), ours, theirs, strict=True):
        assert mine.dtype == reference.dtype, name
        numpy.testing.assert_array_equal(mine, reference, err_msg=name)
    assert ours[1].dtype == (numpy.int64 if seed % 4 == 1 else numpy.int32)
    assert ours[2].dtype == (numpy.int64 if seed % 4 == 2 else numpy.uint32)
