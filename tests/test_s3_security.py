"""Credentials and keys from S3 URLs (moto's server on loopback): no secret in what ``mega``
prints, and no local copy of a remote corpus outside its cache folder."""

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import moto_endpoint

from megafmt import IndexedDataset
from megafmt.cli.main import main
from megafmt.errors import UnsafePathError
from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer

pytestmark = pytest.mark.s3
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A bucket ``train`` holding a corpus at ``web/c``; the cache folders under tmp_path."""
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "local").mkdir()
    local = write_corpus(str(tmp_path / "local" / "c"), documents=20)
    with moto_endpoint():
        client = boto3.client("s3")
        client.create_bucket(Bucket="train")
        for suffix in (".bin", ".idx"):
            client.upload_file(local + suffix, "train", "web/c" + suffix)
        yield client


def test_mega_info_on_a_url_with_credentials_prints_no_secret(bucket, capsys):
    assert main(["info", f"s3://AKIAFAKE:{SECRET}@train/web/c"]) == 1
    err = capsys.readouterr().err
    with capsys.disabled():
        print(err)  # the redacted message, shown with -s
    assert (
        "mega info: error: s3://***@train/web/c.idx: credentials in an S3 URL are not used" in err
    )
    assert SECRET not in err and "AKIAFAKE" not in err
    assert main(["info", "s3://train/web/c"]) == 0
    assert "s3://train/web/c" in capsys.readouterr().out


def test_a_remote_key_with_dots_is_refused_before_any_local_copy(bucket, tmp_path):
    for suffix in (".bin", ".idx"):
        bucket.upload_file(
            str(tmp_path / "local" / f"c{suffix}"), "train", f"web/../../../escape/c{suffix}"
        )
    url = "s3://train/web/../../../escape/c"
    with pytest.raises(UnsafePathError, match=r"'\.\.' would make a local copy leave"):
        IndexedDataset(url)
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=32,
        blend=([url], None),
        split="100,0,0",
        tokenizer=IdentifiedTokenizer.null(1000),
        object_storage_cache_path=str(tmp_path / "objects"),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    with pytest.raises(UnsafePathError):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, 0, 0], lambda: True, config).build()
    assert not list(tmp_path.rglob("escape"))
