import errno
import logging
import os

import numpy
import pytest

from megafmt import FormatError, IndexedDataset, ReadError, get_bin_path
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
    """A FileBinReader whose first ``failures[0]`` preadv calls fail with EIO."""
    prefix = make_corpus([[[1, 2, 3, 4]]])
    failures = [0]
    calls = []
    real = os.preadv
    sleeps = []

    def preadv(fd, buffers, offset):
        calls.append(offset)
        if len(calls) <= failures[0]:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buffers, offset)

    monkeypatch.setattr(file_reader_module.os, "preadv", preadv)
    monkeypatch.setattr(file_reader_module.time, "sleep", sleeps.append)
    reader = FileBinReader(get_bin_path(prefix), num_max_retries=3, sleep_duration_start=0.5)
    return reader, failures, calls, sleeps


def test_file_reader_retries_with_exponential_backoff(flaky, caplog):
    reader, failures, calls, sleeps = flaky
    failures[0] = 3
    with caplog.at_level(logging.WARNING):
        assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]
    assert len(calls) == 4
    assert [round(s / 0.5) for s in sleeps] == [1, 2, 4]
    assert all(abs(s / (0.5 * 2**i) - 1) <= 0.1 for i, s in enumerate(sleeps))
    assert "attempt 1 of 4" in caplog.text and "Input/output error" in caplog.text


def test_file_reader_gives_up_after_its_retries(flaky):
    reader, failures, calls, sleeps = flaky
    failures[0] = 10
    with pytest.raises(
        ReadError,
        match=r"corpus.bin: reading 16 bytes at offset 0 failed 4 times, "
        r"giving up: \[Errno 5\] Input/output error",
    ):
        reader.read(numpy.int32, 4, 0)
    assert len(calls) == 4 and len(sleeps) == 3


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
    failures[0] = 1
    first = reader._fd
    assert reader.read(numpy.int32, 4, 0).tolist() == [1, 2, 3, 4]
    assert reader._retired == [first] and reader._fd not in (None, first)
    os.fstat(first)  # still open: a thread still reading through it reads the right file
    reader.close()
    with pytest.raises(OSError):
        os.fstat(first)


def test_tokens_view_is_the_whole_bin_when_it_is_mapped(make_corpus):
    prefix = make_corpus([[[1, 2], [3]], [[4, 5, 6]]])
    mapped = IndexedDataset(prefix)
    assert mapped.tokens_view.tolist() == [1, 2, 3, 4, 5, 6]
    assert not mapped.tokens_view.flags.writeable
    mapped.release_reader()  # as the pool of open readers does: the view comes back
    assert mapped.tokens_view.tolist() == [1, 2, 3, 4, 5, 6] and mapped.recently_read
    assert IndexedDataset(prefix, mmap=False).tokens_view is None
