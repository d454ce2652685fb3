"""The fsspec reader against a real S3 protocol endpoint (moto's server on loopback)."""

import multiprocessing
import os
import time

import numpy
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import FaultyProxy, moto_endpoint

from megafmt import IndexedDataset
from megafmt.cli.main import main
from megafmt.errors import MissingFileError
from megafmt.readers.fsspec_reader import FsspecBinReader
from megafmt.testing import BinReaderConformance, write_corpus

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def endpoint():
    with moto_endpoint() as url:
        boto3.client("s3").create_bucket(Bucket="corpora")
        yield url


def upload(local_prefix, key):
    client = boto3.client("s3")
    for suffix in (".bin", ".idx"):
        client.upload_file(local_prefix + suffix, "corpora", key + suffix)
    return f"s3://corpora/{key}"


class TestFsspecReaderOnS3(BinReaderConformance):
    reader_name = "fsspec"
    reader_options = {"chunk_bytes": 64, "cache_bytes": 256}

    @pytest.fixture(autouse=True)
    def _endpoint(self, endpoint):
        pass

    def publish(self, local_prefix):
        return upload(local_prefix, "conformance/" + os.path.basename(local_prefix))


def test_every_accessor_and_random_reads_equal_the_local_copy(endpoint, tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=200, longest=300)
    url = upload(local, "equal/c")
    options = {"chunk_bytes": 4096, "cache_bytes": 16384, "idx_cache_dir": str(tmp_path / "cache")}
    remote = IndexedDataset(url, reader_options=options)
    here = IndexedDataset(local)
    assert remote.reader_name == "fsspec" and len(remote) == len(here)
    for name in ("sequence_lengths", "sequence_pointers", "document_indices"):
        numpy.testing.assert_array_equal(getattr(remote, name), getattr(here, name))
    for i in range(len(here)):
        numpy.testing.assert_array_equal(remote[i], here[i])
    for ours, local in zip(remote[5:40], here[5:40], strict=True):
        numpy.testing.assert_array_equal(ours, local)
    rng = numpy.random.default_rng(1)
    for _ in range(200):
        i = int(rng.integers(len(here)))
        size = int(here.sequence_lengths[i])
        offset = int(rng.integers(size + 1))
        length = int(rng.integers(size - offset + 1))
        numpy.testing.assert_array_equal(remote.get(i, offset, length), here.get(i, offset, length))


def _read_all(dataset):
    return [dataset[i].tolist() for i in range(len(dataset))]


def test_a_pickled_dataset_reads_in_worker_processes(endpoint, tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=50)
    url = upload(local, "workers/c")
    remote = IndexedDataset(url, reader_options={"idx_cache_dir": str(tmp_path / "cache")})
    remote[0]  # the parent's client exists before the workers start
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            results = pool.map(_read_all, [remote, remote])
        assert results[0] == results[1] == _read_all(IndexedDataset(local))


def test_the_index_is_cached_once_and_fetched_again_when_it_changes(endpoint, tmp_path):
    cache = tmp_path / "cache"
    url = upload(write_corpus(str(tmp_path / "a"), documents=10), "changing/c")
    first = IndexedDataset(url, reader_options={"idx_cache_dir": str(cache)})
    (copy,) = [p for p in cache.iterdir() if p.name.endswith(".idx")]
    stamp = copy.stat().st_mtime_ns
    time.sleep(0.01)
    IndexedDataset(url, reader_options={"idx_cache_dir": str(cache)})
    assert copy.stat().st_mtime_ns == stamp  # reused, not fetched again
    upload(write_corpus(str(tmp_path / "b"), documents=30, seed=5), "changing/c")
    second = IndexedDataset(url, reader_options={"idx_cache_dir": str(cache)})
    assert (len(first.document_indices), len(second.document_indices)) == (11, 31)
    numpy.testing.assert_array_equal(second[3], IndexedDataset(str(tmp_path / "b"))[3])


def test_reads_survive_failing_dropped_and_slow_requests(endpoint, tmp_path, monkeypatch):
    import s3fs

    # the storage libraries' own retries off: every fault reaches the reader
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    local = write_corpus(str(tmp_path / "c"), documents=200, longest=300)
    url = upload(local, "faulty/c")
    with FaultyProxy(endpoint, failure_rate=0.3, delay=0.05) as proxy:
        options = {
            "chunk_bytes": 2048,
            "cache_bytes": 4096,
            "first_wait": 0.01,
            "retries": 10,
            "idx_cache_dir": str(tmp_path / "cache"),
            "storage_options": {
                "endpoint_url": proxy.url,
                "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}},
            },
        }
        remote = IndexedDataset(url, reader_options=options)
        here = IndexedDataset(local)
        for i in range(len(here)):
            numpy.testing.assert_array_equal(remote[i], here[i])
    assert proxy.counts["503"] > 0 and proxy.counts["dropped"] > 0
    assert remote.bin_reader.retries > 0


def test_missing_objects_and_buckets_fail_at_once_naming_the_url(endpoint, tmp_path):
    options = {"idx_cache_dir": str(tmp_path / "cache")}
    for url in ("s3://corpora/no/such/corpus", "s3://no-such-bucket/c"):
        start = time.monotonic()
        with pytest.raises(MissingFileError, match=url.replace("/", "/") + r"\.bin: not found"):
            IndexedDataset(url, reader_options=options)
        assert time.monotonic() - start < 5
    assert not IndexedDataset.exists("s3://corpora/no/such/corpus")


def test_info_verify_and_dump_take_urls(endpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    local = write_corpus(str(tmp_path / "c"), documents=20)
    url = upload(local, "cli/c")
    assert main(["verify", "--remote", url]) == 0
    assert capsys.readouterr().out == f"OK {url} (sizes)\n"
    assert not (tmp_path / "cache").exists()  # nothing was downloaded
    assert main(["info", url, "--json"]) == 0
    assert '"documents": 20' in capsys.readouterr().out
    assert main(["verify", url]) == 0
    assert main(["dump", url, "--seq", "3"]) == 0
    expected = " ".join(map(str, IndexedDataset(local)[3].tolist()))
    assert capsys.readouterr().out.splitlines()[-1] == expected
    client = boto3.client("s3")  # a .bin cut short is found from its size alone
    client.put_object(Bucket="corpora", Key="cli/c.bin", Body=b"\0" * 10)
    for remote in ([], ["--remote"]):
        assert main(["verify", *remote, url]) == 1
        assert "[bin_size]" in capsys.readouterr().err


def counting(reader):
    """The byte ranges ``reader`` asks its storage for, as (start, end), in order."""
    asked = []
    fetch = reader._fetch
    reader._fetch = lambda *span: asked.append(span) or fetch(*span)
    return asked


def settle(reader):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        reader._pending or not all(pending.done() for pending in reader._spans.values())
    ):
        time.sleep(0.01)


def test_sequential_reads_fetch_ahead_and_the_cache_stays_bounded(tmp_path):
    import fsspec

    with fsspec.open("memory://ahead/c.bin", "wb") as stream:
        stream.write(bytes(range(256)) * 64)  # 16 KiB
    reader = FsspecBinReader(
        "memory://ahead/c.bin", chunk_bytes=1024, cache_bytes=4096, readahead=2
    )
    asked = counting(reader)
    chunks = [(c * 1024, (c + 1) * 1024) for c in range(16)]
    assert reader.read(numpy.uint8, 10, 0).tolist() == list(range(10))  # a scan starts
    reader.read(numpy.uint8, 10, 1030)  # chunk 1 follows chunk 0: fetch 2 and 3 ahead
    settle(reader)
    assert sorted(asked) == chunks[:4]
    reader.read(numpy.uint8, 10, 2 * 1024)  # already there; 3 is too, so only 4 is fetched
    settle(reader)
    assert sorted(asked) == chunks[:5]
    assert reader._cached <= 4096
    reader.close()


def test_a_read_elsewhere_fetches_its_bytes_not_a_chunk(tmp_path):
    import fsspec

    data = bytes(range(256)) * 64  # 16 KiB
    with fsspec.open("memory://jump/c.bin", "wb") as stream:
        stream.write(data)
    reader = FsspecBinReader(
        "memory://jump/c.bin", chunk_bytes=4096, cache_bytes=8192, random_read_bytes=300
    )
    asked = counting(reader)
    assert reader.read(numpy.uint8, 10, 9000).tobytes() == data[9000:9010]
    assert asked == [(9000, 9300)]  # random_read_bytes from the read, no read-ahead
    # the next documents of the sample come with it; a read larger than 300 bytes gets its own
    assert reader.read(numpy.uint8, 200, 9010).tobytes() == data[9010:9210]
    assert reader.read(numpy.uint8, 500, 1000).tobytes() == data[1000:1500]
    assert asked == [(9000, 9300), (1000, 1500)]
    reader.close()


def test_prefetch_fetches_the_announced_ranges_within_half_the_cache(tmp_path):
    import fsspec

    data = bytes(range(256)) * 256  # 64 KiB
    with fsspec.open("memory://plan/c.bin", "wb") as stream:
        stream.write(data)
    reader = FsspecBinReader("memory://plan/c.bin", chunk_bytes=1024, cache_bytes=8192)
    asked = counting(reader)
    # four ranges; the second and third touch and become one request: 3 requests, in order
    plan = [(40965, 10), (4072, 100), (4172, 8), (3072, 8)]
    assert reader.prefetch(plan) == 3
    settle(reader)
    assert asked == [(40965, 40975), (4072, 4180), (3072, 3080)]
    assert reader.read(numpy.uint8, 100, 4072).tobytes() == data[4072:4172]
    assert reader.read(numpy.uint8, 8, 4172).tobytes() == data[4172:4180]
    assert reader.prefetch(plan) == 0  # all held already
    assert len(asked) == 3
    # ten ranges of 1000 bytes announced, but only half the cache (4096 bytes) is held ahead
    assert reader.prefetch([(c * 1024, 1000) for c in range(50, 60)]) == 4
    assert reader._span_bytes <= 4096
    reader.close()
    local = write_corpus(str(tmp_path / "c"), documents=5)
    IndexedDataset(local).prefetch([(0, 0, None)])  # a local corpus ignores the plan


def slow_reader(url, seconds, **options):
    import fsspec

    with fsspec.open(url, "wb") as stream:
        stream.write(bytes(range(256)) * 64)  # 16 KiB
    reader = FsspecBinReader(url, **options)
    fetch = reader._fetch
    reader._fetch = lambda *span: time.sleep(seconds) or fetch(*span)
    return reader


def test_threads_reading_one_place_share_one_request():
    from concurrent.futures import ThreadPoolExecutor

    reader = slow_reader(
        "memory://shared/c.bin", 0.05, chunk_bytes=1024, cache_bytes=8192, random_read_bytes=1000
    )
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: reader.read(numpy.uint8, 10, 9000).tolist(), range(8)))
    assert answers == [list(range(40, 50))] * 8
    assert list(reader._spans) == [(9000, 10000)]
    assert reader._span_bytes == 1000
    reader.close()


def test_closing_fails_waiting_reads_and_stops_fetching():
    import threading

    reader = slow_reader("memory://closing/c.bin", 0.5, chunk_bytes=1024, cache_bytes=8192)
    errors = []

    def read():
        try:
            reader.read(numpy.uint8, 10, 5000)
        except ValueError as error:
            errors.append(str(error))

    waiting = threading.Thread(target=read)
    waiting.start()
    time.sleep(0.1)
    reader.close()
    waiting.join(timeout=5)
    assert not waiting.is_alive()
    assert errors == ["memory://closing/c.bin: the reader was closed while this read waited"]
    time.sleep(0.6)  # the request under way answers after the close: nothing is kept
    assert not reader._spans and not reader._chunks and reader._span_bytes == 0
    with pytest.raises(ValueError, match="closed reader"):
        reader.prefetch([(0, 10)])
    with pytest.raises(ValueError, match="closed reader"):
        reader.read(numpy.uint8, 10, 0)


@pytest.mark.parametrize("where", [0, 9000])  # a chunk (a scan starts), a span (a jump)
def test_a_failed_send_waits_for_its_hedged_twin(where):
    import fsspec

    from megafmt.errors import ReadError

    data = bytes(range(256)) * 64
    with fsspec.open(f"memory://twin{where}/c.bin", "wb") as stream:
        stream.write(data)
    reader = FsspecBinReader(
        f"memory://twin{where}/c.bin",
        chunk_bytes=1024,
        cache_bytes=8192,
        readahead=0,
        hedge_after=0.1,
    )
    fetch, sends = reader._fetch, []

    def first_fails_while_the_twin_is_under_way(*span):
        sends.append(span)
        if len(sends) == 1:
            time.sleep(0.2)  # the twin was sent at 0.1 s
            raise ReadError("gave up after its retries")
        time.sleep(0.3)  # and answers at 0.4 s, after the failure
        return fetch(*span)

    reader._fetch = first_fails_while_the_twin_is_under_way
    assert reader.read(numpy.uint8, 10, where).tobytes() == data[where : where + 10]
    assert reader.hedges == 1 and len(sends) == 2
    reader._fetch = lambda *span: (_ for _ in ()).throw(ReadError("down"))
    with pytest.raises(ReadError, match="down"):  # with no twin, a failure is the answer
        reader.read(numpy.uint8, 10, 5000)
    reader.close()


def test_reads_find_their_span_among_many():
    import fsspec

    data = bytes(range(256)) * 256  # 64 KiB
    with fsspec.open("memory://many/c.bin", "wb") as stream:
        stream.write(data)
    reader = FsspecBinReader("memory://many/c.bin", chunk_bytes=1024, cache_bytes=1 << 20)
    asked = counting(reader)
    plan = [(offset, 100) for offset in range(60000, 0, -1500)]  # 40 spans, apart
    assert reader.prefetch(plan) == 40
    settle(reader)
    for offset, _ in plan:  # each read inside its span, none at its start
        assert (
            reader.read(numpy.uint8, 50, offset + 30).tobytes() == data[offset + 30 : offset + 80]
        )
    assert len(asked) == 40
    reader.close()


def test_merge_ranges_joins_touching_ranges_in_order_of_first_use():
    from megafmt.readers.fsspec_reader import merge_ranges

    ranges = [(50, 60), (0, 10), (10, 20), (55, 70), (30, 40), (5, 8)]
    assert merge_ranges(ranges) == [(50, 70), (0, 20), (30, 40)]
    assert merge_ranges([]) == []


def test_preprocess_reads_its_input_from_s3(endpoint, tmp_path):
    import gzip
    import json

    from megafmt.preprocess import PreprocessConfig, preprocess

    lines = [json.dumps({"text": f"document {i}"}) + "\n" for i in range(30)]
    client = boto3.client("s3")
    client.put_object(Bucket="corpora", Key="raw/a.jsonl", Body="".join(lines[:20]).encode())
    client.put_object(
        Bucket="corpora", Key="raw/b.jsonl.gz", Body=gzip.compress("".join(lines[20:]).encode())
    )
    summary = preprocess(
        PreprocessConfig(
            input="s3://corpora/raw/", output_prefix=str(tmp_path / "p"), append_eod=True
        )
    )
    dataset = IndexedDataset(summary.outputs["text"])
    assert len(dataset) == 30
    assert bytes(dataset[25][:-1].tolist()).decode() == "document 25"


def test_a_stalled_request_is_sent_again_and_the_first_answer_wins(endpoint, tmp_path):
    local = write_corpus(str(tmp_path / "c"), documents=20)
    url = upload(local, "stalled/c")
    with FaultyProxy(endpoint, failure_rate=0.0, stalls=1, stall=5.0) as proxy:
        options = {
            "hedge_after": 0.3,
            "readahead": 0,
            "idx_cache_dir": str(tmp_path / "cache"),
            "storage_options": {"endpoint_url": proxy.url},
        }
        remote = IndexedDataset(url, reader_options=options)
        start = time.monotonic()
        numpy.testing.assert_array_equal(remote[7], IndexedDataset(local)[7])
        assert time.monotonic() - start < 3  # not the 5 s the first request was held
        assert proxy.counts["stalled"] == 1 and remote.bin_reader.hedges == 1


def test_an_s3_like_endpoint_answers_after_its_latency_and_many_at_once():
    from concurrent.futures import ThreadPoolExecutor

    with pytest.raises(ValueError, match="separate_process"), moto_endpoint(first_byte_latency=0.1):
        pass
    data = os.urandom(1 << 20)
    with moto_endpoint(separate_process=True, first_byte_latency=0.3):
        client = boto3.client("s3")
        client.create_bucket(Bucket="timing")
        client.put_object(Bucket="timing", Key="o", Body=data)

        def get(start):
            answer = client.get_object(
                Bucket="timing", Key="o", Range=f"bytes={start}-{start + 99}"
            )
            return answer["Body"].read()

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(get, range(0, 8000, 1000)))
        elapsed = time.monotonic() - started
    assert answers == [data[start : start + 100] for start in range(0, 8000, 1000)]
    assert 0.3 <= elapsed < 8 * 0.3  # each waited its latency, but not one after another
