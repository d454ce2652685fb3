"""``verify`` over a large corpus: a progress line follows the ``.bin`` read, one summary line
ends the check, and a local ``.bin`` is read with read-ahead and its pages dropped behind the
read, so a pass over a large corpus leaves the page cache to other work."""

import io
import os

import pytest

from megafmt import get_bin_path, page_cache, verification, verify
from megafmt.cli.main import main

# 3 sequences (2 + 1 + 3 int32 tokens) in 2 documents: a 24-byte .bin
DOCUMENTS = [[[1, 2], [3]], [[4, 5, 6]]]


@pytest.fixture
def eight_byte_steps(monkeypatch):
    """The .bin read 8 bytes at a time, a progress line after each step."""
    monkeypatch.setattr(verification, "BIN_CHUNK", 8)
    monkeypatch.setattr(verification, "BIN_PROGRESS_EVERY", 8)


def bin_lines(err, prefix):
    marker = f"verify {prefix}: .bin: "
    return [line.removeprefix(marker) for line in err.splitlines() if line.startswith(marker)]


def test_the_bin_read_shows_progress_and_a_summary_ends_the_check(
    make_corpus, eight_byte_steps, capsys
):
    prefix = make_corpus(DOCUMENTS)
    assert verify(prefix, progress=True) == []
    err = capsys.readouterr().err
    shown = [line.split(" B, ")[0] for line in bin_lines(err, prefix)]
    assert shown == ["8/24 (33%)", "16/24 (67%)", "24/24 (100%)"]
    summary = err.splitlines()[-1]
    assert summary.startswith(
        f"checked {prefix}: 3 sequences, 2 documents, 6 tokens; 24B of .bin read in "
    )
    assert summary.endswith("B/s)")


def test_without_progress_nothing_is_printed(make_corpus, eight_byte_steps, capsys):
    assert verify(make_corpus(DOCUMENTS)) == []
    assert capsys.readouterr().err == ""


def test_mega_progress_0_keeps_the_summary_only(make_corpus, eight_byte_steps, capsys, monkeypatch):
    monkeypatch.setenv("MEGA_PROGRESS", "0")
    prefix = make_corpus(DOCUMENTS)
    assert verify(prefix, progress=True) == []
    err = capsys.readouterr().err
    assert bin_lines(err, prefix) == [] and err.startswith(f"checked {prefix}: 3 sequences")


def test_a_check_stopped_at_its_first_violation_prints_no_summary(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    with open(get_bin_path(prefix), "ab") as stream:
        stream.write(b"\0" * 4)  # one token more than the index says
    assert [v.check for v in verify(prefix, progress=True)] == ["bin_size"]
    assert "checked" not in capsys.readouterr().err


def test_mega_verify_prints_ok_and_the_summary(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    assert main(["verify", prefix]) == 0
    out, err = capsys.readouterr()
    assert out == f"OK {prefix}\n"
    assert err.splitlines()[-1].startswith(f"checked {prefix}: 3 sequences, 2 documents")


@pytest.mark.skipif(not page_cache.CAN_ADVISE, reason="no posix_fadvise on this platform")
def test_the_bin_is_read_ahead_and_dropped_behind_the_read(make_corpus, monkeypatch):
    prefix = make_corpus(DOCUMENTS)
    advised = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *call: advised.append(call[1:]))
    monkeypatch.setattr(verification, "BIN_CHUNK", 8)
    monkeypatch.setattr(page_cache, "DROP_EVERY", 16)
    assert verify(prefix) == []
    assert advised == [
        (0, 0, os.POSIX_FADV_SEQUENTIAL),  # the whole file, at the start
        (0, 16, os.POSIX_FADV_DONTNEED),  # each DROP_EVERY bytes read
        (16, 8, os.POSIX_FADV_DONTNEED),  # and the rest at the end
    ]


def test_a_stream_without_a_descriptor_is_read_unadvised(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *call: calls.append(call), raising=False)
    read = page_cache.SequentialPass(io.BytesIO(b"remote bytes"))
    read.consumed(12, final=True)
    assert not read.advised and calls == []


@pytest.mark.skipif(not page_cache.CAN_ADVISE, reason="no posix_fadvise on this platform")
def test_advice_the_file_system_refuses_is_ignored(tmp_path, monkeypatch):
    def refuse(*call):
        raise OSError(29, "Illegal seek")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    path = tmp_path / "f"
    path.write_bytes(b"bytes")
    with open(path, "rb") as stream:
        read = page_cache.SequentialPass(stream)
        read.consumed(5, final=True)  # no error: advice is a hint
        assert read.advised
