import errno
import logging
import os

import numpy
import pytest

from megafmt import FormatError, IndexedDataset, ReadError, get_bin_path
from megafmt import retry as retry_module
from megafmt.readers import READERS, default_reader_name, is_url
from megafmt.readers import file_reader as file_reader_module
from megafmt.readers.file_reader import FileBinReader
from megafmt.testing import BinReaderConformance


class TestMMapReader(BinReaderConformance):
    reader_name = "mmap"


class TestFileReader(BinReaderConformance):
    reader_name = "file"


def test_builtin_readers_are_entry_points():
    assert {"file", "mmap"} <= set(READERS.available())
    assert READERS.view()["mmap"] == "megafmt.readers.mmap_reader:MMapBinReader"


def test_default_reader_choice():
    assert default_reader_name("data/corpus") == "mmap"
    assert default_reader_name("data/corpus", mmap=False) == "file"
    assert default_reader_name("s3://bucket/corpus") == "fsspec"
    assert is_url("memory://x") and not is_url("C:/data") and not is_url("relative/path")


@pytest.fixture
def flaky(make_corpus, monkeypatch):
    """A FileBinReader whose first ``len(failures)`` preadv calls raise ``failures`` in turn."""
    prefix = make_corpus([[[1, 2, 3, 4]]])
    failures = []
    calls = []
    real = os.preadv
    sleeps = []

    def preadv(fd, buffers, offset):
        calls.append(offset)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return real(fd, buffers, offset)

    monkeypatch.setattr(file_reader_module.os, "preadv", preadv)
    monkeypatch.setattr(retry_module.time, "sleep", sleeps.append)
    reader = FileBinReader(get_bin_path(prefix), num_max_retries=3, sleep_duration_start=0.5)
    return reader, failures, calls, sleeps


def eio():
    return OSError(errno.EIO, "Input/output error")


def test_file_reader_retries_with_exponential_backoff(flaky, caplog):
    reader, failures, calls, sleeps = flaky
    failures[:] = [eio(), OSError(errno.ESTALE, "Stale file handle"), TimeoutError("timed out")]
    with caplog.at_level(logging.WARNING):
        assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]
    assert len(calls) == 4 and reader.retries == 3
    assert all(0.5 * 2**i / 2 <= pause <= 0.5 * 2**i for i, pause in enumerate(sleeps))
    assert len(sleeps) == 3
    first = "corpus.bin: reading 16 bytes at offset 0: OSError: [Errno 5] Input/output error; "
    assert first + "retry 1 of 3 in" in caplog.text
    assert "Stale file handle; retry 2 of 3" in caplog.text


def test_file_reader_gives_up_after_its_retries(flaky):
    reader, failures, calls, sleeps = flaky
    failures[:] = [eio() for _ in range(10)]
    with pytest.raises(
        ReadError,
        match=r"corpus.bin: reading 16 bytes at offset 0: gave up after 4 attempts: "
        r"OSError: \[Errno 5\] Input/output error",
    ) as raised:
        reader.read(numpy.int32, 4, 0)
    assert raised.value.__cause__ is failures[3]
    assert len(calls) == 4 and len(sleeps) == 3 and reader.retries == 3


def test_file_reader_raises_what_no_retry_can_help_at_once(flaky):
    reader, failures, calls, sleeps = flaky
    error = OSError(errno.EINVAL, "Invalid argument")
    failures[:] = [error]
    with pytest.raises(ReadError, match="corpus.bin: reading 16 bytes at offset 0: ") as raised:
        reader.read(numpy.int32, 4, 0)
    assert raised.value.__cause__ is error
    assert len(calls) == 1 and sleeps == [] and reader.retries == 0
    assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "error",
    [TypeError("connection reset by peer"), ValueError("503 Service Unavailable")],
    ids=repr,
)
def test_file_reader_raises_a_bug_inside_a_read_as_itself_at_once(flaky, error):
    """A failure that is no I/O error is a bug, whatever its message says: not retried, not
    relabelled a ReadError."""
    reader, failures, calls, sleeps = flaky
    failures[:] = [error]
    with pytest.raises(type(error)) as raised:
        reader.read(numpy.int32, 4, 0)
    assert raised.value is error
    assert len(calls) == 1 and sleeps == [] and reader.retries == 0
    assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]


def test_file_reader_notices_a_file_truncated_after_opening(make_corpus):
    prefix = make_corpus([[[1, 2, 3, 4]]])
    dataset = IndexedDataset(prefix, mmap=False)
    os.truncate(get_bin_path(prefix), 8)
    with pytest.raises(
        FormatError,
        match=r"unexpected end of file at byte 8 .* the file was 16 "
        "bytes when opened",
    ):
        dataset[0]


def test_file_reader_options_are_validated(make_corpus):
    with pytest.raises(ValueError, match="must be >= 0"):
        FileBinReader(get_bin_path(make_corpus([[[1]]])), num_max_retries=-1)


def test_a_failed_descriptor_stays_open_until_the_reader_closes(flaky):
    reader, failures, _calls, _sleeps = flaky
    failures[:] = [eio()]
    first = reader._fd
    assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]
    assert reader._retired == [first] and reader._fd not in (None, first)
    os.fstat(first)  # still open: a thread still reading through it reads the right file
    reader.close()
    with pytest.raises(OSError):
        os.fstat(first)


def test_a_reopen_waiting_for_a_descriptor_holds_up_no_other_call(flaky, monkeypatch):
    """A read whose descriptor failed reopens the file outside the reader's lock: near the
    open-files limit that open may wait (0.63 s), and a close meanwhile returns at once; the
    descriptor the open then gets is closed, and the read says the reader is closed."""
    import threading

    reader, failures, _calls, _sleeps = flaky
    failures[:] = [eio()]
    opening, release = threading.Event(), threading.Event()
    fresh = []
    real_open = file_reader_module.open_readonly

    def waiting_open(path, what):
        opening.set()
        assert release.wait(60)
        fresh.append(real_open(path, what))
        return fresh[-1]

    monkeypatch.setattr(file_reader_module, "open_readonly", waiting_open)
    outcome = []

    def read():
        try:
            outcome.append(reader.read(numpy.int32, 4, 0))
        except ValueError as error:
            outcome.append(error)

    reading = threading.Thread(target=read)
    reading.start()
    assert opening.wait(60)
    closing = threading.Thread(target=reader.close)
    closing.start()
    closing.join(30)
    closed_at_once = not closing.is_alive()  # it waited for the open before
    release.set()
    reading.join(60)
    closing.join(60)
    assert closed_at_once
    assert isinstance(outcome[0], ValueError) and "closed reader" in str(outcome[0])
    with pytest.raises(OSError):
        os.fstat(fresh[0])  # not left open


def test_tokens_view_is_the_whole_bin_when_it_is_mapped(make_corpus):
    prefix = make_corpus([[[1, 2], [3]], [[4, 5, 6]]])
    mapped = IndexedDataset(prefix)
    assert mapped.tokens_view.tolist() == [1, 2, 3, 4, 5, 6]
    assert not mapped.tokens_view.flags.writeable
    mapped.release_reader()  # as the pool of open readers does: the view comes back
    assert mapped.tokens_view.tolist() == [1, 2, 3, 4, 5, 6] and mapped.recently_read
    assert IndexedDataset(prefix, mmap=False).tokens_view is None


def test_a_close_during_a_read_waits_for_it_and_no_read_follows(make_corpus, tmp_path, monkeypatch):
    """A close that lands between a read taking its descriptor and its preadv: without the
    count of reads in flight the number was released, the next open got it, and the read
    returned that other file's bytes."""
    reader = FileBinReader(get_bin_path(make_corpus([[[1, 2, 3, 4]]])))
    other = tmp_path / "other"
    other.write_bytes(numpy.array([7, 7, 7, 7], dtype=numpy.int32).tobytes())
    real = os.preadv
    opened = []

    def preadv(fd, buffers, offset):
        reader.close()  # another thread closes the reader now
        opened.append(os.open(other, os.O_RDONLY))  # and the system hands out a number
        return real(fd, buffers, offset)

    monkeypatch.setattr(file_reader_module.os, "preadv", preadv)
    first = reader._fd
    assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]  # its own file's bytes
    assert opened[0] != first  # the number was still held by the read
    with pytest.raises(OSError):
        os.fstat(first)  # and released when the read ended
    with pytest.raises(ValueError, match="read from a closed reader"):
        reader.read(numpy.int32, 4, 0)
    os.close(opened[0])
