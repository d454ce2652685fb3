"""Reliability: every corruption of a corpus ends in a clear error naming the file.

Each header field and each array of the ``.idx``, and the size of the ``.bin``, is damaged in
turn; opening the corpus (both readers) and ``mega info`` must refuse it with a
:class:`FormatError` (or :class:`MissingFileError`) whose message names the damaged file and
the field. A ``.bin`` truncated in place under a live memory map must give an error, not
SIGBUS; a directory where a file belongs must be named.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import textwrap
import time

import numpy
import pytest

from megafmt import (
    FormatError,
    IndexedDataset,
    MissingFileError,
    corpus_stats,
    get_bin_path,
    get_idx_path,
    verify,
)
from megafmt.cli.main import main

# lengths [3, 2, 1, 0, 4, 2] (int32), pointers [0, 12, 20, 24, 24, 40], documents [0, 2, 3, 5, 6]
DOCUMENTS = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8, 9, 10]], [[11, 12]]]
LENGTHS, POINTERS, DOCS = 34, 34 + 4 * 6, 34 + 12 * 6


def patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(data)


# (case, offset in the .idx, bytes written there, the file named, what the message says)
IDX_DAMAGE = [
    ("magic", 0, b"XXIDIDX\x00\x00", "idx", r"bad magic at offset 0"),
    ("version", 9, struct.pack("<Q", 2), "idx", r"unsupported version at offset 9"),
    ("dtype code unknown", 17, struct.pack("<B", 9), "idx", r"dtype code at offset 17"),
    ("dtype code int32->uint16", 17, struct.pack("<B", 8), "idx", r"sequence_pointers\[1\]"),
    ("dtype code int32->int64", 17, struct.pack("<B", 5), "idx", r"sequence_pointers\[1\]"),
    ("sequence count", 18, struct.pack("<Q", 7), "idx", r"the header at offset 18 says 7"),
    ("document count", 26, struct.pack("<Q", 4), "idx", r"says 6 sequences and 4 document"),
    ("negative length", LENGTHS + 4, struct.pack("<i", -7), "idx", r"sequence_lengths\[1\]"),
    ("length one too long", LENGTHS + 4, struct.pack("<i", 3), "idx", r"sequence_pointers\[2\]"),
    ("last length too long", LENGTHS + 20, struct.pack("<i", 3), "bin", r"expected 52 bytes"),
    ("first pointer", POINTERS, struct.pack("<q", 4), "idx", r"sequence_pointers\[0\]"),
    ("negative pointer", POINTERS + 8, struct.pack("<q", -8), "idx", r"sequence_pointers\[1\]"),
    ("odd pointer", POINTERS + 8, struct.pack("<q", 13), "idx", r"sequence_pointers\[1\]"),
    ("pointer past the end", POINTERS + 40, struct.pack("<q", 1 << 40), "idx", r"pointers\[5\]"),
    ("decreasing pointer", POINTERS + 16, struct.pack("<q", 8), "idx", r"sequence_pointers\[2\]"),
    ("first document index", DOCS, struct.pack("<q", 1), "idx", r"document_indices\[0\]"),
    ("decreasing documents", DOCS + 8, struct.pack("<q", 4), "idx", r"must not decrease"),
    ("document index too big", DOCS + 16, struct.pack("<q", 99), "idx", r"document_indices\[3\]"),
    ("last document index", DOCS + 32, struct.pack("<q", 5), "idx", r"document_indices\[4\]"),
]


def opened_every_way(prefix: str, error: type, match: str, capsys) -> None:
    """Opening with both readers and ``mega info`` all refuse the corpus with ``match``."""
    for mmap in (True, False):
        with pytest.raises(error, match=match):
            IndexedDataset(prefix, mmap=mmap)
    with pytest.raises(error, match=match):
        corpus_stats(prefix)
    assert main(["info", prefix]) == 1
    assert "mega info: error: " in capsys.readouterr().err


@pytest.mark.parametrize("case", IDX_DAMAGE, ids=[case[0] for case in IDX_DAMAGE])
def test_damaged_index_is_refused_naming_file_and_field(make_corpus, capsys, case):
    _, offset, data, named, what = case
    prefix = make_corpus(DOCUMENTS)
    patch(get_idx_path(prefix), offset, data)
    path = get_idx_path(prefix) if named == "idx" else get_bin_path(prefix)
    opened_every_way(prefix, FormatError, rf"^{path}: .*{what}", capsys)
    assert verify(prefix), "mega verify must find the same damage"


@pytest.mark.parametrize(
    ("case", "size", "what"),
    [
        ("longer", 50, "expected 48 bytes .* found 50"),
        ("shorter", 40, "expected 48 bytes .* found 40"),
        ("empty", 0, "expected 48 bytes .* found 0"),
    ],
)
def test_bin_of_another_size_than_the_index_implies(make_corpus, capsys, case, size, what):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_bin_path(prefix), size)
    opened_every_way(prefix, FormatError, rf"^{get_bin_path(prefix)}: {what}", capsys)


@pytest.mark.parametrize(("case", "size"), [("empty", 0), ("truncated", 100)])
def test_truncated_index(make_corpus, capsys, case, size):
    prefix = make_corpus(DOCUMENTS)
    os.truncate(get_idx_path(prefix), size)
    opened_every_way(prefix, FormatError, rf"^{get_idx_path(prefix)}: (truncated|file too)", capsys)


def test_uint16_corpus_read_as_int32_with_fast_cache_load(make_corpus):
    """megatron-core's fast cache load trusts the dtype given: a wrong one is caught by the
    .bin size (tokens would otherwise be read as pairs)."""
    prefix = make_corpus(DOCUMENTS, dtype=numpy.uint16)
    with pytest.raises(FormatError, match=rf"^{get_idx_path(prefix)}: sequence_pointers\[1\]"):
        IndexedDataset(prefix, fast_cache_load=True, sequences_per_dataset=(6, 5), dtype_code=4)


@pytest.mark.parametrize("suffix", [".idx", ".bin"])
@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "file"])
def test_a_directory_where_a_file_belongs_is_named(make_corpus, suffix, mmap):
    prefix = make_corpus(DOCUMENTS)
    os.remove(prefix + suffix)
    os.mkdir(prefix + suffix)
    with pytest.raises(MissingFileError, match=rf"^{prefix + suffix}: found a directory where"):
        IndexedDataset(prefix, mmap=mmap)


def test_mega_info_says_the_corpus_passed_its_check(make_corpus, capsys):
    prefix = make_corpus(DOCUMENTS)
    assert main(["info", prefix]) == 0
    assert "consistency" in capsys.readouterr().out
    assert "passed: .bin size, pointers, lengths" in corpus_stats(prefix).consistency


SHRINK = textwrap.dedent(
    """
    import os, sys, time
    from megafmt import IndexedDataset
    prefix, how = sys.argv[1], sys.argv[2]
    dataset = IndexedDataset(prefix)
    dataset.get(5)
    os.truncate(prefix + ".bin", 0)  # what `cp new.bin corpus.bin` does first
    time.sleep(0.05)
    for attempt in range(2):  # the second read, at once, must not slip past the check
        try:
            if how == "get":
                print(int(dataset.get(5)[0]))
            else:
                print(int(dataset.tokens_view[-1]))
        except Exception as error:
            print(type(error).__name__, error)
    """
)


@pytest.mark.parametrize("how", ["get", "tokens_view"])
def test_bin_truncated_in_place_under_the_map_is_an_error_not_sigbus(make_corpus, how):
    prefix = make_corpus(DOCUMENTS)
    run = subprocess.run(
        [sys.executable, "-c", SHRINK, prefix, how], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, f"the reader crashed (signal {-run.returncode}): {run.stderr}"
    lines = run.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith(f"FormatError {get_bin_path(prefix)}: the file shrank from 48")


def test_a_bin_replaced_by_rename_is_read_as_mapped(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    dataset = IndexedDataset(prefix)
    os.replace(make_corpus([[[1]]], name="other") + ".bin", get_bin_path(prefix))
    assert dataset.get(5).tolist() == [11, 12]  # the mapping keeps the file it mapped


def test_pickled_dataset_skips_the_scan_only_for_the_same_files(make_corpus, monkeypatch):
    from megafmt import dataset as dataset_module

    prefix = make_corpus(DOCUMENTS)
    dataset = IndexedDataset(prefix)
    calls = []
    monkeypatch.setattr(dataset_module, "check_consistency", lambda *a: calls.append(a))
    pickle.loads(pickle.dumps(dataset))
    assert calls == []  # a DataLoader worker does not scan the index again
    os.utime(get_idx_path(prefix), ns=(1, 1))  # another file under the same name
    pickle.loads(pickle.dumps(dataset))
    assert len(calls) == 1


def test_a_pickled_dataset_refuses_a_corpus_replaced_since_it_was_opened(make_corpus):
    prefix = make_corpus(DOCUMENTS)
    state = pickle.dumps(IndexedDataset(prefix))
    then = os.path.getsize(get_idx_path(prefix)), os.path.getsize(get_bin_path(prefix))
    other = make_corpus(DOCUMENTS[:-1], name="other")  # re-tokenized, renamed over it
    for path in (get_idx_path, get_bin_path):
        os.replace(path(other), path(prefix))
    now = os.path.getsize(get_idx_path(prefix)), os.path.getsize(get_bin_path(prefix))
    with pytest.raises(FormatError, match="files changed since the dataset was opened") as caught:
        pickle.loads(state)  # a DataLoader worker's copy
    message = str(caught.value)
    assert f"then .idx of {then[0]} bytes" in message and f"and .bin of {then[1]} bytes" in message
    assert f"now .idx of {now[0]} bytes" in message and f"and .bin of {now[1]} bytes" in message


def test_a_reader_reopened_on_a_bin_renamed_over_the_one_opened_is_refused(make_corpus, tmp_path):
    prefix = make_corpus(DOCUMENTS)
    dataset = IndexedDataset(prefix, mmap=False)
    assert dataset.get(0).tolist() == [1, 2, 3]
    dataset.release_reader()  # as the pool of open files does
    size = os.path.getsize(get_bin_path(prefix))
    replacement = str(tmp_path / "replacement.bin")
    with open(replacement, "wb") as stream:  # the same size, other tokens
        stream.write(bytes(size))
    os.replace(replacement, get_bin_path(prefix))
    with pytest.raises(FormatError, match=r"corpus\.bin: reopened as inode \d+, but it was opened"):
        dataset.get(0)


def test_a_checked_corpus_is_remembered_until_its_index_changes(make_corpus, monkeypatch, tmp_path):
    from megafmt import dataset as dataset_module
    from megafmt import fingerprint

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    monkeypatch.setattr(dataset_module, "UNNOTED_CHECK_SEQUENCES", 0)  # a large index's way
    prefix = make_corpus(DOCUMENTS)
    IndexedDataset(prefix)  # checked, and remembered
    calls = []
    real = dataset_module.check_consistency
    monkeypatch.setattr(dataset_module, "check_consistency", lambda *a: calls.append(a) or real(*a))
    IndexedDataset(prefix)
    assert calls == []  # a stat and a small read, no scan
    time.sleep(0.05)  # a later tick of the file system's clock
    patch(get_idx_path(prefix), LENGTHS + 4, struct.pack("<i", -7))  # written in place
    with pytest.raises(FormatError, match=r"sequence_lengths\[1\]"):
        IndexedDataset(prefix)
    assert len(calls) == 1


def test_processes_opening_an_unnoted_corpus_at_once_check_it_once(
    make_corpus, monkeypatch, tmp_path
):
    """While one process holds the lock on a corpus's note (checking it), another that opens
    the corpus waits, then finds the note and reads no index."""
    import threading

    from megafmt import checked, fingerprint
    from megafmt import dataset as dataset_module

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    monkeypatch.setattr(dataset_module, "UNNOTED_CHECK_SEQUENCES", 0)  # a large index's way
    prefix = make_corpus(DOCUMENTS)
    time.sleep(0.05)
    calls = []
    real = dataset_module.check_consistency
    monkeypatch.setattr(dataset_module, "check_consistency", lambda *a: calls.append(a) or real(*a))
    opened = []
    waiter = threading.Thread(target=lambda: opened.append(IndexedDataset(prefix)))
    idx = os.path.abspath(get_idx_path(prefix))
    with checked.one_checker(idx):  # the first process, checking
        waiter.start()
        waiter.join(timeout=0.3)
        assert waiter.is_alive() and not opened  # waits for the lock
        size = os.path.getsize(get_bin_path(prefix))
        identity = checked.corpus_identity(idx, size)
        checked.remember_checked(idx, identity, 0, time.time_ns())
    waiter.join(timeout=10)
    assert len(opened) == 1 and calls == []  # the note the first one wrote: no scan


@pytest.mark.parametrize("unnoted", [4096, 0])
def test_a_small_corpus_is_checked_at_every_open_without_a_note_or_the_lock(
    make_corpus, monkeypatch, tmp_path, unnoted
):
    """An index of at most UNNOTED_CHECK_SEQUENCES sequences checks faster than its note is
    written or the lock taken: it is checked at every open, never noted; a larger one is
    checked once under the lock and noted."""
    from megafmt import dataset as dataset_module
    from megafmt import fingerprint

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    monkeypatch.setattr(dataset_module, "UNNOTED_CHECK_SEQUENCES", unnoted)
    prefix = make_corpus(DOCUMENTS)
    time.sleep(0.05)
    checks, locks = [], []
    real_check, real_lock = dataset_module.check_consistency, dataset_module.one_checker
    monkeypatch.setattr(
        dataset_module, "check_consistency", lambda *a: checks.append(a) or real_check(*a)
    )
    monkeypatch.setattr(dataset_module, "one_checker", lambda *a: locks.append(a) or real_lock(*a))
    IndexedDataset(prefix)
    assert len(checks) == 1 and len(locks) == (0 if unnoted else 1)
    IndexedDataset(prefix)
    assert len(checks) == (2 if unnoted else 1)
    notes = list((tmp_path / "cache").glob("checked/*.json"))
    assert len(notes) == (0 if unnoted else 1)


def test_a_corpus_changed_in_the_last_second_is_not_remembered(make_corpus, monkeypatch, tmp_path):
    from megafmt import dataset as dataset_module
    from megafmt import fingerprint

    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dataset_module, "UNNOTED_CHECK_SEQUENCES", 0)  # a large index's way
    prefix = make_corpus(DOCUMENTS)
    IndexedDataset(prefix)
    notes = tmp_path / "cache" / "checked"
    assert list(notes.glob("*.json")) == []  # (the lock beside the note is there)
    monkeypatch.setattr(fingerprint, "SETTLED_SECONDS", 0.0)
    IndexedDataset(prefix)
    assert len(list(notes.glob("*.json"))) == 1
