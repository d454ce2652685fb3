"""An SFT jsonl on S3 (moto's server on loopback): its reads are bound to the version
indexed, so an object replaced afterwards is an ObjectChangedError, not lines read at the
old offsets of the new object."""

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import moto_endpoint

from megafmt.errors import ObjectChangedError
from megafmt.sft import JsonlLineIndex
from megafmt.sft.testing import write_sft_jsonl

pytestmark = pytest.mark.s3


def test_a_replaced_object_is_refused_not_read_at_old_offsets(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    lines = write_sft_jsonl(first, 6, seed=1)
    write_sft_jsonl(second, 6, seed=2)
    with moto_endpoint():
        client = boto3.client("s3")
        client.create_bucket(Bucket="sft")
        client.upload_file(str(first), "sft", "chat.jsonl")
        index = JsonlLineIndex("s3://sft/chat.jsonl")
        assert index[0] == lines[0]
        client.upload_file(str(second), "sft", "chat.jsonl")
        with pytest.raises(ObjectChangedError, match=r"s3://sft/chat\.jsonl changed since"):
            index[1]
