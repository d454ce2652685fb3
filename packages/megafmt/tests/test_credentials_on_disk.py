"""A signed or credentialed URL given as an input shows no secret in progress lines or in the
manifest beside the corpus (the names and notes of cached local copies: test_cache_links)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from megafmt.manifest import manifest_path, write_manifest
from megafmt.progress import Progress
from megafmt.redaction import MASK, SECRET_KEYS, redact_value

SECRET = "s3cr3tV4lue"
SIGNED = f"https://host/bucket/in.jsonl?X-Amz-Signature={SECRET}&X-Amz-Credential=AKIA{SECRET}"
WITH_USER = f"https://user:{SECRET}@host/bucket/in.jsonl"


@pytest.mark.parametrize("url", [SIGNED, WITH_USER])
def test_progress_lines_and_summaries_mask_credentials(url):
    stream = io.StringIO()
    progress = Progress(f"preprocess {url}", stream=stream, every=1)
    progress.update(1)
    progress.close(f"read {url}")
    text = stream.getvalue()
    assert SECRET not in text and MASK in text and "host/bucket/in.jsonl" in text
    assert text.count("\n") == 2  # a progress line and the summary


def test_a_manifest_masks_credentials_at_any_depth(tmp_path):
    prefix = str(tmp_path / "c")
    write_manifest(
        prefix,
        {
            "inputs": [{"path": SIGNED, "size": 1}, {"path": WITH_USER, "size": 2}],
            "flags": {"tokenizer_options": {"extra": {"token": SECRET, "n": 3}}},
            "shards": [{"path": SIGNED, "start": 0}],
        },
    )
    text = Path(manifest_path(prefix)).read_text(encoding="utf-8")
    assert SECRET not in text
    record = json.loads(text)
    assert record["inputs"][1]["path"] == "https://***@host/bucket/in.jsonl"
    assert record["flags"]["tokenizer_options"]["extra"] == {"token": MASK, "n": 3}


def test_redact_value_masks_every_secret_in_seeded_random_records():
    rng = random.Random(30)
    for _ in range(200):
        secret = "".join(rng.choice("abcdefghijkLMNOP0123456789") for _ in range(12))
        record = _random_record(rng, secret, depth=3)
        assert secret not in json.dumps(redact_value(record)), record


def _random_record(rng: random.Random, secret: str, depth: int):
    """JSON data with ``secret`` planted as a URL's password, a signature, or a secret key's
    value, among harmless values."""
    plants = [
        f"s3://bucket/key?X-Amz-Signature={secret}",
        f"https://name:{secret}@host/path",
        f"gs://b/o?token={secret}&x=1",
        {rng.choice(SECRET_KEYS): secret},
        {rng.choice(SECRET_KEYS).upper(): secret},
        f"aws_secret_access_key={secret}",
    ]
    if depth == 0:
        return rng.choice([*plants, 7, None, "plain", 1.5])
    if rng.random() < 0.5:
        return {f"k{i}": _random_record(rng, secret, depth - 1) for i in range(rng.randint(1, 3))}
    return [_random_record(rng, secret, depth - 1) for _ in range(rng.randint(1, 3))]
