"""The epoch plan and the tables, on figures worked out by hand."""

import tempfile
import time

import numpy
import pytest

from megaindex import (
    EmptySplitError,
    IndexBuildError,
    backends,
    build_progress,
    gpt_index,
    helpers,
)
from megaindex.gpt_index import (
    EpochPlan,
    GPTTableRecipe,
    build_document_index,
    build_gpt_index_tables,
    build_shuffle_index,
    consecutive,
    plan_epochs,
)
from megaindex.helpers import UINT32_SHUFFLE_LIMIT, build_sample_idx

TABLES = GPTTableRecipe.names


def test_one_epoch_when_it_is_enough_or_no_count_is_given():
    assert plan_epochs(1000, None, 20, True).num_epochs == 1
    plan = plan_epochs(1000, 49, 20, True)  # 49 * 20 + 1 = 981 <= 1000
    assert (plan.num_epochs, plan.separate_final_epoch) == (1, False)


def test_a_barely_used_final_epoch_is_separate():
    # 10 samples of 20 (+1) tokens need 201 of 100-token epochs: 3 epochs. The first two give
    # (200 - 1) // 20 = 9 samples, so 1 comes from the last, under 80% of the 4 per epoch.
    plan = plan_epochs(100, 10, 20, True)
    assert plan.num_epochs == 3
    assert plan.separate_final_epoch is True
    assert plan.samples_before_final_epoch == 9


def test_a_mostly_used_final_epoch_is_not_separate():
    # 12 samples: 3 epochs, 3 from the last, and int(0.8 * 4) = 3 is not above 3
    plan = plan_epochs(100, 12, 20, True)
    assert (plan.num_epochs, plan.separate_final_epoch) == (3, False)


def test_plan_of_an_empty_split_asked_for_samples_is_an_error():
    with pytest.raises(EmptySplitError, match="201 tokens .* but the split holds none"):
        plan_epochs(0, 10, 20, True)
    with pytest.raises(EmptySplitError):  # 0 samples still need the extra token
        plan_epochs(0, 0, 20, True)


@pytest.mark.parametrize("num_samples,extra", [(None, True), (None, False), (0, False)])
def test_plan_of_an_empty_split_asked_for_nothing_is_one_empty_epoch(num_samples, extra):
    assert plan_epochs(0, num_samples, 20, extra) == EpochPlan(0, 1, False, None)


def test_document_index_is_each_epoch_shuffled():
    documents = numpy.arange(10, 20, dtype=numpy.int32)
    rng = numpy.random.RandomState(3)
    index = build_document_index(documents, 3, rng, separate_final_epoch=True)
    assert index.dtype == numpy.int32 and len(index) == 30
    assert sorted(index[:20].tolist()) == sorted(documents.tolist() * 2)
    assert sorted(index[20:].tolist()) == documents.tolist()  # the last epoch on its own
    together = build_document_index(documents, 3, numpy.random.RandomState(3), False)
    assert sorted(together.tolist()) == sorted(documents.tolist() * 3)


def test_shuffle_index_keeps_the_final_epoch_apart():
    index = build_shuffle_index(7, 10, numpy.random.RandomState(0))
    assert index.dtype == numpy.uint32
    assert sorted(index[:7].tolist()) == list(range(7))
    assert sorted(index[7:].tolist()) == [7, 8, 9]
    assert UINT32_SHUFFLE_LIMIT == 2**32 - 2


def test_tables_of_an_empty_split_are_megatron_cores_empty_tables():
    lengths = numpy.array([3, 0, 0, 4], dtype=numpy.int32)
    for documents in ([], [1, 2]):  # no documents, or only empty ones
        tables = build_gpt_index_tables(
            lengths, numpy.array(documents, numpy.int32), None, 4, 0, True, True
        )
        assert tables.document_index.dtype == numpy.int32
        assert sorted(tables.document_index.tolist()) == documents
        assert tables.sample_index.tolist() == [[0, 0]]
        assert tables.sample_index.dtype == numpy.int32
        assert tables.shuffle_index.shape == (0,) and tables.shuffle_index.dtype == numpy.uint32


def test_tables_refuse_zero_lengths():
    lengths = numpy.array([3, 4], dtype=numpy.int32)
    with pytest.raises(IndexBuildError, match="sequence_length must be at least 1"):
        build_gpt_index_tables(lengths, numpy.arange(2, dtype=numpy.int32), 5, 0, 0, True, True)


def test_tables_follow_the_plan():
    lengths = numpy.full(10, 10, dtype=numpy.int32)
    tables = build_gpt_index_tables(
        lengths, numpy.arange(10, dtype=numpy.int32), 25, 9, 5, True, True
    )
    # 25 * 9 + 1 = 226 tokens of 100-token epochs: 3 epochs, (300 - 1) // 9 = 33 samples
    assert tables.plan.num_epochs == 3
    assert tables.document_index.shape == (30,)
    assert tables.sample_index.shape == (34, 2)
    assert sorted(tables.shuffle_index.tolist()) == list(range(33))


def test_a_long_build_reports_its_progress_with_an_estimate_and_a_short_one_nothing(
    monkeypatch, capsys
):
    lengths = numpy.random.default_rng(0).integers(1, 50, 400, dtype=numpy.int32)
    arguments = (lengths, numpy.arange(400, dtype=numpy.int32), 300, 16, 7, True, True)
    monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)
    monkeypatch.setattr(helpers, "SAMPLE_INDEX_ROWS_PER_STEP", 64)  # the walk in steps
    expected = build_gpt_index_tables(*arguments, what="corpus c, train")
    assert capsys.readouterr().err == ""  # short: silent
    monkeypatch.setattr(build_progress, "PROGRESS_SECONDS", 0.05)
    shuffled = gpt_index.build_document_index
    printed: list[str] = []

    def slow_document_index(*args):  # a document index of hundreds of millions of entries:
        deadline = time.monotonic() + 60  # still shuffling at the first line
        while not printed and time.monotonic() < deadline:
            printed.extend(capsys.readouterr().err.splitlines())
            time.sleep(0.01)
        return shuffled(*args)

    monkeypatch.setattr(gpt_index, "build_document_index", slow_document_index)
    tables = build_gpt_index_tables(*arguments, what="corpus c, train")
    lines = printed + capsys.readouterr().err.splitlines()
    entries = tables.document_index.size
    assert lines and all(
        line.startswith(
            f"index tables of corpus c, train ({entries:,} document-index entries shuffled, "
            f"then walked): "
        )
        for line in lines
    )
    assert f"0/{2 * entries} (0%)" in lines[0]  # still shuffling: nothing counted yet
    assert lines[-1].split(": ", 1)[1].startswith(f"{2 * entries}/{2 * entries} (100%)")
    for table in TABLES:
        assert numpy.array_equal(getattr(tables, table), getattr(expected, table)), table


@pytest.mark.parametrize("separate_final_epoch", [False, True])
def test_the_shuffle_on_its_own_thread_draws_what_the_inline_one_draws(
    monkeypatch, separate_final_epoch
):
    lengths = numpy.random.default_rng(0).integers(1, 50, 400, dtype=numpy.int32)
    samples = 330 if separate_final_epoch else 100  # 3 epochs, the last barely used; or one
    arguments = (lengths, numpy.arange(400, dtype=numpy.int32), samples, 64, 7, True, True)
    in_one_call = build_gpt_index_tables(*arguments)
    monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)
    inline = build_gpt_index_tables(*arguments)
    monkeypatch.setattr(gpt_index, "THREADED_SHUFFLE_MIN_SAMPLES", 0)
    threaded = build_gpt_index_tables(*arguments)
    assert in_one_call.plan == inline.plan == threaded.plan
    assert inline.plan.separate_final_epoch == separate_final_epoch
    assert set(in_one_call.seconds) == {"tables"} and "tables" not in threaded.seconds
    for table in TABLES:
        assert numpy.array_equal(getattr(inline, table), getattr(threaded, table)), table
        assert numpy.array_equal(getattr(inline, table), getattr(in_one_call, table)), table


@pytest.mark.parametrize(
    "indices, expected",
    [
        (numpy.arange(5, 5 + 3 * (1 << 20) + 7, dtype=numpy.int32), True),  # over several chunks
        (numpy.array([7], dtype=numpy.int32), True),
        (numpy.array([], dtype=numpy.int32), False),
        (numpy.array([0, 2, 1, 3], dtype=numpy.int32), False),  # right ends, wrong order
        (numpy.array([0, 1, 1, 3], dtype=numpy.int32), False),
        (numpy.array([3, 4, 6], dtype=numpy.int32), False),
    ],
)
def test_consecutive_indices_are_recognised_without_a_full_size_temporary(indices, expected):
    assert consecutive(indices) is expected


def test_a_disorder_in_a_later_chunk_is_found():
    indices = numpy.arange(3 * (1 << 20), dtype=numpy.int32)
    indices[[(2 << 20) + 5, (2 << 20) + 6]] = indices[[(2 << 20) + 6, (2 << 20) + 5]]
    assert consecutive(indices) is False


@pytest.fixture(params=["cpp", "numpy"])
def each_backend(request, monkeypatch):
    """Run the test on the C++ extension and on the numpy fallback."""
    monkeypatch.setenv("MEGAINDEX_BACKEND", request.param)
    backends.implementation.cache_clear()
    yield request.param
    backends.implementation.cache_clear()


@pytest.mark.parametrize("seed", range(8))
def test_sample_index_walked_in_steps_equals_the_whole_walk(each_backend, monkeypatch, seed):
    rng = numpy.random.default_rng(seed)
    documents = int(rng.integers(1, 60))
    sizes = rng.integers(0, 30, documents).astype(numpy.int32)
    stream = rng.permutation(numpy.tile(numpy.arange(documents, dtype=numpy.int32), 2))
    sizes[stream[-1]] += 1  # a stream ending in an empty document is refused either way
    length, extra = int(rng.integers(1, 12)), bool(rng.integers(0, 2))
    drop_last = bool(rng.integers(0, 2))
    args = (sizes, stream, length, 2, int(sizes.sum()), drop_last, extra)
    whole = build_sample_idx(*args)
    monkeypatch.setattr(helpers, "SAMPLE_INDEX_ROWS_PER_STEP", int(rng.integers(1, 5)))
    positions: list[int] = []
    stepped = build_sample_idx(*args, walked=positions.append)
    assert stepped.dtype == whole.dtype
    numpy.testing.assert_array_equal(stepped, whole)
    assert positions == sorted(positions) and positions[-1] == whole[-1, 0]


def reference_tables(lengths, documents, num_samples, sequence_length, seed, drop_last, extra):
    """The three tables the plain way: RandomState.shuffle in megatron-core's order, one walk."""
    plan = plan_epochs(int(lengths[documents].sum()), num_samples, sequence_length, extra)
    random_state = numpy.random.RandomState(seed)
    document_index = numpy.tile(documents, plan.num_epochs)
    if plan.separate_final_epoch:
        random_state.shuffle(document_index[: (plan.num_epochs - 1) * len(documents)])
        random_state.shuffle(document_index[(plan.num_epochs - 1) * len(documents) :])
    else:
        random_state.shuffle(document_index)
    epochs = (plan.num_epochs, plan.tokens_per_epoch)
    sample_index = build_sample_idx(
        lengths, document_index, sequence_length, *epochs, drop_last, extra
    )
    total = len(sample_index) - 1
    first = plan.samples_before_final_epoch if plan.separate_final_epoch else total
    shuffle_index = numpy.arange(total, dtype=numpy.uint32)
    random_state.shuffle(shuffle_index[:first])
    random_state.shuffle(shuffle_index[first:])
    return plan, document_index, sample_index, shuffle_index


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("one_call", [True, False])
def test_tables_built_side_by_side_and_spilled_equal_the_plain_build(
    each_backend, tmp_path, monkeypatch, seed, one_call
):
    """In one call of the backend (a small split), or step by step (large ones: here forced),
    the document index spilled to a file for even seeds."""
    if not one_call:
        monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)
    rng = numpy.random.default_rng(seed)
    documents = int(rng.integers(1, 3000))
    lengths = rng.integers(1, 200, documents + 5).astype(numpy.int32)
    indices = numpy.arange(5, 5 + documents, dtype=numpy.int32)
    sequence_length = int(rng.integers(1, 300))
    epochs = int(rng.integers(1, 5))  # many epochs, some with a separate final one
    num_samples = int(rng.integers(0, epochs * int(lengths[5:].sum()) // sequence_length + 1))
    drop_last, extra = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
    args = (lengths, indices, num_samples, sequence_length, seed, drop_last, extra)
    spill = seed % 2 == 0 and not one_call
    tables = build_gpt_index_tables(
        *args, spill_directory=str(tmp_path) if spill else None, spill_min_bytes=0
    )
    plan, *expected = reference_tables(*args)
    assert tables.plan == plan
    for name, reference in zip(TABLES, expected, strict=True):
        found = getattr(tables, name)
        assert found.dtype == reference.dtype, name
        numpy.testing.assert_array_equal(found, reference, err_msg=name)
    # a spilled document index is the file's read-only mapping, and leaves no file behind
    assert tables.document_index.flags.writeable is not spill
    assert list(tmp_path.iterdir()) == []


def test_a_spill_that_cannot_be_written_keeps_the_document_index_in_memory(
    tmp_path, monkeypatch, caplog
):
    """A cache folder that cannot be made (here under a file; read-only folders and full disks
    fail alike) and a temporary folder that cannot either: the build still succeeds, with
    the tables of the plain build, and says why it kept the document index in memory."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(blocker / "tmp"))
    monkeypatch.setattr(gpt_index, "ONE_CALL_BELOW", 0)  # a large split's build
    lengths = numpy.full(300, 7, dtype=numpy.int32)
    args = (lengths, numpy.arange(300, dtype=numpy.int32), 200, 8, 3, True, True)
    with caplog.at_level("WARNING", logger="megaindex.gpt_index"):
        tables = build_gpt_index_tables(
            *args, spill_directory=str(blocker / "cache"), spill_min_bytes=0
        )
    assert tables.document_index.flags.writeable  # kept in memory
    _, *expected = reference_tables(*args)
    for name, reference in zip(TABLES, expected, strict=True):
        numpy.testing.assert_array_equal(getattr(tables, name), reference, err_msg=name)
    assert caplog.text.count("cannot be spilled") == 2


def test_a_small_document_index_is_not_spilled(tmp_path):
    lengths = numpy.full(100, 7, dtype=numpy.int32)
    tables = build_gpt_index_tables(
        lengths, numpy.arange(100, dtype=numpy.int32), 50, 8, 0, True, True, str(tmp_path)
    )
    assert tables.document_index.flags.writeable  # under SPILL_MIN_BYTES: kept in memory


def test_both_backends_refuse_an_empty_document_index_alike(each_backend):
    out = numpy.zeros((3, 2), numpy.int32)
    with pytest.raises(ValueError, match="document_index is empty"):
        backends.implementation().fill_sample_index(
            numpy.array([3], numpy.int32), numpy.zeros(0, numpy.int32), 2, 0, out, 0, 3
        )


def test_a_reseeded_random_state_draws_what_a_new_one_draws():
    from concurrent.futures import ThreadPoolExecutor

    from megaindex.gpt_index import seeded_random_state

    drawn = seeded_random_state(7)
    drawn.standard_normal()  # leaves a cached gaussian a new state does not have
    drawn.shuffle(numpy.arange(10))
    for seed in (1234, 0, 2**32 - 1, 1234):
        state = seeded_random_state(seed)
        fresh = numpy.random.RandomState(seed)
        assert state.standard_normal() == fresh.standard_normal()
        assert (state.randint(0, 2**31, 100) == fresh.randint(0, 2**31, 100)).all()
    with ThreadPoolExecutor(1) as pool:  # another thread's state is its own
        assert pool.submit(seeded_random_state, 1).result() is not seeded_random_state(1)
    with pytest.raises(ValueError):
        seeded_random_state(-1)


def test_a_small_split_asked_to_spill_its_document_index_is_built_step_by_step(tmp_path):
    """An explicit spill threshold holds for a small split too: its document index is the
    spilled file's read-only mapping."""
    lengths = numpy.full(300, 7, dtype=numpy.int32)
    args = (lengths, numpy.arange(300, dtype=numpy.int32), 200, 8, 3, True, True)
    spilled = build_gpt_index_tables(*args, spill_directory=str(tmp_path), spill_min_bytes=0)
    in_one_call = build_gpt_index_tables(*args)
    assert not spilled.document_index.flags.writeable and "tables" not in spilled.seconds
    assert "tables" in in_one_call.seconds
    for table in TABLES:
        numpy.testing.assert_array_equal(getattr(spilled, table), getattr(in_one_call, table))
