"""An SFT jsonl that changes under its line index: replaced after it was opened (a loader
worker opens it by path later), or edited in place at the same size. Its lines would be read
at the old offsets; every read checks the descriptor is still the file indexed."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time

import fsspec
import pytest

from megafmt.errors import ObjectChangedError
from megafmt.sft import JsonlLineIndex
from megafmt.sft import lines as lines_module
from megafmt.sft.testing import write_sft_jsonl


@pytest.fixture
def indexed(tmp_path):
    path = tmp_path / "chat.jsonl"
    lines = write_sft_jsonl(path, 6, seed=2)
    return path, lines, JsonlLineIndex(str(path))


def test_unchanged_lines_read_as_written(indexed):
    _path, lines, index = indexed
    assert [index[i] for i in range(len(index))] == lines
    worker = pickle.loads(pickle.dumps(index))  # as a loader worker gets it
    assert worker[5] == lines[5]


def test_a_file_replaced_after_opening_is_refused_in_a_worker(indexed, tmp_path):
    path, _lines, index = indexed
    worker = pickle.loads(pickle.dumps(index))
    other = tmp_path / "other.jsonl"
    write_sft_jsonl(other, 6, seed=3)
    os.replace(other, path)
    with pytest.raises(ObjectChangedError, match=r"chat\.jsonl changed since it was indexed"):
        worker[0]


def test_a_file_edited_in_place_at_the_same_size_is_refused(indexed):
    path, lines, index = indexed
    assert index[0] == lines[0]  # the descriptor is open now
    size = os.path.getsize(path)
    with open(path, "r+b") as stream:  # one letter of a line, the size kept
        data = stream.read()
        at = data.index(b'"content": "') + len(b'"content": "')
        stream.seek(at)
        stream.write(b"X" if data[at : at + 1] != b"X" else b"Y")
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later tick
    assert os.path.getsize(path) == size
    with pytest.raises(ObjectChangedError, match="edited in place"):
        index[1]


def test_a_url_is_read_through_one_client_per_process(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "chat.jsonl"
    lines = write_sft_jsonl(local, 8, seed=5)
    url = "memory://sft-one-client/chat.jsonl"
    fsspec.filesystem("memory").pipe(url, local.read_bytes())
    made = []
    real = lines_module.filesystem
    monkeypatch.setattr(lines_module, "filesystem", lambda *a, **k: made.append(a) or real(*a, **k))
    index = JsonlLineIndex(url)
    assert [index[i] for i in range(8)] + [index[3]] == [*lines, lines[3]]
    assert len(made) == 1  # one client for nine reads (one per read before)
    worker = pickle.loads(pickle.dumps(index))
    assert worker[7] == lines[7] and len(made) == 2  # a process's own (the copy's)


def _open_at_once(path, barrier, results):
    barrier.wait()
    results.put(len(JsonlLineIndex(path, workers=1)))


def test_data_ranks_opening_a_new_jsonl_at_once_scan_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGA_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 30, seed=6)
    scans = tmp_path / "scans"
    real = lines_module._scan

    def slow_scan(*args, **kwargs):  # long enough that the others arrive meanwhile
        with open(scans, "a") as stream:
            stream.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(lines_module, "_scan", slow_scan)
    context = multiprocessing.get_context("fork")  # the ranks inherit the counting scan
    barrier, results = context.Barrier(4), context.Queue()
    ranks = [context.Process(target=_open_at_once, args=(path, barrier, results)) for _ in "abcd"]
    for rank in ranks:
        rank.start()
    found = [results.get(timeout=120) for _ in ranks]
    for rank in ranks:
        rank.join(timeout=60)
    assert found == [30] * 4 and all(rank.exitcode == 0 for rank in ranks)
    assert len(scans.read_text().splitlines()) == 1  # one scan; the others loaded its index
