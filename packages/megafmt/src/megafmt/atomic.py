"""Writing files so that a reader never sees a half-written one.

Data goes to a ``*.partial`` file beside the destination (unique per writer, so two processes
writing the same destination do not collide) and is renamed over the destination only once it
is complete. ``os.replace`` is atomic on POSIX file systems: a reader sees the old file or the
new one, never a mixture.

Safe against links planted by another user of a shared folder: the partial file is created
exclusively (``O_EXCL``, ``O_NOFOLLOW``), so a link waiting at its name makes the write fail
instead of writing through it, and the rename replaces a link at the destination instead of
following it. The file gets the permissions the umask allows (``0o666`` less the umask), as a
file opened by ``open()`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from typing import BinaryIO

PARTIAL_SUFFIX = ".partial"
#: flags that keep ``os.open`` off a symbolic link at the name, and the descriptor out of
#: child processes (0 where the platform has no such flag)
NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


#: the bytes a temporary name adds to its destination's: ``.<pid>-<8 hex>-<8 hex>.partial`` (a
#: pid has at most 7 digits on Linux, pid_max <= 4194304)
PARTIAL_EXTRA = len(".4194304-") + 8 + len("-") + 8 + len(PARTIAL_SUFFIX)
#: what a temporary name added before it named its machine (``.<pid>-<8 hex>.partial``): the
#: stems of those leftovers are cut at other lengths
LEGACY_PARTIAL_EXTRA = len(".4194304-") + 8 + len(PARTIAL_SUFFIX)
#: how old a leftover of another machine (or PID namespace) must be to be removed: its writer
#: cannot be seen from here, and a container restarted under another name never comes back
#: for it
FOREIGN_LEFTOVER_SECONDS = 24 * 3600
#: the name limit assumed where the file system does not say (NAME_MAX of Linux file systems)
DEFAULT_NAME_MAX = 255


#: each folder's name limit, as its file system gave it
_NAME_MAX: dict[str, int] = {}


def _name_max(folder: str) -> int:
    """The file system's name limit in ``folder``, asked once per folder (a cache of thousands
    of corpora writes tens of thousands of files into one)."""
    where = os.path.abspath(folder or ".")  # a relative folder is another after a chdir
    known = _NAME_MAX.get(where)
    if known is not None:
        return known
    try:
        limit = os.pathconf(where, "PC_NAME_MAX")
    except (OSError, ValueError):  # no such folder yet, or no pathconf: the common limit
        return DEFAULT_NAME_MAX
    if len(_NAME_MAX) >= 1024:
        _NAME_MAX.clear()
    _NAME_MAX[where] = limit
    return limit


def _partial_stem(path: str, extra: int = PARTIAL_EXTRA) -> str:
    """What the temporary names of ``path`` start with: ``path`` itself, or, where its name
    plus :data:`PARTIAL_EXTRA` would pass the file system's name limit (so that a name that
    fits would fail as a temporary one), the name cut short and ended with a digest of it."""
    folder, name = os.path.split(path)
    room = _name_max(folder) - extra
    encoded = os.fsencode(name)  # a name that is not UTF-8 counts its own bytes
    if len(encoded) <= room:
        return path
    digest = hashlib.sha256(encoded).hexdigest()[:12]
    cut = os.fsdecode(encoded[: room - len(digest) - 1])
    return os.path.join(folder, f"{cut}~{digest}")


#: the token of this process's next temporary name: drawn at random once, then counted (one
#: draw per name was a system call for each of a blend's thousands of cache files); another
#: process under the same pid (a restart) draws its own start, and a forked child, which counts
#: on from its parent's, names its files with its own pid
_tokens = itertools.count(secrets.randbits(32))


def _where() -> str:
    """This machine and PID namespace, as 8 hex digits: a pid names a process only there, so
    the leftovers of writers elsewhere (another node on a shared file system, another
    container) are never judged by this machine's processes."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no procfs: the machine alone
        namespace = ""
    where = f"{socket.gethostname()} {namespace}".encode()
    return hashlib.blake2b(where, digest_size=4).hexdigest()


#: what this process's temporary names end with (a forked child's are its parent's: the same
#: machine and namespace)
_WHERE = _where()


def partial_path(path: str) -> str:
    """A temporary name beside ``path``, unique to this process and call; never longer than the
    file system allows when the name of ``path`` itself fits."""
    token = next(_tokens) & 0xFFFFFFFF
    return f"{_partial_stem(path)}.{os.getpid()}-{token:08x}-{_WHERE}{PARTIAL_SUFFIX}"


def _is_partial_of(name: str, stem: str) -> bool:
    """Whether ``name`` is a temporary name of ``stem`` (``<stem>.<pid>-<hex>-<where>.partial``,
    or a release's before them, ``<stem>.<pid>-<hex>.partial``). Plain string tests: a regular
    expression per stem fills the ``re`` module's cache when thousands of entries are saved."""
    if not (name.startswith(stem + ".") and name.endswith(PARTIAL_SUFFIX)):
        return False
    return _writer_in(name[len(stem) + 1 : -len(PARTIAL_SUFFIX)]) is not None


def _writer_in(tail: str) -> tuple[int, bool] | None:
    """The pid of a temporary name's end (``<pid>-<hex>-<where>``, or ``<pid>-<hex>``), and
    whether it was written on this machine and PID namespace (where its pid means a process
    this one can see); None: not such a name."""
    pid, dash, rest = tail.partition("-")
    token, _, where = rest.partition("-")
    if not (pid.isdigit() and dash and token) or token.strip("0123456789abcdef"):
        return None
    return int(pid), not where or where == _WHERE


def remove_quietly(path: str) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, but belongs to someone else
        return True
    return True


def remove_stale_partials(*paths: str) -> list[str]:
    """Delete the ``*.partial`` files and folders that writers of ``paths`` left behind when
    they were killed (their process no longer exists); returns what was removed. Those of
    writers still running are left alone, and those written on another machine or in another
    PID namespace (a cache on a shared file system), whose writers this one cannot see, until
    they are :data:`FOREIGN_LEFTOVER_SECONDS` old. Each folder is listed once, whatever the
    number of paths in it (an index cache of thousands of corpora holds tens of thousands of
    files)."""
    removed = []
    by_folder: dict[str, set[str]] = {}
    for path in paths:
        for extra in (PARTIAL_EXTRA, LEGACY_PARTIAL_EXTRA):  # a long name's two cuts
            folder, stem = os.path.split(_partial_stem(path, extra))
            by_folder.setdefault(folder, set()).add(stem)
    for folder, stems in by_folder.items():
        ours = {n for n in _partial_names(folder) for stem in stems if _is_partial_of(n, stem)}
        removed += _remove_dead(folder, sorted(ours))
    return removed


def remove_stale_partials_in(folder: str) -> list[str]:
    """What :func:`remove_stale_partials` removes, for every destination in ``folder`` (a
    cache folder, whose killed builds' leftovers belong to entries that may never be saved
    again); one listing."""
    return _remove_dead(folder, _partial_names(folder))


def _partial_names(folder: str) -> list[str]:
    """The names in ``folder`` that end like temporary ones (none where it does not exist)."""
    try:
        return [n for n in os.listdir(folder or ".") if n.endswith(PARTIAL_SUFFIX)]
    except FileNotFoundError:
        return []


def _remove_dead(folder: str, names: list[str]) -> list[str]:
    """Remove the temporary files and folders ``names`` whose writers are gone (on another
    machine: left :data:`FOREIGN_LEFTOVER_SECONDS` ago); what was removed."""
    removed = []
    for name in names:
        writer = _writer_in(name[: -len(PARTIAL_SUFFIX)].rpartition(".")[2])
        if writer is None:
            continue
        pid, here = writer
        candidate = os.path.join(folder, name)
        if here and _process_exists(pid):
            continue
        if not here and not _left_before(candidate, time.time() - FOREIGN_LEFTOVER_SECONDS):
            continue
        if os.path.isdir(candidate):
            shutil.rmtree(candidate, ignore_errors=True)
        else:
            remove_quietly(candidate)
        removed.append(candidate)
    return removed


def _left_before(path: str, moment: float) -> bool:
    """Whether ``path`` was last changed before ``moment`` (seconds since the epoch)."""
    try:
        return os.lstat(path).st_mtime < moment
    except OSError:
        return False


def _create_exclusive(path: str) -> int:
    """A descriptor of the new file ``path``, open for writing with the umask's permissions;
    raises ``FileExistsError`` when anything (a file, a link) is at ``path`` already."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW, 0o666)


def open_exclusive(path: str, buffering: int = -1) -> BinaryIO:
    """The new file ``path``, opened for writing with the umask's permissions; raises
    ``FileExistsError`` when anything (a file, a link) is at ``path`` already."""
    return os.fdopen(_create_exclusive(path), "wb", buffering=buffering)


def read_unlinked(path: str) -> bytes:
    """The bytes of the small file ``path`` (a note, a lock's companion), read without following
    a symbolic link at its name: a link planted there raises ``OSError`` (``ELOOP``) instead of
    handing back another file's contents."""
    descriptor = os.open(path, os.O_RDONLY | NO_FOLLOW)
    try:  # by the descriptor: a file object costs more than the read (a note per corpus)
        parts = []
        while part := os.read(descriptor, 1 << 16):
            parts.append(part)
        return b"".join(parts)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[str]:
    """A temporary name beside ``path``: renamed over ``path`` when the ``with`` block succeeds,
    deleted when it fails (``path`` is left as it was)."""
    partial = partial_path(path)
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        remove_quietly(partial)
        raise


@contextlib.contextmanager
def atomic_write(path: str, fsync: bool = False) -> Iterator[BinaryIO]:
    """Write a file that appears at ``path`` only when the ``with`` block succeeds.

    On an exception the partial file is deleted and ``path`` is left as it was. With ``fsync``
    the data reach the disk before the rename, so the file survives a power loss too.
    """
    with _replacing(path) as partial, open_exclusive(partial) as stream:
        yield stream
        if fsync:
            stream.flush()
            os.fsync(stream.fileno())


def write_exclusively(path: str, data: bytes | bytearray | memoryview, fsync: bool = False) -> None:
    """Write ``data`` into the new file ``path``, by the descriptor without a file object (a
    cache of thousands of corpora writes five small files for each, and a Python file with
    ``numpy.save``'s writer cost twice the creation of the file itself); raises
    ``FileExistsError`` when anything (a file, a link) is at ``path`` already. A write or close
    that fails (a full disk) removes the file again: nothing half-written stays at ``path``."""
    descriptor = _create_exclusive(path)
    try:
        try:
            remaining = memoryview(data).cast("B")
            while remaining:
                remaining = remaining[os.write(descriptor, remaining) :]
            if fsync:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)  # checked: a network file system reports a full disk here
    except BaseException:
        remove_quietly(path)
        raise


def write_atomically(path: str, data: bytes | bytearray | memoryview, fsync: bool = False) -> None:
    """:func:`atomic_write` of bytes in hand (:func:`write_exclusively` under a temporary
    name)."""
    with _replacing(path) as partial:
        write_exclusively(partial, data, fsync)
