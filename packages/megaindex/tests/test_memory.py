"""The memory a build may take (megaindex.memory): the cgroup's room, v2 and v1, with its
reclaimable page cache not counted as used, and tables other threads are building held."""

from __future__ import annotations

import pytest

from megaindex import memory
from megaindex.errors import IndexBuildError


def cgroup(tmp_path, limit: str, used: int, cache_line: str, cached: int):
    files = []
    for name, text in (
        ("limit", f"{limit}\n"),
        ("usage", f"{used}\n"),
        ("stat", f"anon 5\n{cache_line}{cached}\nactive_file 7\n"),
    ):
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    return (*files, cache_line)


@pytest.mark.parametrize("cache_line", ["inactive_file ", "total_inactive_file "], ids=["v2", "v1"])
def test_the_cgroup_s_room_leaves_its_reclaimable_page_cache_out(tmp_path, monkeypatch, cache_line):
    missing = ("/nonexistent/a", "/nonexistent/b", "/nonexistent/c", "x ")
    found = cgroup(tmp_path, "1000000", 900000, cache_line, 300000)
    order = (found, missing) if cache_line == "inactive_file " else (missing, found)
    monkeypatch.setattr(memory, "CGROUPS", order)
    (tmp_path / "meminfo").write_text("MemAvailable: 5000 kB\n")  # more than the cgroup's room
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "meminfo"))
    assert memory._read_available() == 1000000 - (900000 - 300000)


def test_a_cgroup_without_a_limit_leaves_the_kernel_s_figure(tmp_path, monkeypatch):
    # v1 says "no limit" with a number beyond any memory; v2 with "max" (no number)
    unlimited = cgroup(tmp_path, str(2**63 - 4096), 900000, "total_inactive_file ", 0)
    monkeypatch.setattr(memory, "CGROUPS", (unlimited,))
    (tmp_path / "meminfo").write_text("MemTotal: 8000 kB\nMemAvailable: 5000 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", str(tmp_path / "meminfo"))
    assert memory._read_available() == 5000 * 1024
    (tmp_path / "limit").write_text("max\n")
    assert memory._read_available() == 5000 * 1024


def test_tables_other_threads_are_building_count_as_taken(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)
    with memory.reserving("corpus a", {"document_index": 600}, "its size"):
        with pytest.raises(IndexBuildError, match="600 bytes of it held for tables other thr"):
            memory.check_fits("corpus b", {"document_index": 600}, "its size")
        memory.check_fits("corpus b", {"document_index": 400}, "its size")  # what is left
    memory.check_fits("corpus b", {"document_index": 600}, "its size")  # given back
    with (
        pytest.raises(IndexBuildError, match="needs 1.1 KiB"),
        memory.reserving("corpus c", {"sample_index": 1100}, "its size"),
    ):
        pass
    assert memory._reserved == []  # a refused build holds nothing


def test_a_build_s_bytes_once_allocated_are_not_counted_twice(monkeypatch):
    available = [1000]
    monkeypatch.setattr(memory, "available_memory", lambda: available[0])
    with memory.reserving("corpus a", {"document_index": 400}, "its size"):
        available[0] = 700  # 300 of its 400 bytes allocated: the kernel counts them now
        memory.check_fits("corpus b", {"document_index": 600}, "its size")  # 700 - 100 held
        with pytest.raises(IndexBuildError, match="100 bytes of it held"):
            memory.check_fits("corpus b", {"document_index": 601}, "its size")
