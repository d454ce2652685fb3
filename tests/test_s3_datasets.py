"""Training straight from S3: a GPTDataset over an s3:// prefix (moto's server on loopback)
equals the one built from the local copy, through megaload's DataLoader with 2 workers too."""

import time

import numpy
import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import moto_endpoint

from megafmt.protocols import PlannedBatch
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, CacheError, GPTDataset, GPTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer
from megaload import DataLoaderConfig, build_pretraining_data_loader

pytestmark = pytest.mark.s3


def build(blend, sizes, cache, object_cache=None, split="90,8,2"):
    """The datasets of every split of ``blend`` (sequence length 32, null tokenizer)."""
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=32,
        blend=blend,
        split=split,
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=cache,
        object_storage_cache_path=object_cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def test_a_gpt_dataset_over_s3_equals_the_local_one(tmp_path):
    local = write_corpus(str(tmp_path / "corpus"))
    with moto_endpoint():
        client = boto3.client("s3")
        client.create_bucket(Bucket="train")
        for suffix in (".bin", ".idx"):
            client.upload_file(local + suffix, "train", "web/corpus" + suffix)
        sizes = [300, 20, 5]
        remote = build((["s3://train/web/corpus"], None), sizes, None, str(tmp_path / "objects"))
        here = build(([local], None), sizes, str(tmp_path / "cache"))
        for ours, theirs in zip(remote, here, strict=True):
            for name in ("document_index", "sample_index", "shuffle_index"):
                numpy.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name))
            for i in range(len(theirs)):
                numpy.testing.assert_array_equal(ours[i]["tokens"], theirs[i]["tokens"])
        # the tables were cached on local disk, under object_storage_cache_path
        assert list((tmp_path / "objects").rglob("*-shuffle_index.npy"))
        train = remote[0]
        reader = train.dataset.bin_reader
        reader.close()  # an empty cache, with chunks small enough to count requests
        state = {"chunk_bytes": 512, "cache_bytes": 1 << 16, "readahead": 0}
        reader.__setstate__({**reader.__getstate__(), **state})
        asked = []
        fetch = reader._fetch
        reader._fetch = lambda *span: asked.append(span) or fetch(*span)
        # a batch announced with the one its worker reads next (megaload's plan): both are
        # fetched then, and reading the next one asks for nothing more
        batch = train.__getitems__(PlannedBatch(range(50, 55), upcoming=range(55, 60))).collated
        expected = numpy.stack([here[0][i]["tokens"] for i in range(50, 55)])
        numpy.testing.assert_array_equal(batch["tokens"], expected)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            pending.done() for pending in reader._spans.values()
        ):
            time.sleep(0.01)
        before = len(asked)
        assert before > 0
        for i in range(55, 60):
            numpy.testing.assert_array_equal(train[i]["tokens"], here[0][i]["tokens"])
        assert len(asked) == before
        loader = build_pretraining_data_loader(
            remote[0], 0, DataLoaderConfig(micro_batch_size=8, num_workers=2)
        )
        tokens = torch.cat([batch["tokens"] for batch in loader])
        expected = [here[0][i]["tokens"] for i in range(len(tokens))]
        numpy.testing.assert_array_equal(tokens, torch.stack(expected))


def test_a_blend_of_s3_corpora_equals_the_local_blend(tmp_path):
    locals_ = [write_corpus(str(tmp_path / name), seed=seed) for seed, name in enumerate("ab")]
    with moto_endpoint():
        client = boto3.client("s3")
        client.create_bucket(Bucket="blend")
        for local in locals_:
            for suffix in (".bin", ".idx"):
                name = local.rsplit("/", 1)[1] + suffix
                client.upload_file(local + suffix, "blend", name)

        weights, sizes = [0.3, 0.7], [200, 0, 0]
        urls = ["s3://blend/a", "s3://blend/b"]
        remote = build((urls, weights), sizes, None, str(tmp_path / "objects"), "1,0,0")[0]
        here = build((locals_, weights), sizes, str(tmp_path / "cache"), split="1,0,0")[0]
        numpy.testing.assert_array_equal(remote.dataset_index, here.dataset_index)
        for i in range(len(here)):
            numpy.testing.assert_array_equal(remote[i]["tokens"], here[i]["tokens"])


def test_a_shared_cache_whose_endpoint_does_not_answer_is_an_error_naming_it(tmp_path, monkeypatch):
    """An index cache in S3 whose endpoint nobody listens on: the build fails after the
    client's retries (seconds), naming the store, the request and the endpoint, not with
    botocore's bare EndpointConnectionError; no table is built or fetched."""
    import s3fs
    from s3testing import FAKE_CREDENTIALS, free_port

    from megaindex.shared_cache import SharedCacheError

    for key, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    s3fs.S3FileSystem.clear_instance_cache()  # one made for another endpoint would be reused
    try:
        with pytest.raises(SharedCacheError) as raised:
            build(
                ([write_corpus(str(tmp_path / "corpus"))], None),
                [50, 0, 0],
                "s3://nowhere/cache",
                str(tmp_path / "node"),
                split="100,0,0",
            )
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    message = str(raised.value)
    assert message.startswith("s3://nowhere/cache: the store could not be asked (list): ")
    assert "EndpointConnectionError" in message and f"127.0.0.1:{port}" in message
    assert not list((tmp_path / "node").rglob("*.npy"))  # no table, built or fetched


def test_a_shared_cache_in_a_bucket_that_does_not_exist_is_refused_naming_it(tmp_path):
    """The first lease's conditional put finds no bucket: refused at once, naming the store
    and what to do (it waited 5 s for another process's lease, then said none came)."""
    from megaindex.shared_cache import SharedCacheError

    corpus = write_corpus(str(tmp_path / "corpus"))
    with moto_endpoint(), pytest.raises(SharedCacheError) as raised:
        build(([corpus], None), [50, 0, 0], "s3://nobucket/cache", str(tmp_path / "node"),
              split="100,0,0")  # fmt: skip
    message = str(raised.value)
    assert message.startswith("s3://nobucket/cache/") and "-lease-1.json" in message
    assert "the store's bucket or folder does not exist" in message
    assert "no other process held it" not in message


def test_a_corpus_replaced_in_the_store_while_its_tables_build_is_not_cached(tmp_path, monkeypatch):
    """The tables are cut from the objects as the corpus opened them; a replacement uploaded
    meanwhile is not recorded as their source (its ETags in the sidecar would have a later run
    take tables of the old corpus for the new one's): the build fails naming both versions and
    caches nothing, and a build once the corpus is complete has the new corpus's tables."""
    from megaindex.gpt_index import GPTTableRecipe

    old = write_corpus(str(tmp_path / "old"), 200, seed=1)
    new = write_corpus(str(tmp_path / "new"), 260, seed=2)
    with moto_endpoint():
        client = boto3.client("s3")
        client.create_bucket(Bucket="train")
        for suffix in (".bin", ".idx"):
            client.upload_file(old + suffix, "train", "web/corpus" + suffix)
        cut = GPTTableRecipe.build

        def replaced_first(self):
            for suffix in (".bin", ".idx"):  # the corpus is open: its .idx read, .bin bound
                client.upload_file(new + suffix, "train", "web/corpus" + suffix)
            return cut(self)

        monkeypatch.setattr(GPTTableRecipe, "build", replaced_first)
        blend, objects = (["s3://train/web/corpus"], None), str(tmp_path / "objects")
        with pytest.raises(CacheError, match="changed in the store while its index tables"):
            build(blend, [300, 0, 0], None, objects, split="100,0,0")
        assert not list((tmp_path / "objects").rglob("*-description.txt"))
        monkeypatch.undo()
        remote = build(blend, [300, 0, 0], None, objects, split="100,0,0")[0]
        here = build(([new], None), [300, 0, 0], str(tmp_path / "cache"), split="100,0,0")[0]
        for name in ("document_index", "sample_index", "shuffle_index"):
            numpy.testing.assert_array_equal(getattr(remote, name), getattr(here, name))
