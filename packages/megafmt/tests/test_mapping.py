"""release_pages: a scanned mapping's pages leave the process's RSS, its bytes stay the same,
and memory that is not a map_file mapping is never touched."""

import os
import sys

import numpy
import pytest

from megafmt.mapping import map_file, release_pages

SIZE = 64 << 20


def resident_mib() -> float:
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_released_pages_leave_the_rss_and_read_back_the_same(tmp_path):
    path = tmp_path / "data"
    expected = numpy.random.default_rng(0).integers(0, 2**31, SIZE // 4, dtype=numpy.int32)
    path.write_bytes(expected.tobytes())
    fd = os.open(path, os.O_RDONLY)
    data = map_file(str(path), fd, SIZE)
    os.close(fd)
    values = data.view(numpy.int32)
    before = resident_mib()
    assert int(values.sum(dtype=numpy.int64)) == int(expected.sum(dtype=numpy.int64))
    touched = resident_mib()
    release_pages(values[1:])  # the first page is partly outside the view: it stays
    released = resident_mib()
    assert touched - before > 48 and touched - released > 48, (before, touched, released)
    assert numpy.array_equal(values, expected)


def test_memory_that_is_not_a_mapping_is_left_alone():
    values = numpy.arange(SIZE // 8, dtype=numpy.int64)
    release_pages(values)
    assert numpy.array_equal(values, numpy.arange(SIZE // 8, dtype=numpy.int64))


def test_a_live_mapping_costs_little_memory_and_nothing_once_released(tmp_path):
    """A blend holds thousands of mappings of files of different sizes at once: each costs the
    process well under a KiB of its own memory (a ctypes array over the memory cost about
    4 KiB: a type made per array length), and nothing of them stays once their arrays are
    gone."""
    import gc
    import tracemalloc

    from megafmt import mapping

    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        warm = [map_file(str(path), fd, size) for size in range(1, 50)]  # made once, at first
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            live = [map_file(str(path), fd, size) for size in range(1000, 1400)]
            gc.collect()
            each = (tracemalloc.get_traced_memory()[0] - before) / len(live)
        finally:
            tracemalloc.stop()
    finally:
        os.close(fd)
    assert all(d[-1] == (d.size - 1) % 256 and not d.flags.writeable for d in live + warm)
    assert each < 1024, f"{each:.0f} bytes of memory per live mapping"
    addresses = {d.ctypes.data for d in live + warm}
    assert addresses <= set(mapping._MAPPINGS)
    del live, warm
    gc.collect()
    assert not addresses & set(mapping._MAPPINGS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_mappings_held_and_their_limit_are_the_system_s(tmp_path):
    from megafmt import mapping

    with open("/proc/sys/vm/max_map_count") as stream:
        assert mapping.mapping_limit() == int(stream.read())
    path = tmp_path / "data"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    before = mapping.mappings_in_use()
    data = map_file(str(path), fd, 8192)
    os.close(fd)
    assert mapping.mappings_in_use() == before + 1
    del data
    assert mapping.mappings_in_use() == before


class _RefusingLibc:
    """A C library whose ``mmap`` fails, as the kernel's does past ``vm.max_map_count``."""

    def mmap(self, *args):
        return None


@pytest.mark.parametrize(
    ("held", "limit", "said"),
    [
        (
            65_500,
            65_530,
            r"holds 65,500 memory mappings, the most .* vm\.max_map_count is "
            r"65,530; .* sysctl -w vm\.max_map_count=131060\)",
        ),
        (1_000, 65_530, r"holds 1,000 memory mappings, below the 65,530 .* out of memory"),
        (
            1_000,
            65_530,
            r"holds 1,000 memory mappings, below the 65,530 the system allows: the "
            r"address-space limit \(ulimit -v, RLIMIT_AS: 4,096 bytes\) may have been reached",
        ),
    ],
)
def test_a_refused_mapping_names_the_mappings_held_and_the_limit(
    tmp_path, monkeypatch, held, limit, said
):
    import ctypes
    import errno

    from megafmt import mapping

    monkeypatch.setattr(mapping, "_LIBC", _RefusingLibc())
    monkeypatch.setattr(ctypes, "get_errno", lambda: errno.ENOMEM)
    monkeypatch.setattr(mapping, "mappings_in_use", lambda: held)
    monkeypatch.setattr(mapping, "mapping_limit", lambda: limit)
    address_space = 4096 if "RLIMIT_AS" in said else None
    monkeypatch.setattr(mapping, "soft_limit", lambda name: address_space)
    path = tmp_path / "data"
    path.write_bytes(bytes(10))
    refused = rf"cannot map .*data: Cannot allocate memory \(this process {said}"
    with pytest.raises(OSError, match=refused):
        map_file(str(path), 0, 10)
