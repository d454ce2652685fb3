import errno
import threading
import time

import numpy
import pytest

from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    CacheError,
    ConfigError,
    GPTDataset,
    GPTDatasetConfig,
    IndexBuildError,
    MockGPTDataset,
    Split,
)


def test_mock_builds_three_even_splits_without_a_cache(tokenizer):
    config = GPTDatasetConfig(
        random_seed=3,
        sequence_length=64,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        MockGPTDataset, [100, 10, 10], lambda: True, config
    ).build()
    assert len(train) >= 100 and len(valid) >= 10 and len(test) >= 10
    assert train.index_source.kind == "memory"
    # mock documents count up from 1 and end with EOD
    document = train.dataset.get(0)
    assert document[:3].tolist() == [1, 2, 3] and document[-1] == tokenizer.eod


def test_split_ranges_are_contiguous(make_config):
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [100, 10, 5], lambda: True, make_config()
    ).build()
    # 300 sequences split 90,8,2: [0, 270), [270, 294), [294, 300)
    assert (train.indices[0], train.indices[-1], len(train.indices)) == (0, 269, 270)
    assert (valid.indices[0], len(valid.indices)) == (270, 24)
    assert (test.indices[0], len(test.indices)) == (294, 6)


def test_per_split_blends_of_one_prefix(make_config, corpus):
    config = make_config(
        blend=None, split=None, blend_per_split=[([corpus], None), None, ([corpus], None)]
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        GPTDataset, [100, None, 5], lambda: True, config
    ).build()
    assert valid is None
    assert len(train.indices) == len(test.indices) == 300


def test_weights_without_sizes_are_refused(make_config, corpus):
    config = make_config(blend=([corpus], [1.0]))
    with pytest.raises(ConfigError, match="the train split has weights but no size"):
        BlendedMegatronDatasetBuilder(GPTDataset, [None, 1, 1], lambda: True, config)
    with pytest.raises(ConfigError, match="sizes must hold one entry per split"):
        BlendedMegatronDatasetBuilder(GPTDataset, [1, 1], lambda: True, config)


def test_the_builder_warns_when_blended_corpora_disagree_on_eod(make_config, tmp_path):
    from megafmt import write_manifest

    prefixes = []
    for name, eod in (("web", 1000), ("code", 0)):
        prefix = write_corpus(str(tmp_path / name))
        write_manifest(prefix, {"tokenizer": {"fingerprint": "sha256:same", "eod": eod}})
        prefixes.append(prefix)
    config = make_config(blend=(prefixes, [1.0, 1.0]))
    with pytest.warns(UserWarning, match=r"tokenized differently .*eod 0: .*code"):
        BlendedMegatronDatasetBuilder(GPTDataset, [50, 5, 5], lambda: True, config).build()


def test_a_cache_hit_makes_no_array_of_the_split_indices(make_config):
    """Each split reaches a dataset of ours as a range: a cache hit never makes it an array
    (570 MB per process for the train split of a 146M-document corpus); whoever reads
    ``indices`` gets megatron-core's int32 array, the same one each time."""

    def build():
        return BlendedMegatronDatasetBuilder(
            GPTDataset, [100, 10, 5], lambda: True, make_config()
        ).build()

    built, hit = build(), build()
    for fresh, cached in zip(built, hit, strict=True):
        assert cached.index_source.kind == "cache"
        assert isinstance(vars(cached)["_indices"], range)
        numpy.testing.assert_array_equal(cached.shuffle_index, fresh.shuffle_index)
    train = hit[0]
    assert train.indices.dtype == numpy.int32 and train.indices is train.indices
    numpy.testing.assert_array_equal(train.indices, numpy.arange(270))


def test_a_range_and_its_array_give_the_same_tables(make_config):
    config = make_config(path_to_cache=None)
    corpus = GPTDataset.build_low_level_dataset(config.blend[0][0], config)
    made = [
        GPTDataset(corpus, config.blend[0][0], indices, 150, Split.valid, config)
        for indices in (range(20, 290), numpy.arange(20, 290, dtype=numpy.int32))
    ]
    for name in ("document_index", "sample_index", "shuffle_index"):
        numpy.testing.assert_array_equal(getattr(made[0], name), getattr(made[1], name))
    assert made[0].epoch_plan == made[1].epoch_plan


class ForeignDataset:
    """A dataset class written against megatron-core's builder, not a MegatronDataset of ours:
    it is given its indices as megatron-core gives them."""

    build_low_level_dataset = staticmethod(GPTDataset.build_low_level_dataset)
    numel_low_level_dataset = staticmethod(GPTDataset.numel_low_level_dataset)

    def __init__(self, dataset, dataset_path, indices, num_samples, index_split, config):
        self.indices = indices

    def __len__(self):
        return len(self.indices)


def test_a_foreign_dataset_class_gets_an_array_of_indices(make_config):
    train, valid, _ = BlendedMegatronDatasetBuilder(
        ForeignDataset, [None, None, None], lambda: True, make_config()
    ).build()
    assert isinstance(train.indices, numpy.ndarray) and train.indices.dtype == numpy.int32
    numpy.testing.assert_array_equal(valid.indices, numpy.arange(270, 294))


def test_building_the_indices_of_many_corpora_shows_progress_with_an_eta(
    make_config, tmp_path, monkeypatch, capsys
):
    from megaindex import builder

    monkeypatch.setattr(builder, "PROGRESS_SECONDS", 0.0)  # every build counts as a long one
    monkeypatch.setenv("MEGA_PROGRESS", "1")
    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 20 + n, seed=n) for n in range(3)]
    config = make_config(blend=(prefixes, [1.0, 2.0, 3.0]), split="100,0,0")
    BlendedMegatronDatasetBuilder(GPTDataset, [50, 0, 0], lambda: True, config).build()
    lines = capsys.readouterr().err.splitlines()
    assert any(
        line.startswith("indices of 3 corpora: 1/3 (33%)") and "ETA" in line for line in lines
    )
    assert any(line.startswith("indices of 3 corpora: 3/3 (100%)") for line in lines)


def test_corpora_built_on_the_builder_threads_are_counted_as_they_finish(
    make_config, tmp_path, monkeypatch, capsys
):
    """The progress counts a corpus of the pool when it finishes, not after the small corpora
    the builder's own thread builds meanwhile."""
    import concurrent.futures
    import os
    import threading

    from megaindex import builder

    monkeypatch.setattr(builder, "PROGRESS_SECONDS", 0.0)  # a line at every count
    monkeypatch.setenv("MEGA_PROGRESS", "1")
    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 30 - 8 * n, seed=n) for n in range(3)]
    # the first corpus builds on the pool, the two others on the builder's thread
    monkeypatch.setattr(builder, "SMALL_CORPUS_IDX_BYTES", os.path.getsize(prefixes[0] + ".idx"))
    submitted = []

    class RecordingPool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(super().submit(*args, **kwargs))
            return submitted[-1]

    monkeypatch.setattr(builder, "ThreadPoolExecutor", RecordingPool)
    printed = []
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits

    def recording(self, prefix, *args):
        if prefix == prefixes[1]:  # the pool's corpus finishes (its callbacks run) meanwhile
            finished = threading.Event()
            submitted[0].add_done_callback(lambda _: finished.set())
            assert finished.wait(60)
        if prefix == prefixes[2]:  # by now the pool's corpus is counted
            printed.append(capsys.readouterr().err)
            assert "indices of 3 corpora: 2/3" in printed[-1]
        return build_splits(self, prefix, *args)

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", recording)
    config = make_config(
        blend=(prefixes, [1.0] * 3), split="100,0,0", num_dataset_builder_threads=2
    )
    BlendedMegatronDatasetBuilder(GPTDataset, [40, 0, 0], lambda: True, config).build()
    assert "indices of 3 corpora: 3/3 (100%)" in capsys.readouterr().err


def test_a_corpus_that_fails_is_the_error_when_the_failed_write_is_found_at_the_end(
    make_config, tmp_path, monkeypatch
):
    from megaindex import file_writes

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 20, seed=n) for n in range(2)]
    # every cache file fails to be written, noticed only once the writes end (after the blend)
    monkeypatch.setattr(file_writes, "partial_path", lambda path: str(tmp_path / "no" / "x"))
    monkeypatch.setattr(file_writes.BackgroundWrites, "raise_failure", lambda self: None)
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits

    def failing(self, prefix, *args):
        if prefix == prefixes[1]:
            raise RuntimeError("the corpus's own error")
        return build_splits(self, prefix, *args)

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", failing)
    config = make_config(blend=(prefixes, [1.0, 1.0]), split="100,0,0")
    with pytest.raises(RuntimeError, match="the corpus's own error"):
        BlendedMegatronDatasetBuilder(GPTDataset, [40, 0, 0], lambda: True, config).build()


def recorded_writes(monkeypatch) -> list:
    """The background writes of builds from here on, as submitted."""
    from megaindex import file_writes

    writes: list[file_writes.Written] = []
    submit = file_writes.BackgroundWrites.submit

    def recording(self, *args):
        writes.append(submit(self, *args))
        return writes[-1]

    monkeypatch.setattr(file_writes.BackgroundWrites, "submit", recording)
    return writes


def once_the_last_corpus_is_written(monkeypatch, prefixes, action) -> list:
    """``action()`` once the builder built the last of ``prefixes`` and the writes of the
    build's cache files so far have ended; the writes, as submitted."""
    writes = recorded_writes(monkeypatch)
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits

    def then(self, prefix, *args):
        datasets = build_splits(self, prefix, *args)
        if prefix == prefixes[-1]:
            deadline = time.monotonic() + 60
            while not all(w.ended() for w in writes) and time.monotonic() < deadline:
                time.sleep(0.01)
            action()
        return datasets

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", then)
    return writes


@pytest.mark.parametrize("look", ["one by one", "listed"])
def test_a_cache_folder_removed_while_a_blend_builds_fails_the_build(
    make_config, tmp_path, monkeypatch, look
):
    """Cache files written and gone before the build ended (the folder removed by a cleanup)
    fail the build, naming the file: their tables are mapped when first read, and the build
    reported success before, its first read of such a corpus failing (maybe hours later)."""
    import shutil

    from megaindex import file_writes

    if look == "listed":  # as for a blend of more than LOOKED_AT_ONE_BY_ONE files
        monkeypatch.setattr(file_writes, "LOOKED_AT_ONE_BY_ONE", 0)
    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 20, seed=n) for n in range(3)]
    cache = tmp_path / "cache"
    writes = once_the_last_corpus_is_written(monkeypatch, prefixes, lambda: shutil.rmtree(cache))
    config = make_config(blend=(prefixes, [1.0] * 3), split="100,0,0", path_to_cache=str(cache))
    with pytest.raises(CacheError, match="gone before it ended") as caught:
        BlendedMegatronDatasetBuilder(GPTDataset, [40, 0, 0], lambda: True, config).build()
    assert str(cache) in str(caught.value) and "went away while the build ran" in str(caught.value)
    assert len(writes) == 3


@pytest.mark.parametrize("what", ["descriptions withdrawn", "no listing"])
def test_a_blend_whose_written_files_are_all_there_is_not_failed_by_the_look(
    make_config, tmp_path, monkeypatch, what
):
    """The look for files gone when the build ends judges only what it can see: descriptions
    another process withdrew (it found the entry damaged and rewrites it) are no loss, and a
    folder that cannot be listed (no descriptor left) has its files looked at one by one."""
    from megaindex import file_writes

    monkeypatch.setattr(file_writes, "LOOKED_AT_ONE_BY_ONE", 0)  # listed, where it can be
    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 20, seed=n) for n in range(3)]
    cache = tmp_path / "cache"

    def then():
        if what == "descriptions withdrawn":
            for description in cache.glob("*-description.txt"):
                description.unlink()
        else:

            def no_descriptor_left(folder):
                raise OSError(errno.EMFILE, "Too many open files", folder)

            monkeypatch.setattr(file_writes.os, "listdir", no_descriptor_left)

    writes = once_the_last_corpus_is_written(monkeypatch, prefixes, then)
    config = make_config(blend=(prefixes, [1.0] * 3), split="100,0,0", path_to_cache=str(cache))
    built = BlendedMegatronDatasetBuilder(GPTDataset, [40, 0, 0], lambda: True, config).build()
    assert len(built[0]) >= 40 and len(writes) == 3


def test_a_cache_write_that_failed_stops_the_blend_before_its_next_corpus(
    make_config, tmp_path, monkeypatch
):
    import time

    from megaindex import file_writes

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 20, seed=n) for n in range(4)]
    # every cache file fails to be written (in the background of the build)
    monkeypatch.setattr(file_writes, "partial_path", lambda path: str(tmp_path / "no" / "x"))
    writes = recorded_writes(monkeypatch)
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits
    built = []

    def waiting(self, prefix, *args):
        datasets = build_splits(self, prefix, *args)
        built.append(prefixes.index(prefix))
        deadline = time.monotonic() + 60
        while not writes[-1].ended() and time.monotonic() < deadline:  # ended, failed
            time.sleep(0.01)
        return datasets

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", waiting)
    config = make_config(blend=(prefixes, [1.0] * 4), split="100,0,0")
    with pytest.raises(CacheError, match="cannot write the index cache") as caught:
        BlendedMegatronDatasetBuilder(GPTDataset, [40, 0, 0], lambda: True, config).build()
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    assert built == [0]  # the corpora after the failed write were not built


@pytest.mark.parametrize("threads", [1, 2])
def test_small_corpora_build_on_the_builders_own_thread(
    make_config, tmp_path, monkeypatch, threads
):
    """Small corpora of a blend (Python work) are built one after another on the builder's
    thread, larger ones on the builder threads meanwhile (one thread too); the datasets are
    those of one thread."""
    import os
    import threading

    from megaindex import builder

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 5 + 3 * n, seed=n) for n in range(6)]
    # the first three corpora are small, the last three not
    monkeypatch.setattr(builder, "SMALL_CORPUS_IDX_BYTES", os.path.getsize(prefixes[3] + ".idx"))
    where = {}
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits

    def recording(self, prefix, *args):
        where[prefix] = threading.current_thread() is threading.main_thread()
        return build_splits(self, prefix, *args)

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", recording)

    def blend(threads, cache):
        config = make_config(
            blend=(prefixes, [1.0] * 6),
            split="100,0,0",
            num_dataset_builder_threads=threads,
            path_to_cache=str(tmp_path / cache),
        )
        sizes = [60, 0, 0]
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]

    built = blend(threads, "cache")
    assert [where[p] for p in prefixes] == [True] * 3 + [False] * 3
    alone = blend(1, "alone")
    assert [d.dataset.path_prefix for d in built.datasets] == prefixes
    for ours, theirs in zip(built.datasets, alone.datasets, strict=True):
        numpy.testing.assert_array_equal(ours.sample_index, theirs.sample_index)
        numpy.testing.assert_array_equal(ours.shuffle_index, theirs.shuffle_index)
    for index in range(len(built)):
        numpy.testing.assert_array_equal(built[index]["tokens"], alone[index]["tokens"])


def test_with_builder_threads_the_first_failing_corpus_of_the_blend_is_the_error(
    make_config, tmp_path, monkeypatch
):
    import os

    from megaindex import builder

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 5 + 3 * n, seed=n) for n in range(6)]
    monkeypatch.setattr(builder, "SMALL_CORPUS_IDX_BYTES", os.path.getsize(prefixes[3] + ".idx"))
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits

    def failing(self, prefix, *args):
        if prefix in (prefixes[1], prefixes[4]):  # small, built on the builder's thread; large
            raise RuntimeError(f"cannot build {prefix}")
        return build_splits(self, prefix, *args)

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", failing)
    config = make_config(
        blend=(prefixes, [1.0] * 6), split="100,0,0", num_dataset_builder_threads=2
    )
    with pytest.raises(RuntimeError, match=f"cannot build {prefixes[1]}$"):
        BlendedMegatronDatasetBuilder(GPTDataset, [60, 0, 0], lambda: True, config).build()
    prefixes[1], prefixes[4] = prefixes[4], prefixes[1]  # now the large one comes first
    config = make_config(
        blend=(prefixes, [1.0] * 6),
        split="100,0,0",
        num_dataset_builder_threads=2,
        path_to_cache=str(tmp_path / "other"),
    )
    with pytest.raises(RuntimeError, match=f"cannot build {prefixes[1]}$"):
        BlendedMegatronDatasetBuilder(GPTDataset, [60, 0, 0], lambda: True, config).build()


def test_a_failed_corpus_stops_the_blend_from_building_the_corpora_after_it(
    make_config, tmp_path, monkeypatch
):
    import concurrent.futures
    import time

    from megaindex import builder

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 5 + 3 * n, seed=n) for n in range(6)]
    monkeypatch.setattr(builder, "SMALL_CORPUS_IDX_BYTES", 0)  # all on the builder's pool
    submitted: list[concurrent.futures.Future] = []

    class RecordingPool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(super().submit(*args, **kwargs))
            return submitted[-1]

    monkeypatch.setattr(builder, "ThreadPoolExecutor", RecordingPool)
    build_splits = BlendedMegatronDatasetBuilder._build_megatron_dataset_splits
    built = []

    def failing(self, prefix, *args):
        if prefix == prefixes[1]:
            raise RuntimeError(f"cannot build {prefix}")
        if prefix == prefixes[2]:  # running when corpus 1 fails: the rest are called off
            deadline = time.monotonic() + 60
            while not all(f.cancelled() for f in submitted[3:]) and time.monotonic() < deadline:
                time.sleep(0.01)
        built.append(prefixes.index(prefix))
        return build_splits(self, prefix, *args)

    monkeypatch.setattr(BlendedMegatronDatasetBuilder, "_build_megatron_dataset_splits", failing)
    config = make_config(blend=(prefixes, [1.0] * 6), split="100,0,0")
    with pytest.raises(RuntimeError, match=f"cannot build {prefixes[1]}$"):
        BlendedMegatronDatasetBuilder(GPTDataset, [60, 0, 0], lambda: True, config).build()
    assert built == [0, 2]


def threads_drawing(monkeypatch) -> list[str]:
    """The names of the threads that draw blending indices from here on, in order."""
    from megaindex import blended_dataset, helpers

    draws: list[str] = []
    draw = helpers.build_blending_indices

    def recording(*args, **kwargs):
        draws.append(threading.current_thread().name)
        return draw(*args, **kwargs)

    monkeypatch.setattr(blended_dataset, "build_blending_indices", recording)
    return draws


def test_a_blends_indices_are_drawn_while_its_parts_build(make_config, tmp_path, monkeypatch):
    """A cold build draws each split blend's indices on a thread of their own, started once
    the first corpus had its tables built, and the blend takes them: the same tables as a blend
    that draws them itself (where their memory is not there to hold in advance). A warm build
    draws none: it loads them."""
    from megaindex import blended_dataset

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 40 + 9 * n, seed=n) for n in range(5)]
    draws = threads_drawing(monkeypatch)

    def blend(cache):
        config = make_config(
            blend=(prefixes, [3.0, 1.0, 2.0, 0.5, 1.5]),
            split="90,8,2",
            path_to_cache=str(tmp_path / cache),
        )
        return BlendedMegatronDatasetBuilder(GPTDataset, [300, 30, 5], lambda: True, config)

    built = blend("cache").build()
    assert len(draws) == 3 and all(name == "megaindex-blending-in-advance" for name in draws)
    assert blended_dataset._in_advance == {}  # taken, or forgotten
    draws.clear()
    loaded = blend("cache").build()
    assert draws == []  # loaded: nothing drawn, in advance or not

    def no_room(what, parts, sizing):
        raise IndexBuildError(f"{what}: no room")

    monkeypatch.setattr(blended_dataset, "reserving", no_room)  # for the draws in advance only
    alone = blend("alone").build()
    assert len(draws) == 3 and "megaindex-blending-in-advance" not in draws
    for ours, cached, theirs in zip(built, loaded, alone, strict=True):
        for table in ("dataset_index", "dataset_sample_index"):
            numpy.testing.assert_array_equal(getattr(ours, table), getattr(theirs, table))
            numpy.testing.assert_array_equal(getattr(cached, table), getattr(theirs, table))


def test_a_blend_takes_the_draw_made_in_advance_for_its_weights_and_size_only():
    """What the blend of these weights and size would draw; a draw that failed is none (the
    blend draws its indices itself, and raises in its own terms); a forgotten one is gone."""
    from megaindex import blended_dataset

    weights = [0.25, 0.75]
    expected = blended_dataset._draw_blending_indices(weights, 8).wait()
    forget = blended_dataset.blend_in_advance([1.0, 3.0], 8)  # as given to the blend
    assert blended_dataset._drawn_in_advance(weights, 9) is None  # another size
    drawn = blended_dataset._drawn_in_advance(weights, 8)
    forget()
    for found, reference in zip(drawn, expected, strict=True):
        numpy.testing.assert_array_equal(found, reference)
    assert blended_dataset._drawn_in_advance(weights, 8) is None  # forgotten
    forget = blended_dataset.blend_in_advance([2.0, -1.0], 10)  # its draw raises
    try:
        assert blended_dataset._drawn_in_advance([2.0, -1.0], 10) is None
    finally:
        forget()
    blended_dataset.blend_in_advance([1.0, 3.0], 8)()  # forgotten before a blend took it
    blended_dataset.blend_in_advance([1.0, 3.0], -5)()  # no draw: the blend raises its error
    assert blended_dataset._drawn_in_advance(weights, -5) is None
    assert blended_dataset._drawn_in_advance(weights, 8) is None
    assert blended_dataset._in_advance == {}


def held_after_draws_end() -> list:
    """The memory held once the blending draws under way have ended (at most 60 s)."""
    from megaindex import memory

    deadline = time.monotonic() + 60
    while any(t.name.startswith("megaindex-blending") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a blending draw is still running after 60 s"
        time.sleep(0.01)
    return memory._reserved


def test_a_draw_in_advance_holds_its_memory_until_forgotten_and_is_not_made_without_it(
    monkeypatch,
):
    """The tables of a draw in advance are held (the parts' memory checks count them) from its
    start until the builder forgets it; where they do not fit, nothing is drawn in advance."""
    from megaindex import blended_dataset, memory

    forget = blended_dataset.blend_in_advance([1.0, 3.0], 1000)
    try:
        assert [size for size, _ in memory._reserved] == [10 * 1000]  # int16 and int64 entries
        assert len(blended_dataset._in_advance) == 1
    finally:
        forget()
    assert blended_dataset._in_advance == {}
    assert held_after_draws_end() == []
    monkeypatch.setattr(memory, "available_memory", lambda: 9_999)
    forget = blended_dataset.blend_in_advance([1.0, 3.0], 1000)  # 10,000 bytes: no room
    assert memory._reserved == [] and blended_dataset._in_advance == {}
    forget()


def test_a_draw_in_advance_forgotten_while_it_runs_holds_its_memory_until_it_ends(monkeypatch):
    """A build that failed forgets its draws in advance while they may still be filling their
    tables: their memory stays held (other builds' checks count it) until the draw ends."""
    from megaindex import blended_dataset, memory

    started, release = threading.Event(), threading.Event()
    draw = blended_dataset.build_blending_indices

    def slow(*args, **kwargs):
        started.set()
        assert release.wait(60)
        return draw(*args, **kwargs)

    monkeypatch.setattr(blended_dataset, "build_blending_indices", slow)
    forget = blended_dataset.blend_in_advance([1.0, 3.0], 1000)
    assert started.wait(60)
    forget()
    assert blended_dataset._in_advance == {}  # no blend takes it any more
    assert [size for size, _ in memory._reserved] == [10 * 1000]  # still filling: held
    release.set()
    assert held_after_draws_end() == []


def test_a_blend_drawn_in_advance_builds_where_its_tables_fit_once(
    make_config, tmp_path, monkeypatch
):
    """A blend that takes the indices drawn in advance holds no memory for them again: with
    room for its tables once (and not twice) it builds, as a blend drawing its own does; the
    draws' memory is given back once the builder is done, the validation and test splits of
    the same size sharing one draw."""
    from megaindex import blended_dataset, memory

    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 40 + 9 * n, seed=n) for n in range(4)]
    checked: list[int] = []
    check = memory.check_fits

    def recording(where, parts, sizing):
        if where.startswith("the blend of"):
            checked.append(sum(parts.values()))
        return check(where, parts, sizing)

    monkeypatch.setattr(memory, "check_fits", recording)
    draws = threads_drawing(monkeypatch)
    config = make_config(
        blend=(prefixes, [3.0, 1.0, 2.0, 0.5]), split="80,10,10", path_to_cache=str(tmp_path)
    )
    built = BlendedMegatronDatasetBuilder(GPTDataset, [300, 30, 30], lambda: True, config).build()
    assert checked == [0, 0, 0]  # the blends' tables: held by their draws in advance already
    assert len(draws) == 2  # the train split's, and one for validation and test
    assert memory._reserved == [] and blended_dataset._in_advance == {}
    numpy.testing.assert_array_equal(built[1].dataset_index, built[2].dataset_index)


def test_a_child_forked_during_a_draw_in_advance_draws_its_own():
    import multiprocessing

    from megaindex import blended_dataset, memory

    def child():
        assert blended_dataset._in_advance == {}  # none of the parent's drawing threads here
        assert memory._reserved == []  # nor the memory they held

    forget = blended_dataset.blend_in_advance([1.0, 3.0, 2.0], 100_000)
    try:
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        process.join(120)
    finally:
        forget()
    assert process.exitcode == 0
