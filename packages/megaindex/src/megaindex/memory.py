"""Refusing, before anything is allocated, index tables or samples larger than the memory.

A huge ``sequence_length`` or sample count makes GPTDataset's document index hold billions of
entries (one per document per epoch), and a long sequence's attention mask is its length
squared: allocating them would go on until the process is killed. Their sizes follow from the
settings (the tables' from ``TableRecipe.expected_specs``), so they are known first and compared
with the memory available to this process: the kernel's ``MemAvailable``, capped by the
cgroup's room in a container (v2 or v1: its limit less what it uses, the page cache it can
reclaim not counted as used), less what this process's other threads hold for tables they are
building (``num_dataset_builder_threads`` build large corpora side by side, and a blend's
indices are drawn while its corpora build). Building needs somewhat more than the tables
themselves (a few temporaries); that margin is not counted.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping

import numpy

from megaindex.cache import TableSpec
from megaindex.errors import IndexBuildError

UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


def human(size: int) -> str:
    """``size`` bytes in the largest binary unit it reaches (``1.5 GiB``)."""
    value, unit = float(size), 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{size} bytes" if unit == 0 else f"{value:,.1f} {UNITS[unit]}"


def _read_number(path: str, prefix: str = "") -> int | None:
    """The number on the line of ``path`` starting with ``prefix`` (in bytes; ``kB`` scaled);
    None when the file, the line or a number is not there (``max`` means no limit)."""
    try:
        with open(path, encoding="ascii") as stream:
            for line in stream:
                if line.startswith(prefix):
                    fields = line[len(prefix) :].split()
                    scale = 1024 if fields[-1:] == ["kB"] else 1
                    return int(fields[0]) * scale if fields and fields[0].isdigit() else None
    except OSError:
        return None
    return None


#: the kernel's figures are read again after this many seconds, not for every check: a blend of
#: thousands of corpora checks each one's tables and samples (three file reads a check)
REREAD_SECONDS = 0.5
#: (when, what) of the last read of the kernel's figures
_last_read: list[tuple[float, int | None]] = []


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping, or None when unknown (as read
    at most :data:`REREAD_SECONDS` ago)."""
    now = time.monotonic()
    if _last_read and now - _last_read[0][0] < REREAD_SECONDS:
        return _last_read[0][1]
    available = _read_available()
    _last_read[:] = [(now, available)]
    return available


#: the kernel's memory figures
MEMINFO = "/proc/meminfo"
#: each cgroup version's files: the limit, the usage, its statistics and the line of the
#: reclaimable page cache in them
CGROUPS = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
     "inactive_file "),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
     "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file "),
)  # fmt: skip


def _read_available() -> int | None:
    """The kernel's ``MemAvailable`` now, capped by the cgroup's room in a container."""
    available = _read_number(MEMINFO, "MemAvailable:")
    for limit_file, usage_file, stat_file, cache_line in CGROUPS:
        limit, used = _read_number(limit_file), _read_number(usage_file)
        if limit is None or used is None:
            continue
        used -= min(used, _read_number(stat_file, cache_line) or 0)
        # v1 says "no limit" with a number beyond any memory: MemAvailable is then the bound
        room = max(limit - used, 0)
        available = room if available is None else min(available, room)
        break
    return available


#: what this process's threads hold for tables they are building (:func:`reserving`): each
#: build's bytes, and the memory available when it began
_reserved: list[tuple[int, int | None]] = []
_reserving = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has none of the threads that held memory (a builder's, a blend's draw in
    advance): it holds nothing, and a lock one of them held would never be released."""
    global _reserving
    _reserved.clear()
    _reserving = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _held(available: int) -> int:
    """The bytes other builds hold and have not allocated yet: what the memory available has
    not fallen by since each began (what it fell by is theirs already, or another
    allocation's: it is counted once, in ``available``)."""
    return sum(
        max(0, size - max(0, (began if began is not None else available) - available))
        for size, began in _reserved
    )


def table_bytes(specs: Mapping[str, TableSpec]) -> dict[str, int]:
    """The bytes each table of ``specs`` takes (its first dtype, its shape)."""
    return {
        # Python integers: no overflow, and a tenth of numpy.prod's time (thousands of corpora)
        name: math.prod(int(n) for n in spec.shape) * numpy.dtype(spec.dtypes[0]).itemsize
        for name, spec in specs.items()
    }


def check_fits(where: str, parts: Mapping[str, int], sizing: str) -> None:
    """Raise :class:`IndexBuildError` when ``parts`` (name: bytes) need more memory than is
    available (less what other threads hold for their tables), naming ``where`` (the dataset),
    each part's size and ``sizing`` (the settings that set those sizes, with their values)."""
    needed = sum(parts.values())
    available = available_memory()
    if available is None:
        return
    held = _held(available)
    if needed <= available - held:
        return
    sizes = ", ".join(f"{name} {human(size)}" for name, size in parts.items())
    others = f" ({human(held)} of it held for tables other threads are building)" if held else ""
    raise IndexBuildError(
        f"{where}: needs {human(needed)} ({sizes}), but this machine has {human(available)} "
        f"available{others}; the sizes follow from {sizing}: lower them"
    )


@contextlib.contextmanager
def reserving(where: str, parts: Mapping[str, int], sizing: str) -> Iterator[None]:
    """:func:`check_fits`, then hold ``parts``' bytes for the block: another thread's check
    meanwhile counts them as taken (the kernel's figures show an allocation only once made)."""
    held = (sum(parts.values()), available_memory())
    with _reserving:  # checked and held at once: two threads never both take the last room
        check_fits(where, parts, sizing)
        _reserved.append(held)
    try:
        yield
    finally:
        with _reserving, contextlib.suppress(ValueError):  # ValueError: a forked child's
            # unwinding of what its parent held (the child holds none of it)
            _reserved.remove(held)
