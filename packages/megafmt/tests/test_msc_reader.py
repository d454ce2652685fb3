"""The ``msc`` reader (``msc://`` URLs through multi-storage-client, ``megafmt[msc]``) on a
POSIX profile whose base is the file system root, so that any local corpus has an ``msc://``
URL. The S3 profile, and the comparison with megatron-core's reader, are in
tests/compat/test_msc_compat.py."""

import os
import pickle
import sys
from pathlib import Path

import numpy
import pytest

pytest.importorskip("multistorageclient")

from megafmt import IndexedDataset, ObjectStorageConfig, PluginError, open_bin_reader
from megafmt.errors import MissingFileError
from megafmt.testing import BinReaderConformance, write_corpus

pytestmark = pytest.mark.s3  # object storage


@pytest.fixture(scope="module", autouse=True)
def profile(tmp_path_factory):
    """``msc://root/<absolute path>`` for every local file; remote .idx copies in a tmp folder."""
    folder = tmp_path_factory.mktemp("msc")
    config = folder / "msc.yaml"
    config.write_text(
        "profiles:\n  root:\n    storage_provider:\n      type: file\n"
        "      options: {base_path: /}\n"
    )
    saved = {key: os.environ.get(key) for key in ("MSC_CONFIG", "MEGA_CACHE_DIR")}
    os.environ.update({"MSC_CONFIG": str(config), "MEGA_CACHE_DIR": str(folder / "idx")})
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def url_of(local_prefix: str) -> str:
    return "msc://root" + os.path.abspath(local_prefix)


class TestMscReader(BinReaderConformance):
    reader_name = "msc"

    def publish(self, local_prefix):
        return url_of(local_prefix)


def test_indexed_dataset_reads_an_msc_url_as_the_local_corpus(tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=60, longest=200)
    config = ObjectStorageConfig(path_to_idx_cache=str(tmp_path / "idx"))
    remote, here = (
        IndexedDataset(url_of(local), object_storage_config=config),
        IndexedDataset(local),
    )
    assert remote.reader_name == "msc" and len(remote) == len(here)
    for i in range(len(here)):
        numpy.testing.assert_array_equal(remote[i], here[i])
    # the .idx copy sits where megatron-core puts it: <path_to_idx_cache>/<profile>/<key>
    copy = tmp_path / "idx" / "root" / (os.path.abspath(local).lstrip("/") + ".idx")
    assert copy.read_bytes() == Path(local + ".idx").read_bytes()
    clone = pickle.loads(pickle.dumps(remote))
    numpy.testing.assert_array_equal(clone[len(here) - 1], here[len(here) - 1])
    assert IndexedDataset.exists(url_of(local))
    assert not IndexedDataset.exists(url_of(local) + "-missing")


def test_the_idx_copy_follows_a_replaced_object(tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=40, seed=1)
    config = ObjectStorageConfig(path_to_idx_cache=str(tmp_path / "idx"))
    IndexedDataset(url_of(local), object_storage_config=config)
    other = write_corpus(str(tmp_path / "other"), documents=40, seed=2)  # same counts
    for suffix in (".bin", ".idx"):
        os.replace(other + suffix, local + suffix)
    later = os.stat(local + ".idx").st_mtime + 5
    os.utime(local + ".idx", (later, later))  # a new version even on a coarse clock
    reopened = IndexedDataset(url_of(local), object_storage_config=config)
    numpy.testing.assert_array_equal(reopened[0], IndexedDataset(local)[0])
    copy = tmp_path / "idx" / "root" / (os.path.abspath(local).lstrip("/") + ".idx")
    assert copy.read_bytes() == Path(local + ".idx").read_bytes()


def test_a_missing_object_names_it(tmp_path):
    with pytest.raises(MissingFileError, match="missing.bin"):
        open_bin_reader("msc", url_of(str(tmp_path / "missing.bin")))


def test_without_multi_storage_client_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "multistorageclient", None)  # import fails as if absent
    with pytest.raises(PluginError, match=r"pip install 'megafmt\[msc\]'"):
        IndexedDataset(url_of(str(tmp_path / "c")))


def test_the_reader_says_which_versions_it_opened_as_the_fingerprint_words_them(tmp_path):
    """What megaindex compares once a corpus's tables are built: the versions opened, keyed and
    worded as the corpus's fingerprint records a URL's; a replacement since differs from them."""
    from megafmt.fingerprint import corpus_fingerprint

    local = write_corpus(str(tmp_path / "c"), documents=40, longest=100)
    dataset = IndexedDataset(url_of(local))
    assert dataset.opened_versions == corpus_fingerprint(url_of(local))
    opened = dict(dataset.opened_versions)
    replacement = write_corpus(str(tmp_path / "d"), documents=50, longest=100, seed=3)
    for suffix in (".bin", ".idx"):
        os.replace(replacement + suffix, local + suffix)
    now = corpus_fingerprint(url_of(local))
    assert now["idx_bytes"] != opened["idx_bytes"] and now["bin_hash"] != opened["bin_hash"]
    assert dataset.opened_versions == opened  # what was opened, not what is there now
    reader = open_bin_reader("msc", url_of(local) + ".bin")
    assert reader.opened_versions is None  # its .idx not copied yet: nothing to say of it
