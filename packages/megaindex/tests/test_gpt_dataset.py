import errno
import glob
import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import numpy
import pytest
import torch

from megafmt import IndexedDataset
from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    CacheError,
    EmptySplitError,
    GPTDataset,
    IndexBuildError,
    MegatronDataset,
    Split,
    StaleCacheError,
)
from megaindex import cache as cache_module
from megaindex.cache import CacheEntry

SIZES = [1000, 50, 10]


def build(config, sizes=SIZES):
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def tables(dataset):
    return [
        numpy.array(getattr(dataset, name))
        for name in ("document_index", "sample_index", "shuffle_index")
    ]


def test_first_build_caches_under_megatron_names_then_hits(make_config):
    config = make_config()
    train, _valid, _test = build(config)
    assert train.index_source.kind == "built"
    # Megatron-LM names the cache by the md5 of the description text
    key = hashlib.md5(train.unique_description.encode("utf-8")).hexdigest()
    assert key == train.unique_description_hash
    names = sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(config.path_to_cache, f"{key}*"))
    )
    assert names == [
        f"{key}-GPTDataset-train-{affix}"
        for affix in (
            "description.txt",
            "document_index.npy",
            "megaindex.json",
            "sample_index.npy",
            "shuffle_index.npy",
        )
    ]
    with open(os.path.join(config.path_to_cache, names[0])) as stream:
        assert stream.read() == train.unique_description
    again = build(make_config())[0]
    assert again.index_source.kind == "cache"
    for ours, cached in zip(tables(train), tables(again), strict=True):
        numpy.testing.assert_array_equal(ours, cached)
        assert ours.dtype == cached.dtype
    assert type(again.sample_index) is numpy.ndarray  # a plain view: fast to index
    assert not again.sample_index.flags.writeable  # mapped read-only from the cache, not read


def test_samples_have_megatron_shapes_and_dtypes(make_config):
    train = build(make_config())[0]
    assert len(train) == 1023  # what the stream holds beyond the 1000 asked for
    sample = train[5]
    assert list(sample) == ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
    assert sample["tokens"].shape == (32,) and sample["attention_mask"].shape == (1, 32, 32)
    assert torch.equal(sample["tokens"][1:], sample["labels"][:-1])
    padding = train[None]
    assert padding["loss_mask"].sum() == 0
    assert torch.equal(padding["tokens"], train[0]["tokens"])


class Reversed(GPTDataset):
    """A subclass that shapes its samples where Megatron-LM's FIM dataset does."""

    def _query_document_sample_shuffle_indices(self, idx):
        text, documents = super()._query_document_sample_shuffle_indices(idx)
        return text[::-1].copy(), documents


def test_a_subclass_shaping_its_samples_is_heard(make_config):
    plain = build(make_config())[0]
    config = make_config(path_to_cache=None)
    reversed_ = BlendedMegatronDatasetBuilder(Reversed, SIZES, lambda: True, config).build()[0]
    text, _ = plain._query_document_sample_shuffle_indices(5)
    expected = torch.from_numpy(text[::-1].copy())
    assert torch.equal(reversed_[5]["tokens"], expected[:-1])
    assert torch.equal(reversed_.__getitems__([5, 6]).collated["labels"][0], expected[1:])


def test_deferred_mapping_and_fast_cache_load(make_config):
    built = build(make_config())[0]
    deferred = build(make_config(defer_npy_index_mmap=True))[0]
    assert deferred.sample_index is None and len(deferred) == len(built)
    assert torch.equal(deferred[7]["tokens"], built[7]["tokens"])
    per_split = dict(
        blend=None, split=None, blend_per_split=[([built.dataset_path], None), None, None]
    )
    first = build(make_config(**per_split))[0]  # fast_cache_load needs per-split blends
    fast = build(make_config(fast_cache_load=True, **per_split))[0]
    assert fast.index_source.kind == "cache"
    assert torch.equal(fast[3]["tokens"], first[3]["tokens"])


def corrupt_and_rebuild(make_config, damage, message):
    config = make_config()
    train = build(config)[0]
    expected = tables(train)
    base = os.path.join(config.path_to_cache, f"{train.unique_description_hash}-GPTDataset-train")
    damage(base)
    with pytest.warns(UserWarning, match=message):
        rebuilt = build(make_config())[0]
    assert rebuilt.index_source.kind == "built"
    for a, b in zip(expected, tables(rebuilt), strict=True):
        numpy.testing.assert_array_equal(a, b)
    assert build(make_config())[0].index_source.kind == "cache"


def test_truncated_table_is_rebuilt(make_config):
    def damage(base):
        os.truncate(base + "-sample_index.npy", 200)

    corrupt_and_rebuild(
        make_config,
        damage,
        r"sample_index.npy: 200 bytes, expected 8320 .*"
        r"truncated",
    )


def test_table_of_the_wrong_dtype_is_rebuilt(make_config):
    def damage(base):
        shuffle = numpy.load(base + "-shuffle_index.npy")
        numpy.save(base + "-shuffle_index.npy", shuffle.astype(numpy.int64))

    corrupt_and_rebuild(
        make_config,
        damage,
        r"shuffle_index.npy: a int64 array of shape "
        r"\(1023,\), expected uint32 of shape \(1023,\)",
    )


def test_garbage_table_is_rebuilt(make_config):
    def damage(base):
        with open(base + "-document_index.npy", "wb") as stream:
            stream.write(b"not an npy file")

    corrupt_and_rebuild(make_config, damage, "document_index.npy: unreadable .npy header")


def test_mismatched_description_is_rebuilt(make_config):
    def damage(base):
        with open(base + "-description.txt", "a") as stream:
            stream.write(" ")

    corrupt_and_rebuild(make_config, damage, "the description does not match")


def test_retokenized_corpus_is_noticed(make_config, corpus):
    before = tables(build(make_config())[0])
    write_corpus(corpus, seed=1)  # same path, other documents
    with pytest.raises(StaleCacheError, match=r"built from other data: corpus.bin_bytes: "):
        build(make_config(stale_cache="error"))
    with pytest.warns(UserWarning, match="built from other data"):
        rebuilt = build(make_config())[0]
    assert rebuilt.index_source.kind == "built"
    assert not numpy.array_equal(before[1], tables(rebuilt)[1])


def _mapped_tables(dataset) -> list[str]:
    """The names of the dataset's table files this process maps now."""
    with open("/proc/self/maps") as stream:
        mapped = {line.split()[-1] for line in stream if line.rstrip().endswith(".npy")}
    return sorted(os.path.basename(p) for p in mapped if dataset.unique_description_hash in p)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc")
def test_tables_are_mapped_when_first_read_after_a_build_and_a_cache_hit(make_config):
    for kind in ("built", "cache"):
        train = build(make_config())[0]
        assert train.index_source.kind == kind
        assert _mapped_tables(train) == []  # a blend of thousands maps what it reads
        assert len(train) == train.sample_index.shape[0] - 1  # the length, without mapping
        train[0]
        assert len(_mapped_tables(train)) == 3
        del train


def _table_paths(config, dataset) -> list[str]:
    return [
        os.path.join(
            config.path_to_cache, f"{dataset.unique_description_hash}-GPTDataset-train-{table}.npy"
        )
        for table in ("document_index", "sample_index", "shuffle_index")
    ]


def test_a_table_replaced_after_the_load_by_other_tables_is_refused_when_read(make_config):
    loaded = build(make_config())[0]
    other = build(make_config(random_seed=99))[0]
    for path, values in zip(_table_paths(make_config(), loaded), tables(other), strict=True):
        numpy.save(path + ".new", values)  # another build's tables under this one's name
        os.replace(path + ".new.npy", path)
    with pytest.raises(CacheError, match=r"index.npy: replaced with other tables after this"):
        loaded[0]


def test_a_table_rebuilt_the_same_after_the_load_is_read(make_config):
    loaded = build(make_config())[0]
    for path in _table_paths(make_config(), loaded):
        with open(path, "rb") as stream:
            data = stream.read()
        with open(path + ".new", "wb") as stream:
            stream.write(data)  # another file: the same tables, built again
        os.replace(path + ".new", path)
    for ours, again in zip(tables(loaded), tables(build(make_config())[0]), strict=True):
        numpy.testing.assert_array_equal(ours, again)


def test_changed_fields_outside_megatrons_key_are_noticed(make_config):
    build(make_config())
    with pytest.warns(UserWarning, match="config.add_extra_token_to_sequence: True -> False"):
        rebuilt = build(make_config(add_extra_token_to_sequence=False))[0]
    assert rebuilt.index_source.kind == "built"


def test_a_build_killed_between_files_is_repaired(make_config, tmp_path):
    config = make_config()
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import megaindex.cache as cache
        from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
        from megaindex.tokenizer import IdentifiedTokenizer
        real = cache.write_files
        def dying(files, on_done, on_error, background=True, tables=None):
            tables = [f for f in files if f.path.endswith(".npy")]
            real(tables, lambda: None, on_error, background=False)
            os.kill(os.getpid(), signal.SIGKILL)  # the tables are written, the rest is not
        cache.write_files = dying
        config = GPTDatasetConfig(random_seed=1234, sequence_length=32,
            blend=([{config.blend[0][0]!r}], None), split="90,8,2",
            tokenizer=IdentifiedTokenizer.null(1000), path_to_cache={config.path_to_cache!r},
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        BlendedMegatronDatasetBuilder(GPTDataset, {SIZES!r}, lambda: True, config).build()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    left = sorted(
        os.path.basename(p).split("-", 1)[1]
        for p in glob.glob(os.path.join(config.path_to_cache, "*"))
    )
    assert left == [
        "GPTDataset-train-document_index.npy",
        "GPTDataset-train-sample_index.npy",
        "GPTDataset-train-shuffle_index.npy",
    ]
    repaired = build(make_config())[0]
    assert repaired.index_source.kind == "built"
    assert build(make_config())[0].index_source.kind == "cache"


def _build_in_process(config, queue):
    dataset = build(config)[0]
    queue.put((dataset.index_source.kind, [t.tolist() for t in tables(dataset)]))


def test_two_processes_building_the_same_cache(make_config):
    config = make_config()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_build_in_process, args=(config, queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert results[0][1] == results[1][1]
    cached = build(make_config())[0]
    assert cached.index_source.kind == "cache"
    assert [t.tolist() for t in tables(cached)] == results[0][1]


def test_unwritable_cache_directory_names_path_to_cache(make_config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(
        CacheError,
        match=r"cannot write the index cache to .*file/cache.*set "
        r"path_to_cache \(--data-cache-path\)",
    ):
        build(make_config(path_to_cache=str(blocker / "cache")))


@pytest.mark.parametrize(
    ("number", "advice"),
    [
        (errno.EROFS, "which is often read-only: set path_to_cache"),
        (errno.ENOSPC, "The disk is full: free space there"),
        (errno.EDQUOT, "The disk is full: free space there"),
        (errno.EIO, ". Where the folder is the cause, set path_to_cache (--data-cache-path) to"),
    ],
)
def test_a_failed_cache_write_is_advised_by_its_cause(number, advice):
    entry = CacheEntry("/cache", "0123-GPTDataset-train", ("document_index",))
    error = cache_module.write_error(entry, OSError(number, os.strerror(number)))
    assert str(error).startswith(f"cannot write the index cache to /cache: [Errno {number}]")
    assert advice in str(error)
    if number != errno.EROFS:
        assert "read-only" not in str(error)
    # the node's copy of a shared store's tables is moved by object_storage_cache_path
    entry = CacheEntry("/node/copy", "0123-GPTDataset-train", ("document_index",), "s3://b/c")
    error = cache_module.write_error(entry, OSError(number, os.strerror(number)))
    assert str(error).startswith(
        "cannot write the local copy of the shared index cache s3://b/c to /node/copy: [Errno "
    )
    assert "object_storage_cache_path (--object-storage-cache-path)" in str(error)
    assert "path_to_cache" not in str(error) and "read-only" not in str(error)


@pytest.mark.parametrize(
    ("number", "advice"),
    [
        (errno.EMFILE, ". The open-files limit was reached"),
        (errno.ENOENT, ". The folder, or files in it, went away while the build ran"),
    ],
)
def test_a_cache_write_failed_for_a_limit_or_a_folder_gone_says_so(number, advice):
    entry = CacheEntry("/cache", "0123-GPTDataset-train", ("document_index",))
    error = cache_module.write_error(entry, OSError(number, os.strerror(number)))
    assert str(error).startswith(f"cannot write the index cache to /cache: [Errno {number}]")
    assert advice in str(error)
    assert "set path_to_cache" not in str(error)
    assert error.errno == number  # the cause, for callers and the CLI's hint


def test_default_cache_sits_beside_the_data(make_config, corpus):
    train = build(make_config(path_to_cache=None))[0]
    assert train.index_source.cache_entry.directory == os.path.join(
        corpus, "cache", "GPTDataset_indices"
    )


def test_samples_asked_of_a_split_without_documents_are_an_error(make_config, tmp_path):
    small = write_corpus(str(tmp_path / "small"), documents=10)
    with pytest.raises(EmptySplitError, match=r"small \(valid split\): 5 samples need 161"):
        build(make_config(blend=([small], None), split="99,1,0"), [10, 5, None])


def test_sequence_length_below_one_is_an_error(make_config):
    with pytest.raises(IndexBuildError, match="sequence_length must be at least 1, got 0"):
        build(make_config(sequence_length=0))


def test_sidecar_records_the_plan(make_config, corpus):
    train = build(make_config())[0]
    with open(train.index_source.cache_entry.sidecar_path) as stream:
        sidecar = json.load(stream)
    # Megatron-LM's count: the train split is documents [0, 270); 1000 samples of 32 tokens and
    # the extra one take as many whole epochs as it needs to hold 32 * 1000 + 1 tokens
    tokens = int(IndexedDataset(corpus).sequence_lengths[:270].sum())
    epochs = -(-(32 * 1000 + 1) // tokens)
    assert sidecar["plan"]["tokens_per_epoch"] == tokens
    assert sidecar["plan"]["num_epochs"] == epochs == train.epoch_plan.num_epochs
    assert sidecar["tables"]["sample_index"] == {"dtype": "int32", "shape": [1024, 2]}
    assert train.index_split is Split.train


def test_fast_cache_load_with_deferred_mapping(make_config):
    per_split = dict(
        blend=None, split=None, blend_per_split=[([make_config().blend[0][0]], None), None, None]
    )
    built = build(make_config(**per_split))[0]
    fast = build(make_config(fast_cache_load=True, defer_npy_index_mmap=True, **per_split))[0]
    assert fast.indices is None and fast.sample_index is None
    assert len(fast) == len(built)
    assert torch.equal(fast[9]["tokens"], built[9]["tokens"])


def test_a_touched_corpus_with_the_same_contents_keeps_its_cache(make_config, corpus):
    build(make_config())
    later = os.stat(corpus + ".idx").st_mtime_ns + 10**9
    os.utime(corpus + ".idx", ns=(later, later))  # new stats, same bytes: hashed, still fresh
    assert build(make_config())[0].index_source.kind == "cache"


def test_the_tables_of_a_remote_corpus_are_cached_under_its_host_and_key(make_config, tmp_path):
    """Under object_storage_cache_path, at a path made of the URL's host and key: its user info
    (credentials) never becomes a folder name."""
    import fsspec

    url = "memory://reader:s3cr3t@megaindex-tables/web/c"  # the memory store keeps user info
    local = write_corpus(str(tmp_path / "c"))
    for suffix in (".bin", ".idx"):
        with open(local + suffix, "rb") as source, fsspec.open(url + suffix, "wb") as target:
            target.write(source.read())
    config = make_config(
        blend=([url], None), path_to_cache=None, object_storage_cache_path=str(tmp_path / "objects")
    )
    train = build(config)[0]
    folder = tmp_path / "objects" / "memory" / "megaindex-tables" / "web" / "c" / "cache"
    assert train.index_source.cache_entry.directory == str(folder / "GPTDataset_indices")
    assert not [path for path in (tmp_path / "objects").rglob("*") if "s3cr3t" in str(path)]


class Described(MegatronDataset):
    def __len__(self):
        return 1

    def __getitem__(self, idx):
        return {}


@pytest.mark.parametrize(
    ("path", "described"),
    [
        ("s3://KEY:SECRET@bucket/web_text_document", "s3://***@bucket/web_text_document"),
        (
            "https://host/web?X-Amz-Credential=AKIA1&X-Amz-Signature=f00d&part=2",
            "https://host/web?X-Amz-Credential=***&X-Amz-Signature=***&part=2",
        ),
        ("s3://bucket/web_text_document", "s3://bucket/web_text_document"),
        # a local path is described as given (megatron-core's description), whatever it holds
        ("data/token=5/user:pass@host", "data/token=5/user:pass@host"),
    ],
)
def test_a_url_s_credentials_stay_out_of_the_description(make_config, path, described):
    dataset = Described(None, path, None, 1, Split.train, make_config())
    assert dataset.unique_identifiers["dataset_path"] == described
    assert "SECRET" not in dataset.unique_description and "f00d" not in dataset.unique_description
    resigned = Described(None, path.replace("f00d", "beef"), None, 1, Split.train, make_config())
    assert resigned.unique_description_hash == dataset.unique_description_hash
