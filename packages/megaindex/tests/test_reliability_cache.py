"""Reliability: damaged and stale caches, killed builds and unreadable corpora end in a clear
error naming the file (or are repaired with a warning naming it), never in wrong samples."""

from __future__ import annotations

import glob
import json
import os
import struct
import time

import numpy
import pytest

from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, StaleCacheError

SIZES = [1000, 50, 10]


def build(config):
    return BlendedMegatronDatasetBuilder(GPTDataset, SIZES, lambda: True, config).build()[0]


def cache_base(config, dataset) -> str:
    return os.path.join(config.path_to_cache, f"{dataset.unique_description_hash}-GPTDataset-train")


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


def test_a_copied_cache_is_checksummed_and_used(make_config, tmp_path):
    import shutil

    config = make_config()
    build(config)
    shutil.copytree(config.path_to_cache, tmp_path / "copy")  # other inodes: read and checked
    copied = build(make_config(path_to_cache=str(tmp_path / "copy")))
    assert copied.index_source.kind == "cache" and "checksums" in copied.index_source.seconds


def test_a_corpus_rewritten_with_the_same_sizes_is_noticed(make_config, corpus):
    build(make_config())
    idx = corpus + ".idx"
    status = os.stat(idx)
    with open(idx, "r+b") as stream:  # two lengths swapped, the pointer between them moved
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
    os.utime(idx, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    with pytest.raises(StaleCacheError, match=r"built from other data: corpus.idx_crc32: "):
        build(make_config(stale_cache="error"))


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
