"""Object storage by megatron-core's names: ``msc://`` corpora through multi-storage-client
(``megafmt[msc]``), and ``_S3BinReader`` over S3, against the seed commit
reading the same URLs: its ``_MultiStorageClientBinReader``, its ``IndexedDataset`` with an
``ObjectStorageConfig`` (the ``.idx`` copied to ``path_to_idx_cache``), and its ``GPTDataset``
with ``object_storage_cache_path``. Two profiles: a POSIX folder, and an S3 bucket on moto's
endpoint on loopback (credentials in the profile). The seed side enables multi-storage-client
(``--enable-msc``) with the same ``MSC_CONFIG`` for each call."""

from __future__ import annotations

import os
from pathlib import Path

import numpy
import pytest
from s3testing import moto_endpoint

import megafmt
from megafmt.testing import write_corpus

pytestmark = [pytest.mark.compat, pytest.mark.s3]

BUCKET = "msc-corpora"
PROFILES = ("posix", "moto")
#: what points boto3 at moto, in the seed worker too
S3_ENVIRONMENT = (
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
)  # fmt: skip
VOCAB = 1000


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    """The corpus in a POSIX folder and in a moto bucket, an MSC config naming both."""
    import boto3

    root = tmp_path_factory.mktemp("msc")
    folder = root / "posix"
    folder.mkdir()
    prefix = write_corpus(str(folder / "corpus"), 120, seed=9, vocab=VOCAB - 1, eod=VOCAB - 1)
    with moto_endpoint() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        for suffix in (".bin", ".idx"):
            client.upload_file(prefix + suffix, BUCKET, f"data/corpus{suffix}")
        config = root / "msc.yaml"
        config.write_text(
            "profiles:\n"
            "  posix:\n"
            "    storage_provider:\n"
            "      type: file\n"
            f"      options: {{base_path: '{folder}'}}\n"
            "  moto:\n"
            "    storage_provider:\n"
            "      type: s3\n"
            f"      options: {{base_path: {BUCKET}, endpoint_url: '{endpoint}', "
            "region_name: us-east-1}\n"
            "    credentials_provider:\n"
            "      type: S3Credentials\n"
            "      options: {access_key: testing, secret_key: testing}\n"
        )
        saved = os.environ.get("MSC_CONFIG")
        os.environ["MSC_CONFIG"] = str(config)
        try:
            yield {
                "posix": "msc://posix/corpus",
                "moto": "msc://moto/data/corpus",
                "s3": f"s3://{BUCKET}/data/corpus",
                "local": prefix,
                "env": {"MSC_CONFIG": str(config)},
                "s3_env": {key: os.environ[key] for key in S3_ENVIRONMENT},
            }
        finally:
            if saved is None:
                os.environ.pop("MSC_CONFIG")
            else:
                os.environ["MSC_CONFIG"] = saved


@pytest.fixture(scope="module")
def seed(shared_seed):
    return shared_seed


@pytest.mark.parametrize("profile", PROFILES)
def test_msc_corpora_read_as_the_seed_reads_them(
    seed, stores: dict, tmp_path: Path, profile: str
) -> None:
    url = stores[profile]
    config = megafmt.ObjectStorageConfig(path_to_idx_cache=str(tmp_path / "ours"))
    theirs = seed.call("seed_names:read_dataset", url, str(tmp_path / "theirs"), stores["env"])
    dataset = megafmt.IndexedDataset(url, object_storage_config=config)
    assert dataset.reader_name == "msc"
    assert len(dataset) == len(theirs["sequences"])
    for number, expected in enumerate(theirs["sequences"]):
        numpy.testing.assert_array_equal(dataset[number], expected, err_msg=f"sequence {number}")
    numpy.testing.assert_array_equal(dataset.document_indices, theirs["document_indices"])
    # the .idx is copied where the seed copies it: <path_to_idx_cache>/<profile>/<key>.idx
    relative = url.removeprefix("msc://") + ".idx"
    ours, seeds = tmp_path / "ours" / relative, tmp_path / "theirs" / relative
    assert ours.read_bytes() == seeds.read_bytes() == Path(stores["local"] + ".idx").read_bytes()
    assert megafmt.IndexedDataset.exists(url)
    assert not megafmt.IndexedDataset.exists(url + "-missing")
    # the reader by megatron-core's name, random reads
    rng = numpy.random.default_rng(4)
    nbytes = Path(stores["local"] + ".bin").stat().st_size
    reads = [(int(c), int(rng.integers(0, nbytes // 2 - c)) * 2) for c in rng.integers(0, 50, 20)]
    bin_url, cache = url + ".bin", str(tmp_path / "theirs")
    expected = seed.call(
        "seed_names:read_bin", "_MultiStorageClientBinReader", bin_url, "uint16", reads, cache,
        stores["env"],
    )  # fmt: skip
    reader = megafmt._MultiStorageClientBinReader(bin_url, config)
    for (count, offset), array in zip(reads, expected, strict=True):
        numpy.testing.assert_array_equal(reader.read(numpy.uint16, count, offset), array)


@pytest.mark.parametrize("profile", PROFILES)
def test_gpt_dataset_over_msc_gives_the_seed_s_tables_and_samples(
    seed, stores: dict, tmp_path: Path, profile: str
) -> None:
    from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    from megaindex.tokenizer import IdentifiedTokenizer

    fields = {
        "random_seed": 5, "sequence_length": 24, "split": "90,8,2",
        "reset_position_ids": False, "reset_attention_mask": False, "eod_mask_loss": False,
        "mmap_bin_files": False, "object_storage_cache_path": str(tmp_path / "objects"),
    }  # fmt: skip
    blend, sizes = ([stores[profile]], None), [300, 20, 5]
    theirs = seed.call(
        "seed_names:gpt_train_samples",
        {**fields, "path_to_cache": str(tmp_path / "theirs")},
        blend,
        sizes,
        VOCAB,
        12,
        stores["env"],
    )
    identifiers = {
        "class": "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer",
        "vocab_size": VOCAB, "eod_id": VOCAB - 1, "pad_id": -1,
    }  # fmt: skip
    config = GPTDatasetConfig(
        blend=blend,
        tokenizer=IdentifiedTokenizer(VOCAB - 1, VOCAB, identifiers, pad=-1),
        path_to_cache=str(tmp_path / "ours"),
        **fields,
    )
    train = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]
    for table in ("document_index", "sample_index", "shuffle_index"):
        numpy.testing.assert_array_equal(getattr(train, table), theirs[table], err_msg=table)
    for number, tokens in enumerate(theirs["tokens"]):
        numpy.testing.assert_array_equal(train[number]["tokens"].numpy(), tokens)
    # and the same cache files, under the same names
    names = sorted(p.name for p in (tmp_path / "theirs").iterdir())
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes()


def test_s3_bin_reader_reads_what_the_seed_s_reads(seed, stores: dict, tmp_path: Path) -> None:
    """megatron-core's ``_S3BinReader`` name, with its bin_chunk_nbytes, over moto's S3."""
    rng = numpy.random.default_rng(8)
    nbytes = Path(stores["local"] + ".bin").stat().st_size
    reads = [(int(c), int(rng.integers(0, nbytes // 2 - c)) * 2) for c in rng.integers(0, 50, 20)]
    bin_url, cache = stores["s3"] + ".bin", str(tmp_path / "theirs")
    expected = seed.call(
        "seed_names:read_bin", "_S3BinReader", bin_url, "uint16", reads, cache, stores["s3_env"]
    )
    config = megafmt.ObjectStorageConfig(str(tmp_path / "ours"), bin_chunk_nbytes=4096)
    reader = megafmt._S3BinReader(bin_url, config)
    assert reader.chunk_bytes == 4096
    for (count, offset), array in zip(reads, expected, strict=True):
        numpy.testing.assert_array_equal(reader.read(numpy.uint16, count, offset), array)
