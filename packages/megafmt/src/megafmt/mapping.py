"""Read-only memory maps that do not hold a file descriptor.

Python's ``mmap.mmap`` keeps a duplicate of the descriptor for as long as the mapping lives, so
a process that maps the ``.idx`` and ``.bin`` of a thousand corpora (a large blend) holds two
thousand descriptors and runs into the open-file limit (1024 by default on many systems). POSIX
does not need the descriptor once the mapping exists: here the file is mapped with the C
library's ``mmap``, the descriptor is closed at once, and the mapping is released when the last
array viewing it is garbage-collected. Where that is unavailable, ``mmap.mmap`` is used.

Mappings have a limit of their own: Linux lets a process hold ``vm.max_map_count`` of them
(65,530 by default), and a blend, once every part has been read, maps two files of each corpus
(its ``.idx`` and ``.bin``) and three of each split's dataset over it (its index tables). A
mapping refused for want of room says how many the process holds and the limit
(:func:`mappings_in_use`, :func:`mapping_limit`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import weakref

import numpy

from megafmt.limits import soft_limit

_PROT_READ = mmap.PROT_READ if hasattr(mmap, "PROT_READ") else 1
_MAP_SHARED = mmap.MAP_SHARED if hasattr(mmap, "MAP_SHARED") else 1


def _libc() -> ctypes.CDLL | None:
    if os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
_PAGE = mmap.PAGESIZE
#: address -> size of each live mapping made by ``map_file``
_MAPPINGS: dict[int, int] = {}
#: where Linux says how many memory mappings a process may hold
MAP_COUNT_LIMIT_PATH = "/proc/sys/vm/max_map_count"
#: mappings within this many of the limit count as having reached it (libraries map too)
MAP_COUNT_MARGIN = 64


def mapping_limit() -> int | None:
    """How many memory mappings a process may hold (Linux's ``vm.max_map_count``), or None
    where the system does not say."""
    try:
        with open(MAP_COUNT_LIMIT_PATH, "rb") as stream:
            return int(stream.read())
    except (OSError, ValueError):
        return None


def mappings_in_use() -> int | None:
    """How many memory mappings this process holds now (the lines of ``/proc/self/maps``), or
    None where the system does not say."""
    try:
        with open("/proc/self/maps", "rb") as stream:  # in pieces: asked when memory is short
            return sum(piece.count(b"\n") for piece in iter(lambda: stream.read(1 << 16), b""))
    except (OSError, MemoryError):
        return None


def _refusal_hint(code: int) -> str:
    """What a mapping refused with ``code`` ran into: for ENOMEM, the mappings held against the
    limit (the kernel's answer when the count would pass it) or else memory."""
    if code != errno.ENOMEM:
        return ""
    held, limit = mappings_in_use(), mapping_limit()
    if held is None or limit is None:
        return ""
    if held + MAP_COUNT_MARGIN < limit:
        address_space = soft_limit("RLIMIT_AS")
        reached = (
            "the machine ran out of memory or address space"
            if address_space is None
            else f"the address-space limit (ulimit -v, RLIMIT_AS: {address_space:,} bytes) may "
            "have been reached"
        )
        return (
            f" (this process holds {held:,} memory mappings, below the {limit:,} the system "
            f"allows: {reached})"
        )
    return (
        f" (this process holds {held:,} memory mappings, the most the system allows a process: "
        f"vm.max_map_count is {limit:,}; a blend maps two files of each corpus and three of each "
        f"split's dataset over it. Raise it, e.g. sysctl -w vm.max_map_count={2 * limit})"
    )


class _Mapping:
    """The memory of one mapping, as numpy takes it (the base of the arrays viewing it).

    Not a ctypes array: ctypes makes, and keeps for good, a type per array length, which for a
    blend of thousands of corpora is thousands of types (about 4 KiB each) that outlive their
    mappings."""

    __slots__ = ("__weakref__", "address", "size")

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size

    @property
    def __array_interface__(self) -> dict:
        return {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.address, True),  # read-only: the pages are mapped without PROT_WRITE
            "version": 3,
        }


def _unmap(address: int, size: int) -> None:
    _MAPPINGS.pop(address, None)
    _LIBC.munmap(address, size)


def map_file(path: str, fd: int, size: int) -> numpy.ndarray:
    """The ``size`` bytes of the open file ``fd`` (at ``path``) as a read-only uint8 array.

    The caller may close ``fd`` right after. Views of the array keep the mapping alive.
    """
    if size == 0:
        return numpy.empty(0, dtype=numpy.uint8)
    if _LIBC is None:
        data = numpy.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), dtype=numpy.uint8)
        return data[:size]
    address = _LIBC.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
    if address in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"cannot map {path}: {os.strerror(error)}{_refusal_hint(error)}")
    memory = _Mapping(address, size)
    _MAPPINGS[address] = size
    release = weakref.finalize(memory, _unmap, address, size)
    release.atexit = False  # at exit the OS unmaps; arrays may still be in use until then
    return numpy.asarray(memory)  # read-only, as its interface says: a write would crash


def release_pages(view: numpy.ndarray) -> None:
    """Drop from this process the resident pages of a ``map_file`` mapping that ``view`` covers
    whole: pages read once (a scan of a large index) otherwise count in the process's RSS for
    as long as the mapping lives. The file's bytes are unchanged; reading them again faults the
    pages back in from the page cache. Does nothing for memory that is not such a mapping.

    The mapping is found through ``view``'s chain of bases (a view of a view of the array
    ``map_file`` returned), not by scanning every live mapping: a blend of thousands of corpora
    holds thousands, and releases pages of each one's tables."""
    if _LIBC is None or not view.nbytes:
        return
    start = view.ctypes.data
    first = -(-start // _PAGE) * _PAGE
    last = (start + view.nbytes) // _PAGE * _PAGE
    if last <= first:
        return
    owner: object = view
    while isinstance(owner, numpy.ndarray):
        owner = owner.base
    if not isinstance(owner, _Mapping):
        return
    address = owner.address
    size = _MAPPINGS.get(address)
    if size is not None and address <= first and last <= address + size:
        _LIBC.madvise(first, last - first, _MADV_DONTNEED)
