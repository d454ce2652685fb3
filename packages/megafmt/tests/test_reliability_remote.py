"""Reliability over object storage: a replaced object, an endpoint that never answers, a
refused connection and a damaged remote index each end in a clear error naming the URL, within
the documented time."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import free_port, moto_endpoint

from megafmt import FormatError, IndexedDataset, ObjectChangedError, ReadError
from megafmt.testing import write_corpus

pytestmark = pytest.mark.s3

#: small bounds for the tests: an attempt takes at most CONNECT + READ seconds, and no attempt
#: starts after DEADLINE seconds
CONNECT, READ, DEADLINE = 0.5, 0.5, 2.0
BOUNDED = {"connect_timeout": CONNECT, "read_timeout": READ, "deadline": DEADLINE, "retries": 6}


@pytest.fixture(scope="module")
def endpoint():
    with moto_endpoint() as url:
        boto3.client("s3").create_bucket(Bucket="corpora")
        yield url


def upload(local_prefix: str, key: str) -> str:
    client = boto3.client("s3")
    for suffix in (".bin", ".idx"):
        client.upload_file(local_prefix + suffix, "corpora", key + suffix)
    return f"s3://corpora/{key}"


def test_an_object_replaced_mid_read_fails_naming_url_and_both_versions(endpoint, tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=200)
    url = upload(local, "replaced/c")
    options = {"chunk_bytes": 256, "cache_bytes": 1024, "readahead": 0, "random_read_bytes": 64}
    remote = IndexedDataset(url, reader_options={**options, "idx_cache_dir": str(tmp_path)})
    remote[0]
    before = remote.bin_reader.version
    with open(local + ".bin", "rb") as stream:  # same size, other bytes
        data = bytearray(stream.read())
    data[-64:] = bytes(64)
    boto3.client("s3").put_object(Bucket="corpora", Key="replaced/c.bin", Body=bytes(data))
    with pytest.raises(ObjectChangedError) as caught:
        remote[len(remote) - 1]
    message = str(caught.value)
    assert message.startswith(f"{url}.bin: the object changed since the corpus was opened")
    assert f"ETag {before} then" in message and "now" in message
    assert before not in message.split("then, ")[1]


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """A loopback socket that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def test_an_unresponsive_endpoint_fails_within_the_bound(endpoint, tmp_path):
    with silent_endpoint() as url:
        options = {**BOUNDED, "storage_options": {"endpoint_url": url}}
        start = time.monotonic()
        with pytest.raises(ReadError, match=r"^s3://corpora/silent/c\.bin: gave up after"):
            IndexedDataset("s3://corpora/silent/c", reader_options=options)
        elapsed = time.monotonic() - start
    assert elapsed < DEADLINE + CONNECT + READ + 1.0, f"took {elapsed:.1f} s"


def test_a_refused_connection_fails_fast(endpoint, tmp_path):
    options = {**BOUNDED, "storage_options": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    start = time.monotonic()
    with pytest.raises(ReadError, match=r"^s3://corpora/refused/c\.bin: gave up after"):
        IndexedDataset("s3://corpora/refused/c", reader_options=options)
    assert time.monotonic() - start < DEADLINE + CONNECT + READ + 1.0


def test_a_damaged_remote_index_is_reported_against_the_url(endpoint, tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=20)
    with open(local + ".idx", "r+b") as stream:  # a length made negative
        stream.seek(34 + 4 * 3)
        stream.write(struct.pack("<i", -7))
    url = upload(local, "damaged/c")
    with pytest.raises(FormatError, match=rf"^{url}\.idx: sequence_lengths\[3\]"):
        IndexedDataset(url, reader_options={"idx_cache_dir": str(tmp_path / "cache")})
