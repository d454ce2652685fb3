"""GPTDataset over ``msc://`` corpora (multi-storage-client, ``megafmt[msc]``) on a POSIX
profile whose base is the file system root: a corpus replaced in the store while its tables
build is not cached. The seed commit's side of msc:// is in tests/compat/test_msc_compat.py."""

import os

import numpy
import pytest

pytest.importorskip("multistorageclient")

from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, CacheError, GPTDataset, GPTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer

pytestmark = pytest.mark.s3  # object storage


@pytest.fixture(autouse=True)
def profile(tmp_path, monkeypatch):
    """``msc://root/<absolute path>`` for every local file; remote .idx copies in tmp_path."""
    config = tmp_path / "msc.yaml"
    config.write_text(
        "profiles:\n  root:\n    storage_provider:\n      type: file\n"
        "      options: {base_path: /}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "idx"))


def build(prefix, cache):
    """The train split of one corpus (sequence length 32, null tokenizer)."""
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=32,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, [300, 0, 0], lambda: True, config).build()[0]


def test_a_corpus_replaced_in_the_store_while_its_tables_build_is_not_cached(tmp_path, monkeypatch):
    """multi-storage-client binds no read to a version: the versions the reader opened are
    compared with the corpus's once its tables are built, and a replacement uploaded meanwhile
    fails the build naming both (cached under its versions, the old corpus's tables would be
    taken for the new one's by every later run); once the corpus is complete, the next build
    has the new corpus's tables."""
    from megaindex.gpt_index import GPTTableRecipe

    (tmp_path / "store").mkdir()
    store = write_corpus(str(tmp_path / "store" / "corpus"), 200, seed=1)
    new = write_corpus(str(tmp_path / "new"), 260, seed=2)
    url = "msc://root" + os.path.abspath(store)
    cut = GPTTableRecipe.build

    def replaced_first(self):
        for suffix in (".bin", ".idx"):  # the corpus is open: its .idx copied and read
            os.replace(new + suffix, store + suffix)
        return cut(self)

    monkeypatch.setattr(GPTTableRecipe, "build", replaced_first)
    with pytest.raises(CacheError, match="changed in the store while its index tables"):
        build(url, str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").rglob("*-description.txt"))
    monkeypatch.undo()
    remote = build(url, str(tmp_path / "cache"))
    here = build(store, str(tmp_path / "local"))
    for name in ("document_index", "sample_index", "shuffle_index"):
        numpy.testing.assert_array_equal(getattr(remote, name), getattr(here, name))
