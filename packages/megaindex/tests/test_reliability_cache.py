"""Reliability: damaged and stale caches, killed builds and unreadable corpora end in a clear
error naming the file (or are repaired with a warning naming it), never in wrong samples."""

from __future__ import annotations

import errno
import glob
import io
import json
import math
import os
import shutil
import struct
import time

import numpy
import pytest

from megafmt.atomic import remove_stale_partials_in
from megaindex import BlendedMegatronDatasetBuilder, CacheError, GPTDataset, StaleCacheError
from megaindex import cache as cache_module
from megaindex.cache import IndexCache, _npy_file, read_npy_header
from megaindex.gpt_index import GPTTableRecipe
from megaindex.tables import BuiltTables

SIZES = [1000, 50, 10]


def build(config):
    return BlendedMegatronDatasetBuilder(GPTDataset, SIZES, lambda: True, config).build()[0]


def cache_base(config, dataset) -> str:
    return os.path.join(config.path_to_cache, f"{dataset.unique_description_hash}-GPTDataset-train")


@pytest.mark.parametrize(
    "suffix, error",
    [
        ("-description.txt", errno.EMFILE),
        ("-megaindex.json", errno.ENFILE),
        ("-shuffle_index.npy", errno.EMFILE),
    ],
)
def test_a_cache_file_unread_for_want_of_descriptors_is_an_error_naming_the_limit(
    make_config, monkeypatch, suffix, error
):
    """A cache file that cannot be opened because the process (or the system) has no
    descriptor left is sound: its cache is neither withdrawn nor rebuilt (it was, as damage,
    with the description or the sidecar; a table's said "the index cache changed after it was
    loaded"); the error names the file and the limit."""
    import builtins

    config = make_config()
    train = build(config)
    path = cache_base(config, train) + suffix
    expected = numpy.array(train.shuffle_index)
    before = {
        name: os.stat(os.path.join(config.path_to_cache, name)).st_ino
        for name in os.listdir(config.path_to_cache)
    }
    real_open = builtins.open

    def short_of_descriptors(file, *args, **kwargs):
        if str(file) == path:
            raise OSError(error, os.strerror(error), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", short_of_descriptors)
    with pytest.raises(CacheError) as raised:
        again = build(make_config())
        numpy.asarray(again.shuffle_index)  # a table is mapped when first read
    message = str(raised.value)
    assert message.startswith(f"{path}: cannot be read"), message
    assert "open-files" in message and "left as it is" in message
    assert "changed after it was loaded" not in message and "--workers" not in message
    assert raised.value.errno == error
    monkeypatch.undo()
    after = {
        name: os.stat(os.path.join(config.path_to_cache, name)).st_ino
        for name in os.listdir(config.path_to_cache)
    }
    assert after == before  # nothing withdrawn, nothing written again
    numpy.testing.assert_array_equal(build(make_config()).shuffle_index, expected)


def test_a_table_that_cannot_be_mapped_is_an_error_and_the_cache_stays(make_config, monkeypatch):
    """A map refused (vm.max_map_count met, a file system without mmap) is the process's
    limit, never the file's damage: a CacheError with the map's own words, nothing rebuilt."""
    config = make_config()
    train = build(config)
    expected = numpy.array(train.shuffle_index)
    files = sorted(os.listdir(config.path_to_cache))
    inodes = [os.stat(os.path.join(config.path_to_cache, f)).st_ino for f in files]

    def refused(path, fd, size):
        raise OSError(errno.ENOMEM, f"cannot map {path}: Cannot allocate memory (vm.max_map_count)")

    monkeypatch.setattr(cache_module, "map_file", refused)
    with pytest.raises(CacheError) as raised:
        numpy.asarray(build(make_config()).shuffle_index)
    message = str(raised.value)
    assert message.startswith("cannot map ") and "vm.max_map_count" in message
    assert "left as it is" in message and raised.value.errno == errno.ENOMEM
    monkeypatch.undo()
    assert [os.stat(os.path.join(config.path_to_cache, f)).st_ino for f in files] == inodes
    numpy.testing.assert_array_equal(build(make_config()).shuffle_index, expected)


def test_a_table_damaged_inside_its_valid_range_is_rebuilt(make_config):
    config = make_config()
    train = build(config)
    expected = numpy.array(train.shuffle_index)
    path = cache_base(config, train) + "-shuffle_index.npy"
    table = numpy.load(path)
    table[[3, 4]] = table[[4, 3]]  # same dtype, shape and values: only the order changed
    time.sleep(0.05)  # a later tick of the file system's clock than the save
    numpy.save(path, table)
    with pytest.warns(UserWarning, match=r"shuffle_index.npy: checksum .* the table changed"):
        rebuilt = build(make_config())
    assert rebuilt.index_source.kind == "built"
    numpy.testing.assert_array_equal(rebuilt.shuffle_index, expected)


def test_a_rebuild_withdraws_the_old_commit_mark_before_it_rewrites_a_table(
    make_config, monkeypatch
):
    """A run killed while it rewrites a damaged entry leaves no description beside a mix of
    old and new tables (megatron-core, and fast_cache_load, take an entry with its
    description for complete)."""
    config = make_config()
    train = build(config)
    base = cache_base(config, train)
    table = numpy.load(base + "-shuffle_index.npy")
    table[[3, 4]] = table[[4, 3]]
    time.sleep(0.05)
    numpy.save(base + "-shuffle_index.npy", table)
    seen = []
    save = IndexCache.save

    def killed_midway(self, tables, sidecar):
        seen.append(os.path.exists(self.entry.description_path))
        raise KeyboardInterrupt  # the run is killed before the first table is rewritten

    monkeypatch.setattr(IndexCache, "save", killed_midway)
    with pytest.warns(UserWarning, match="the table changed"), pytest.raises(KeyboardInterrupt):
        build(make_config())
    assert seen == [False]
    monkeypatch.setattr(IndexCache, "save", save)
    rebuilt = build(make_config())  # the next run builds again, and commits
    assert rebuilt.index_source.kind == "built" and os.path.exists(base + "-description.txt")


def test_a_table_another_process_renamed_over_this_one_s_is_checked_not_trusted(
    make_config, monkeypatch
):
    """Another process's file renamed over a table between its rename and the recording of its
    identity (large tables: after all of them are renamed) is recorded as not this one's: the
    next load checks it by its checksum and rebuilds, instead of trusting it."""
    monkeypatch.setattr(cache_module, "SIDE_BY_SIDE_BYTES", 0)  # numpy's writes on threads
    write_table = IndexCache._write_table

    def raced(self, table, array):
        written = write_table(self, table, array)
        if table == "shuffle_index":
            other_process_saves(self.entry.table_path(table), array)
        return written

    monkeypatch.setattr(IndexCache, "_write_table", raced)
    build(make_config())
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"shuffle_index.npy: checksum .* the table changed"):
        rebuilt = build(make_config())
    assert rebuilt.index_source.kind == "built"


def other_process_saves(path: str, array: numpy.ndarray) -> None:
    """Another process's rename of its own (different) table over ``path``."""
    other = array.copy()
    other[[0, 1]] = other[[1, 0]]
    with open(path + ".other", "wb") as stream:
        numpy.save(stream, other)
    os.replace(path + ".other", path)


def test_built_tables_are_served_from_the_files_just_saved(make_config):
    """After a build the process keeps no private copy of the tables: each is mapped read-only
    from its cache file, as a cache hit maps it, with the same bytes."""
    config = make_config()
    train = build(config)
    assert train.index_source.kind == "built"
    for name in ("document_index", "sample_index", "shuffle_index"):
        table = getattr(train, name)
        assert not table.flags.owndata and not table.flags.writeable  # a read-only mapping
        saved = numpy.load(f"{cache_base(config, train)}-{name}.npy")
        assert table.dtype == saved.dtype and table.shape == saved.shape
        numpy.testing.assert_array_equal(table, saved)


def test_fast_cache_load_skips_the_table_checksum(make_config):
    """Documented: fast_cache_load trusts the cache, as megatron-core does."""
    per_split = dict(
        blend=None, split=None, blend_per_split=[([make_config().blend[0][0]], None), None, None]
    )
    config = make_config(**per_split)
    train = build(config)
    path = cache_base(config, train) + "-shuffle_index.npy"
    table = numpy.load(path)
    built_fourth = int(table[4])  # read first: the built dataset maps the file it saved
    table[[3, 4]] = table[[4, 3]]
    numpy.save(path, table)
    fast = build(make_config(fast_cache_load=True, **per_split))
    assert fast.index_source.kind == "cache" and fast.shuffle_index[3] == built_fourth


def test_sidecar_records_a_checksum_of_every_table(make_config):
    import zlib

    config = make_config()
    train = build(config)
    with open(cache_base(config, train) + "-megaindex.json") as stream:
        sidecar = json.load(stream)
    assert sorted(sidecar["checksums"]) == ["document_index", "sample_index", "shuffle_index"]
    for name, value in sidecar["checksums"].items():  # the CRC-32 of the array's bytes
        assert value == f"{zlib.crc32(numpy.ascontiguousarray(getattr(train, name))):08x}"
    assert sorted(sidecar["table_files"]) == sorted(sidecar["checksums"])


@pytest.mark.parametrize(
    "damage, what",
    [
        (b"[1, 2]", " is a JSON list, not an object"),
        (b"{not json", " cannot be read"),
        (b"\xff\xfe\x00", " cannot be read"),
        (b'{"format": 1, "table_files": null}', "'s 'table_files' is None; expected a mapping"),
        (b'{"format": 1, "tables": [1]}', "'s 'tables' is \\[1\\]; expected a mapping"),
        (
            b'{"format": 1, "tables": {"sample_index": {}}}',
            "'s 'tables' is .*expected a mapping of table to",
        ),
        (b'{"format": 1, "checksums": "0"}', "'s 'checksums' is '0'; expected a mapping"),
        (b'{"format": 1, "corpus": "x"}', "'s 'corpus' is 'x'; expected a mapping or null"),
    ],
)
def test_a_damaged_sidecar_rebuilds_the_tables_it_checked(make_config, damage, what):
    config = make_config()
    train = build(config)
    base = cache_base(config, train)
    # a table of the same shape and dtype with other values, which only the sidecar's checksum
    # tells from the one saved: a damaged sidecar must not leave the shapes as the only check
    shuffle = numpy.load(base + "-shuffle_index.npy")
    numpy.save(base + "-shuffle_index.npy", shuffle[::-1].copy())
    with open(base + "-megaindex.json", "wb") as stream:
        stream.write(damage)
    with pytest.warns(UserWarning, match=f"megaindex.json: the sidecar{what}"):
        again = build(config)
    assert again.index_source.kind == "built"
    numpy.testing.assert_array_equal(again.shuffle_index, train.shuffle_index)
    assert build(config).index_source.kind == "cache"  # a sidecar of its own again


def test_a_sidecar_of_another_format_is_left_and_the_shapes_checked(make_config):
    config = make_config()
    train = build(config)
    with open(cache_base(config, train) + "-megaindex.json", "w") as stream:
        json.dump({"format": 2, "tables": "a later megaindex's"}, stream)
    again = build(config)
    assert again.index_source.kind == "cache"
    numpy.testing.assert_array_equal(again.sample_index, train.sample_index)


def test_a_copied_cache_is_checksummed_and_used(make_config, tmp_path):
    import shutil

    config = make_config()
    build(config)
    shutil.copytree(config.path_to_cache, tmp_path / "copy")  # other inodes: read and checked
    copied = build(make_config(path_to_cache=str(tmp_path / "copy")))
    assert copied.index_source.kind == "cache" and "checksums" in copied.index_source.seconds


def swap_two_lengths(idx: str) -> None:
    """Rewrite the corpus's ``.idx`` in place as another consistent corpus of the same sizes:
    two lengths swapped, the pointer between them moved."""
    with open(idx, "r+b") as stream:
        code, count = struct.unpack("<BQ", stream.read(34)[17:26])
        itemsize = {4: 4, 8: 2}[code]
        stream.seek(34 + 4 * 150)
        first, second = struct.unpack("<ii", stream.read(8))
        assert first != second
        stream.seek(34 + 4 * 150)
        stream.write(struct.pack("<ii", second, first))
        stream.seek(34 + 4 * count + 8 * 151)
        pointer = struct.unpack("<q", stream.read(8))[0]
        stream.seek(34 + 4 * count + 8 * 151)
        stream.write(struct.pack("<q", pointer + (second - first) * itemsize))


def test_a_corpus_rewritten_with_the_same_sizes_is_noticed(make_config, corpus):
    build(make_config())
    idx = corpus + ".idx"
    status = os.stat(idx)
    swap_two_lengths(idx)
    os.utime(idx, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    with pytest.raises(StaleCacheError, match=r"built from other data: corpus.idx_crc32: "):
        build(make_config(stale_cache="error"))


def refused_and_not_cached(config, match: str, *parts: str) -> None:
    """The build of ``config`` fails with a CacheError matching ``match`` and naming each of
    ``parts``, and leaves no cache entry."""
    with pytest.raises(CacheError, match=match) as caught:
        build(config)
    for part in parts:
        assert part in str(caught.value)
    assert not glob.glob(os.path.join(config.path_to_cache, "*-description.txt"))


@pytest.mark.parametrize("fingerprinted", ["by the writer", "in python"])
def test_a_corpus_replaced_while_its_tables_build_is_not_cached(
    make_config, corpus, tmp_path, monkeypatch, fingerprinted
):
    from megafmt.testing import write_corpus
    from megaindex import file_writes, tables
    from megaindex.gpt_index import GPTTableRecipe

    other = write_corpus(str(tmp_path / "other"), 250, seed=9)

    def replace_corpus() -> None:  # re-tokenized elsewhere, renamed over it
        for suffix in (".idx", ".bin"):
            if os.path.exists(other + suffix):
                os.replace(other + suffix, corpus + suffix)

    if fingerprinted == "by the writer":  # after the tables were cut, before the write
        build_tables = GPTTableRecipe.build

        def replacing(self):
            built = build_tables(self)
            replace_corpus()
            return built

        monkeypatch.setattr(GPTTableRecipe, "build", replacing)
    else:  # large tables: fingerprinted beside the build, in Python
        monkeypatch.setattr(tables, "SIDE_BY_SIDE_BYTES", 0)
        monkeypatch.setattr(cache_module, "SIDE_BY_SIDE_BYTES", 0)
        fingerprint = file_writes.corpus_fingerprint

        def replacing(prefix):
            replace_corpus()
            return fingerprint(prefix)

        monkeypatch.setattr(file_writes, "corpus_fingerprint", replacing)
    config = make_config()
    refused_and_not_cached(
        config,
        "changed while its index tables were built",
        "opened as .idx of 6042 bytes",
        "now .idx of 5042 bytes",
    )
    monkeypatch.undo()
    train = build(config)  # the next run cuts its tables from the corpus there now
    assert train.index_source.kind == "built"
    assert len(train.dataset.sequence_lengths) == 250


def after_the_first_cut(monkeypatch, fingerprinted: str, action) -> list:
    """``action()`` once the first of a build's tables were cut (the corpus's fingerprint taken
    by the cache's writer, or beside the build in Python); the recipes cut, in order."""
    from megaindex import tables
    from megaindex.gpt_index import GPTTableRecipe

    build_tables = GPTTableRecipe.build
    cuts = []

    def cutting(self):
        built = build_tables(self)
        cuts.append(self)
        if len(cuts) == 1:
            action()
        return built

    monkeypatch.setattr(GPTTableRecipe, "build", cutting)
    if fingerprinted == "in python":
        monkeypatch.setattr(tables, "SIDE_BY_SIDE_BYTES", 0)
        monkeypatch.setattr(cache_module, "SIDE_BY_SIDE_BYTES", 0)
    return cuts


def bump_mtime(path: str) -> None:
    """A later modification time for ``path`` (a file system's clock may tick coarser than
    the test's writes)."""
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))


@pytest.mark.parametrize("fingerprinted", ["by the writer", "in python"])
def test_a_corpus_touched_while_its_tables_build_is_cached(
    make_config, corpus, monkeypatch, fingerprinted
):
    def touch() -> None:  # a purge of old files, an rsync without -t: the times alone change
        for suffix in (".idx", ".bin"):
            bump_mtime(corpus + suffix)

    cuts = after_the_first_cut(monkeypatch, fingerprinted, touch)
    config = make_config()
    assert build(config).index_source.kind == "built"
    # each split's tables cut twice (the corpus was opened once, before the touch), the second
    # time by a copy of the recipe
    assert len(cuts) == 6 and cuts[0] is not cuts[1]
    # the sidecars record the files as touched: the next load compares two stats, no hash
    for path in glob.glob(os.path.join(config.path_to_cache, "*-megaindex.json")):
        with open(path) as stream:
            recorded = json.load(stream)["corpus_stat"]
        assert recorded["idx"][1] == os.stat(corpus + ".idx").st_mtime_ns
    monkeypatch.undo()
    assert build(config).index_source.kind == "cache"  # the same contents: fingerprinted so


@pytest.mark.parametrize("fingerprinted", ["by the writer", "in python"])
def test_a_corpus_written_in_place_while_its_tables_build_is_not_cached(
    make_config, corpus, monkeypatch, fingerprinted
):
    """The same size and inode, other lengths: its tables cut again differ from the first."""

    def rewrite() -> None:  # re-tokenized into the same files, in place
        swap_two_lengths(corpus + ".idx")
        bump_mtime(corpus + ".idx")

    after_the_first_cut(monkeypatch, fingerprinted, rewrite)
    config = make_config()
    refused_and_not_cached(
        config,
        "was written in place while its index tables were built",
        "the same size (6042 bytes)",
        "the tables cut from it again differ from those cut first",
    )
    monkeypatch.undo()
    rebuilt = build(config)  # the next run cuts its tables from the corpus there now
    assert rebuilt.index_source.kind == "built"
    again = build(config)
    assert again.index_source.kind == "cache"
    numpy.testing.assert_array_equal(again.sample_index, rebuilt.sample_index)


def test_a_corpus_written_in_place_before_the_writer_fingerprints_it_is_not_cached(
    make_config, corpus, monkeypatch
):
    """Once the tables were checked against the files, the writer checks them again: an
    ``.idx`` written in place since (the same size and inode) fails the write."""
    from megaindex.file_writes import CorpusFiles

    step = CorpusFiles.step

    def rewriting(self):  # handed to the writer: written in place right before it reads it
        swap_two_lengths(corpus + ".idx")
        bump_mtime(corpus + ".idx")
        return step(self)

    monkeypatch.setattr(CorpusFiles, "step", rewriting)
    refused_and_not_cached(
        make_config(), "was written in place while its index tables were built", "not cached"
    )


def test_leftovers_of_killed_builds_are_removed_by_the_next_build(make_config):
    config = make_config()
    train = build(config)
    base = cache_base(config, train)
    dead = 2**22 + 12345  # beyond pid_max on most systems: a writer that no longer runs
    leftovers = [
        f"{base}-sample_index.npy.{dead}-0badf00d.partial",
        f"{base}-megaindex.json.{dead}-0badf00d.partial",
    ]
    for path in leftovers:
        with open(path, "wb") as stream:
            stream.write(b"half a table")
    os.remove(base + "-description.txt")  # the next build writes the entry again
    build(make_config())
    assert not glob.glob(os.path.join(config.path_to_cache, "*.partial"))


def test_leftovers_of_an_entry_not_saved_again_are_removed_by_another_s_save(make_config):
    """A killed blend's leftovers belong to entries the next build may load rather than save:
    a save lists the whole folder, not only its own entry's names."""
    config = make_config()
    build(config)
    dead = 2**22 + 12345
    other = os.path.join(
        config.path_to_cache, f"0123-GPTDataset-valid-sample_index.npy.{dead}-0badf00d.partial"
    )
    with open(other, "wb") as stream:
        stream.write(b"half a table")
    build(make_config(random_seed=7))  # another entry saved into the folder
    assert not os.path.exists(other)


@pytest.mark.parametrize("threads", [1, 4])
def test_a_blend_built_on_threads_lists_its_cache_folder_for_leftovers_once(
    make_config, tmp_path, monkeypatch, threads
):
    """A save lists the folder for leftovers only when something else wrote there since this
    process's last save, and none of its saves is under way: the builder's own threads never
    count as something else (nor do they wait for each other's writes)."""
    from megafmt.testing import write_corpus
    from megaindex import cache

    listings = []
    monkeypatch.setattr(
        cache,
        "remove_stale_partials_in",
        lambda folder: listings.append(folder) or remove_stale_partials_in(folder),
    )
    prefixes = [write_corpus(str(tmp_path / f"c{n}"), 5 + n, seed=n) for n in range(40)]
    config = make_config(
        blend=(prefixes, [1.0] * 40), split="100,0,0", num_dataset_builder_threads=threads
    )
    os.makedirs(config.path_to_cache)  # a folder of before: the first save lists it
    BlendedMegatronDatasetBuilder(GPTDataset, [400, 0, 0], lambda: True, config).build()
    assert len(glob.glob(os.path.join(config.path_to_cache, "*-description.txt"))) == 41
    assert len(listings) == 1


class Planted:
    """Unpickling this makes the folder ``sign``: the mark that a table was unpickled."""

    def __init__(self, sign):
        self.sign = sign

    def __reduce__(self):
        return (os.mkdir, (self.sign,))


def test_a_table_holding_pickled_objects_is_rebuilt_never_unpickled(make_config, tmp_path):
    config = make_config()
    train = build(config)
    expected = numpy.array(train.shuffle_index)
    path = cache_base(config, train) + "-shuffle_index.npy"
    sign = tmp_path / "unpickled"
    numpy.save(path, numpy.array([Planted(str(sign))], dtype=object), allow_pickle=True)
    with pytest.warns(UserWarning, match=r"shuffle_index\.npy: "):
        rebuilt = build(make_config())
    assert not sign.exists()
    assert rebuilt.index_source.kind == "built"
    numpy.testing.assert_array_equal(rebuilt.shuffle_index, expected)


def replace_with_copy(path: str) -> None:
    """Put a copy of ``path`` in its place (another inode, the same bytes and times), as a copy
    of a cache or corpus to another disk leaves it."""
    shutil.copy2(path, path + ".copy")
    os.replace(path + ".copy", path)


def write_in_place_keeping_mtime(path: str, write) -> None:
    """``write(path)`` in place, then set the modification time back (a tool that preserves
    times): only the change time tells."""
    status = os.stat(path)
    time.sleep(0.05)  # a later tick of the file system's clock than any note
    write(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def swap_two_samples(path: str) -> None:
    table = numpy.load(path)
    table[[3, 4]] = table[[4, 3]]
    with open(path, "r+b") as stream:  # the same file: only the bytes of the two samples
        stream.seek(os.path.getsize(path) - table.nbytes)
        stream.write(table.tobytes())


@pytest.mark.parametrize("damaged", ["table", "corpus"])
def test_a_copied_cache_is_verified_once_per_machine_and_damage_after_is_caught(
    make_config, corpus, monkeypatch, tmp_path, damaged
):
    """A cache and corpus that are copies (other inodes than the sidecar recorded) are verified
    in full (checksums, corpus fingerprint) on their first load on this machine only; a write in
    place after that, even one that sets the modification time back, is caught on the next load
    exactly as without the note."""
    from megafmt import fingerprint
    from megaindex import tables as tables_module

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    fingerprints = []
    real = tables_module.corpus_fingerprint
    monkeypatch.setattr(
        tables_module, "corpus_fingerprint", lambda p: fingerprints.append(p) or real(p)
    )
    config = make_config()
    built = build(config)
    expected = numpy.array(built.shuffle_index)
    base = cache_base(config, built)
    for path in [corpus + ".idx", corpus + ".bin", *glob.glob(base + "-*.npy")]:
        replace_with_copy(path)
    time.sleep(0.05)
    fingerprints.clear()
    first = build(make_config())
    assert first.index_source.kind == "cache" and "checksums" in first.index_source.seconds
    assert len(fingerprints) == 3  # one per split (the .idx is read once, then remembered)
    assert len(list((tmp_path / "notes" / "verified").glob("*.json"))) == 3
    second = build(make_config())
    assert second.index_source.kind == "cache" and "checksums" not in second.index_source.seconds
    assert len(fingerprints) == 3  # neither the .idx nor the tables were read again
    if damaged == "table":
        write_in_place_keeping_mtime(base + "-shuffle_index.npy", swap_two_samples)
        with pytest.warns(UserWarning, match=r"shuffle_index.npy: checksum .* the table changed"):
            rebuilt = build(make_config())
        assert rebuilt.index_source.kind == "built"
        numpy.testing.assert_array_equal(rebuilt.shuffle_index, expected)
    else:
        write_in_place_keeping_mtime(corpus + ".idx", swap_two_lengths)
        with pytest.raises(StaleCacheError, match=r"built from other data: corpus.idx_crc32: "):
            build(make_config(stale_cache="error"))


def test_processes_loading_an_unnoted_copy_at_once_verify_it_once(
    make_config, corpus, monkeypatch, tmp_path
):
    """While one process holds the lock on a copied cache's note (verifying it), another that
    loads the cache waits, then finds the note and reads neither the tables nor the .idx."""
    import threading

    from megafmt import fingerprint
    from megafmt.checked import one_checker
    from megaindex import verified

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    built = build(make_config())
    entry = built.index_source.cache_entry
    for path in [corpus + ".idx", corpus + ".bin", *glob.glob(entry.path("*.npy"))]:
        replace_with_copy(path)
    time.sleep(0.05)
    loaded = []
    waiter = threading.Thread(target=lambda: loaded.append(build(make_config())))
    with one_checker(entry.sidecar_path, verified.NOTES):  # the first process, verifying
        waiter.start()
        waiter.join(timeout=0.3)
        assert waiter.is_alive() and not loaded  # waits for the lock
        taken = time.time_ns()
        verified.remember_verified(entry, verified.cache_identity(entry, corpus), taken)
    waiter.join(timeout=10)
    (train,) = loaded
    assert train.index_source.kind == "cache" and "checksums" not in train.index_source.seconds


def test_a_cache_of_the_very_files_saved_needs_no_note_and_no_lock(
    make_config, monkeypatch, tmp_path
):
    """Files that are exactly those the sidecar recorded are checked by their stats alone: the
    load neither waits for the note's lock nor writes a note."""
    from megafmt import fingerprint

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "notes"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    build(make_config())
    loaded = build(make_config())
    assert loaded.index_source.kind == "cache" and "checksums" not in loaded.index_source.seconds
    assert not (tmp_path / "notes" / "verified").exists()


def test_a_folder_untouched_since_this_process_saved_into_it_is_not_listed_again(
    tmp_path, monkeypatch
):
    from megaindex.cache import CacheEntry, IndexCache

    listings = []
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda folder: listings.append(folder) or listdir(folder))
    for number in range(3):
        entry = CacheEntry(str(tmp_path), f"{number:032x}-GPTDataset-train", ("table",))
        IndexCache(entry, "described").save({"table": numpy.arange(4)}, None)
    assert listings.count(str(tmp_path)) == 1  # the first save only
    dead = 2**22 + 777
    leftover = tmp_path / f"{3:032x}-GPTDataset-train-table.npy.{dead}-0badf00d.partial"
    leftover.write_bytes(b"half")  # another writer touched the folder: it is listed again
    entry = CacheEntry(str(tmp_path), f"{3:032x}-GPTDataset-train", ("table",))
    IndexCache(entry, "described").save({"table": numpy.arange(4)}, None)
    assert listings.count(str(tmp_path)) == 2 and not leftover.exists()


def test_a_cache_folder_that_is_a_link_to_nothing_is_named_as_such(make_config, tmp_path):
    dangling = tmp_path / "cache"
    os.symlink(tmp_path / "gone", dangling)
    with pytest.raises(
        CacheError,
        match=r"the index cache folder must be a folder, found a symbolic link to .*gone', which "
        "does not exist",
    ):
        build(make_config(path_to_cache=str(dangling)))


@pytest.mark.parametrize(
    "array",
    [
        numpy.arange(5, dtype=numpy.int32),
        numpy.zeros((3, 2), dtype=numpy.int64),
        numpy.zeros((0, 2), dtype=">u2"),
        numpy.zeros((2, 3), order="F"),
        numpy.float64(3.0),
        numpy.zeros(3, dtype=[("a", "<i4")]),  # not numpy.save's plain header: numpy reads it
        numpy.zeros((1,) * 30, dtype=numpy.uint8),  # a long header, padded past 64 bytes
    ],
    ids=lambda array: f"{array.dtype}{array.shape}",
)
def test_npy_headers_read_as_numpy_reads_them(array):
    stream = io.BytesIO()
    numpy.save(stream, array)
    stream.seek(0)
    found, at = read_npy_header(stream), stream.tell()
    stream.seek(0)
    numpy.lib.format.read_magic(stream)
    assert found == numpy.lib.format.read_array_header_1_0(stream)
    assert at == stream.tell()  # left at the first byte of the data


@pytest.mark.parametrize(
    "dtype", ["<i4", "<i8", "<u4", ">i4", "|u1", "<f8", "<c16", "S3", "<M8[s]"]
)
@pytest.mark.parametrize(
    "shape",
    [(0,), (1,), (9,), (10,), (99,), (12345,), (0, 2), (7, 2), (100, 2), (3, 4, 5), ()],
)
def test_tables_are_saved_with_the_bytes_numpy_save_writes(dtype, shape):
    # the cache writes a table's header from numpy's header of a shape with the same digits
    array = numpy.arange(math.prod(shape)).astype(dtype).reshape(shape)
    stream = io.BytesIO()
    numpy.save(stream, array, allow_pickle=False)
    assert bytes(_npy_file(array)) == stream.getvalue()
    strided = array[::2] if array.ndim else array
    for other in (array.T, numpy.asfortranarray(array), strided):  # not C-ordered
        stream = io.BytesIO()
        numpy.save(stream, other, allow_pickle=False)
        assert bytes(_npy_file(other)) == stream.getvalue()


@pytest.mark.parametrize("in_a_build", [False, True])
def test_a_save_failing_before_its_files_are_written_ends_the_save(tmp_path, in_a_build):
    # a save under way keeps later saves of the process from listing the folder for the
    # leftovers of killed builds: one that fails must not stay under way
    import contextlib

    from megaindex import cache, file_writes

    entry = cache.CacheEntry.for_dataset(str(tmp_path), "0" * 32, "GPTDataset", "train", ("t",))
    saving = cache.IndexCache(entry, "{}")
    scope = file_writes.background_writes() if in_a_build else contextlib.nullcontext()
    with scope, pytest.raises(TypeError):
        saving.save({"t": numpy.arange(3)}, {"config": {"not json": object()}})
    assert cache._saves_under_way == {}
    saving.save({"t": numpy.arange(3)}, {"config": {}})()  # and the next one is written
    assert cache._saves_under_way == {}
    assert entry.complete()


def test_a_child_forked_during_a_save_has_none_of_its_parents_saves_under_way(tmp_path):
    """The parent's saves (and its lock, maybe held by one of its threads) stay with it: a
    child's first save into the folder lists it for leftovers, and takes the lock freely."""
    import multiprocessing

    folder = str(tmp_path)

    def child():
        assert cache_module._saves_under_way == {}
        assert cache_module._begin_save(folder)  # alone there: lists the folder
        cache_module._end_save(folder)

    cache_module._begin_save(folder)
    try:
        with cache_module._saves_lock:  # another thread's, held at the fork
            process = multiprocessing.get_context("fork").Process(target=child)
            process.start()
        process.join(120)
    finally:
        cache_module._end_save(folder)
    assert process.exitcode == 0


def test_a_damaged_table_in_a_folder_that_cannot_be_written_is_an_error_naming_both(
    make_config, monkeypatch
):
    import megaindex.cache

    config = make_config()
    base = cache_base(config, build(config))
    with open(base + "-sample_index.npy", "r+b") as stream:
        stream.truncate(100)

    def refused(path):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(megaindex.cache, "remove_quietly", refused)  # a read-only folder
    built = []
    monkeypatch.setattr(
        GPTTableRecipe, "build", lambda recipe: built.append(recipe) or BuiltTables({})
    )
    refusal = (
        r"sample_index.npy: .*; it cannot be rebuilt: cannot write the index cache to "
        r".*Permission denied.*writable directory"
    )
    with pytest.raises(CacheError, match=refusal):
        build(config)
    assert not built  # refused before the tables were built again, not after


def test_a_folder_where_a_cache_file_belongs_is_named_as_in_the_way(make_config):
    config = make_config()
    base = cache_base(config, build(config))
    for name in os.listdir(config.path_to_cache):
        os.remove(os.path.join(config.path_to_cache, name))
    os.mkdir(base + "-shuffle_index.npy")
    with pytest.raises(CacheError, match=r"shuffle_index.npy.*Something is in the way"):
        build(config)
