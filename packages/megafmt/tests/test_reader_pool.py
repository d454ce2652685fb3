import errno
import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest

from megafmt import IndexedDataset, ReadError
from megafmt import dataset as dataset_module
from megafmt.limits import limit_hint
from megafmt.readers import pool as pool_module
from megafmt.readers.pool import ReaderPool


@pytest.fixture
def small_pool(monkeypatch):
    pool = ReaderPool(3)
    monkeypatch.setattr(dataset_module, "POOL", pool)
    monkeypatch.setattr(pool_module, "POOL", pool)
    return pool


def attached(datasets):
    return sum(d._bin_reader is not None for d in datasets)


def test_at_most_capacity_readers_stay_open(make_corpus, small_pool):
    prefixes = [make_corpus([[[i, i + 1, i + 2]]], name=f"c{i}") for i in range(10)]
    datasets = [IndexedDataset(p, mmap=False) for p in prefixes]
    assert attached(datasets) == 3
    descriptors = len(os.listdir("/proc/self/fd"))
    for _ in range(2):
        for i, dataset in enumerate(datasets):
            assert dataset[0].tolist() == [i, i + 1, i + 2]  # released readers reopen
            assert attached(datasets) <= 3
    assert len(os.listdir("/proc/self/fd")) <= descriptors  # the file reader holds one each
    assert len(small_pool) == 3


def test_a_dropped_dataset_frees_its_place_without_closing_another(make_corpus, small_pool):
    prefixes = [make_corpus([[[i]]], name=f"c{i}") for i in range(4)]
    first, second, third = (IndexedDataset(p, mmap=False) for p in prefixes[:3])
    del second
    gc.collect()
    fourth = IndexedDataset(prefixes[3], mmap=False)
    assert attached([first, third, fourth]) == 3
    assert len(small_pool) == 3


def test_recently_read_datasets_get_a_second_chance(make_corpus, small_pool):
    prefixes = [make_corpus([[[i]]], name=f"c{i}") for i in range(4)]
    first, second, third = (IndexedDataset(p, mmap=False) for p in prefixes[:3])
    first[0]  # marks the oldest as recently read
    fourth = IndexedDataset(prefixes[3], mmap=False)
    assert first._bin_reader is not None  # spared once
    assert second._bin_reader is None  # the oldest unmarked one went instead
    assert third._bin_reader is not None and fourth._bin_reader is not None


def test_memory_mapped_readers_hold_no_descriptor_and_stay_out_of_the_pool(make_corpus, small_pool):
    datasets = [IndexedDataset(make_corpus([[[i]]], name=f"c{i}")) for i in range(5)]
    assert len(small_pool) == 0
    assert attached(datasets) == 5


def test_reopening_is_idempotent(make_corpus, small_pool):
    dataset = IndexedDataset(make_corpus([[[1]]]), mmap=False)
    small_pool.opened(dataset)
    assert len(small_pool) == 1


def test_arrays_outlive_a_released_reader(make_corpus, small_pool):
    dataset = IndexedDataset(make_corpus([[[5, 6, 7]]]))
    tokens = dataset[0]
    dataset.release_reader()
    assert tokens.tolist() == [5, 6, 7]
    assert dataset.get(0, offset=1).tolist() == [6, 7]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity of at least 1"):
        ReaderPool(0)


def test_the_capacity_fits_the_open_files_limit(monkeypatch):
    from megafmt.readers import pool

    monkeypatch.setattr(pool, "soft_limit", {"RLIMIT_NOFILE": 256}.get)
    monkeypatch.delenv("MEGAFMT_MAX_OPEN_BIN", raising=False)
    assert pool._capacity_from_environment() == 128  # half a small limit by default
    monkeypatch.setenv("MEGAFMT_MAX_OPEN_BIN", "192")
    assert pool._capacity_from_environment() == 192
    monkeypatch.setenv("MEGAFMT_MAX_OPEN_BIN", "1000")
    with pytest.raises(ValueError) as raised:
        pool._capacity_from_environment()
    message = str(raised.value)
    assert "ulimit -n, RLIMIT_NOFILE: 256 files" in message
    assert "set MEGAFMT_MAX_OPEN_BIN to at most 192" in message
    monkeypatch.setattr(pool, "soft_limit", {"RLIMIT_NOFILE": None}.get)  # unlimited
    assert pool._capacity_from_environment() == 1000


@pytest.mark.parametrize("limit", [64, 100])
def test_a_small_open_files_limit_gets_a_default_that_fits_and_advice_that_can_be_taken(
    monkeypatch, limit
):
    from megafmt.readers import pool

    monkeypatch.setattr(pool, "soft_limit", {"RLIMIT_NOFILE": limit}.get)
    monkeypatch.delenv("MEGAFMT_MAX_OPEN_BIN", raising=False)
    default = pool._capacity_from_environment()
    assert default == max(1, limit - pool.RESERVED_DESCRIPTORS)  # the room, one at least
    monkeypatch.setenv("MEGAFMT_MAX_OPEN_BIN", str(default + 1))
    with pytest.raises(ValueError) as raised:
        pool._capacity_from_environment()
    assert f"set MEGAFMT_MAX_OPEN_BIN to at most {default}, or raise" in str(raised.value)
    monkeypatch.setenv("MEGAFMT_MAX_OPEN_BIN", str(default))
    assert pool._capacity_from_environment() == default  # the advice taken is accepted


def test_an_open_that_finds_no_descriptor_left_has_the_pool_release_half(
    make_corpus, monkeypatch, caplog
):
    pool = ReaderPool(8)
    monkeypatch.setattr(dataset_module, "POOL", pool)
    monkeypatch.setattr(pool_module, "POOL", pool)
    prefixes = [make_corpus([[[i, i + 1]]], name=f"c{i}") for i in range(7)]
    datasets = [IndexedDataset(p, mmap=False) for p in prefixes[:6]]
    assert attached(datasets) == 6
    real_open, failures = os.open, []

    def open_once_out_of_descriptors(path, flags, *args):
        if not failures:
            failures.append(path)
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_once_out_of_descriptors)
    with caplog.at_level("WARNING", logger="megafmt.readers.pool"):
        seventh = IndexedDataset(prefixes[6], mmap=False)
    assert failures and seventh[0].tolist() == [6, 7]
    # half released, the oldest first, and the capacity kept so (the process is short of
    # descriptors): the seventh's reader takes the place of a fourth
    assert pool.capacity == 3 and len(pool) == 3
    assert [d._bin_reader is not None for d in datasets] == [False] * 4 + [True] * 2
    assert "keeping at most 3 open from now on" in caplog.text
    assert [d[0].tolist() for d in datasets] == [[i, i + 1] for i in range(6)]  # reopened


def test_without_readers_to_release_no_descriptor_left_is_an_error_naming_the_limit(
    make_corpus, small_pool, monkeypatch
):
    prefix = make_corpus([[[1, 2]]])

    def out_of_descriptors(path, flags, *args):
        raise OSError(errno.EMFILE, "Too many open files", path)

    monkeypatch.setattr(os, "open", out_of_descriptors)
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    with pytest.raises(ReadError) as raised:
        IndexedDataset(prefix, mmap=False)
    message = str(raised.value)
    assert message.startswith(f"{prefix}.bin: cannot open the token file")
    assert "RLIMIT_NOFILE" in message and "Raise the limit" in message
    assert "has held them all for 0.63 s" in message
    assert waits == [0.01 * 2**n for n in range(6)]  # for other threads' opens, bounded
    assert raised.value.__cause__.errno == errno.EMFILE
    # the CLI's hint knows the limit from the error itself
    assert raised.value.errno == errno.EMFILE
    assert "the open-files limit was reached" in limit_hint(raised.value)


def test_an_open_that_finds_no_descriptor_waits_briefly_for_other_threads_opens(
    make_corpus, small_pool, monkeypatch
):
    # no descriptor free and no reader to give back, but other threads' opens under way give
    # theirs back a moment later: the open succeeds (an error before, at the first EMFILE)
    prefix = make_corpus([[[1, 2]]])
    real_open, refusals = os.open, [3]

    def briefly_out_of_descriptors(path, flags, *args):
        if refusals[0]:
            refusals[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", briefly_out_of_descriptors)
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    dataset = IndexedDataset(prefix, mmap=False)
    assert dataset[0].tolist() == [1, 2]
    assert waits == [0.01, 0.02, 0.04]


def test_a_read_that_must_reopen_without_a_descriptor_left_fails_worded_once(
    make_corpus, small_pool, monkeypatch
):
    # a transient read failure retires the descriptor; the retry's reopen then finds none left
    # and no reader to give back: its error, naming the file and the limit, is raised as it is
    # (the retry policy wrapped it before: "ReadError: ... (not retried: not a transient ...)")
    prefix = make_corpus([[[1, 2]]])
    dataset = IndexedDataset(prefix, mmap=False)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the retry's pause

    def failing_read(fd, buffers, offset):
        raise OSError(errno.EIO, "Input/output error")

    def out_of_descriptors(path, flags, *args):
        raise OSError(errno.EMFILE, "Too many open files", path)

    monkeypatch.setattr(os, "preadv", failing_read)
    monkeypatch.setattr(os, "open", out_of_descriptors)
    with pytest.raises(ReadError) as raised:
        dataset[0]
    message = str(raised.value)
    assert message.startswith(f"{prefix}.bin: cannot open the token file"), message
    assert "not retried" not in message and "ReadError" not in message
    assert raised.value.errno == errno.EMFILE


RUN_NEAR_THE_LIMIT = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
limit = 256 if hard == resource.RLIM_INFINITY else min(256, hard)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))  # before megafmt sizes its pool
from megafmt import IndexedDataset
from megafmt.readers import pool
prefixes = sys.argv[1:]
held = []
while True:  # the rest of the process holds all but 60 descriptors
    held.append(os.open(os.devnull, os.O_RDONLY))
    if held[-1] >= limit - 61:
        break
datasets = [IndexedDataset(p, mmap=False) for p in prefixes]
values = [int(d[0][0]) for d in datasets for _ in range(2)]
print(values == [i for i in range(len(prefixes)) for _ in range(2)], pool.POOL.capacity)
"""


def run_near_the_limit(script: str, make_corpus) -> subprocess.CompletedProcess:
    """``script`` run over 100 one-sequence corpora (corpus i holds i) in a process of its own,
    the pool sized from the open-files limit the script sets; it must succeed."""
    prefixes = [make_corpus([[[i, 0]]], name=f"c{i}") for i in range(100)]
    env = {k: v for k, v in os.environ.items() if k != "MEGAFMT_MAX_OPEN_BIN"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *prefixes],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_process_holding_most_of_its_descriptors_reads_every_corpus(make_corpus):
    # 100 corpora read by file descriptors, in a process whose other files leave 60 of its
    # 256: the pool (128 by default at that limit) fills until fewer than 16 are free, then
    # gives back readers until 32 are, and keeps to that many, instead of failing with "Too
    # many open files"
    done = run_near_the_limit(RUN_NEAR_THE_LIMIT, make_corpus)
    read, capacity = done.stdout.split()
    assert read == "True"
    # 60 free, less the 16 kept and the 16 more given back, less a transient .idx descriptor
    assert 20 <= int(capacity) <= 32
    assert done.stderr.count("keeping at most") == 1, done.stderr


RUN_AND_GIVE_BACK = (
    RUN_NEAR_THE_LIMIT
    + """
lowered = pool.POOL.capacity
for fd in held:  # the rest of the process gives its descriptors back
    os.close(fd)
more = [IndexedDataset(p, mmap=False) for p in prefixes]
assert [int(d[0][0]) for d in more] == list(range(len(prefixes)))
print(lowered, pool.POOL.capacity, pool.POOL.ceiling)
"""
)


def test_a_pool_lowered_for_want_of_descriptors_rises_again_once_they_come_back(make_corpus):
    # lowered while the rest of the process held all but 60 of 256 descriptors; once it gives
    # them back, opens counted every 64 find the room and the pool keeps its 128 readers again
    # (it kept 26 for good before)
    first, second = run_near_the_limit(RUN_AND_GIVE_BACK, make_corpus).stdout.splitlines()
    assert first.split()[0] == "True"
    lowered, capacity, ceiling = (int(n) for n in second.split())
    assert lowered <= 32 and capacity == ceiling == 128
