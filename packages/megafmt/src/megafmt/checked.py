"""Remembering which corpora passed the consistency check at open, so that opening one again
costs a ``stat`` and a small read instead of a scan of its index.

The check (:func:`megafmt.verification.check_consistency`) reads every length, pointer and
document index: about 0.1 s for a 20M-document corpus, paid again by every process that opens
it (each rank, each restart). A corpus that passed is remembered in a small file under
``<cache folder>/checked`` (the cache folder is ``$MEGA_CACHE_DIR`` or ``~/.cache/megafmt/idx``)
with the identity of its ``.idx`` (size, modification and change times, inode, device) and the
``.bin``'s size; the scan is skipped while both are unchanged. A file written in place gets a new
change time, so it is checked again; a file changed within the last second is not remembered
(a write in the same tick of the file system's clock would keep its change time). Failing to
write the note (a read-only home) only means the next open scans again.

Processes that open the same unnoted corpus at once (the ranks of a node, on its first job)
check it one at a time (:func:`one_checker`, a lock in the notes' folder): the first checks and
writes the note, the others find it, so the machine reads the index once, not once per process.
A small index (``megafmt.dataset.UNNOTED_CHECK_SEQUENCES``) checks faster than its note is
written or the lock taken: each process checks it at every open, without either.
The notes of a machine share 256 locks, chosen by the note's name (a lock of its own was one more
file created per corpus, thousands at a blend's first build); files that share one are checked in
turns. A check that may take minutes (an SFT file's scan) takes a lock of its own.

Notes and locks never follow a symbolic link planted at their names (``O_NOFOLLOW``): a note
behind a link is not read, a lock behind one is not taken (a warning names it, and the check runs
without the lock), so nothing is created or read outside the cache folder. A cache folder that
is a symbolic link to nothing, or a file, is reported once with what it is, and the checks run
without notes.

Other checks that read whole files keep their notes the same way, in a folder of their own
(``kind``): megaindex remembers the index caches it verified in full (``verified``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Iterator
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process checks
    fcntl = None

from megafmt.atomic import NO_FOLLOW, read_unlinked, write_atomically
from megafmt.errors import NotAFolderError
from megafmt.fingerprint import file_identity, settled
from megafmt.folders import make_folder
from megafmt.redaction import redact
from megafmt.remote import default_cache_dir

logger = logging.getLogger(__name__)

#: the notes of corpora that passed the consistency check at open
CORPORA = "checked"
#: the longest a process waits for another to finish checking (a lock a dead node holds on a
#: network file system may never be released): it then checks by itself
LOCK_WAIT_SECONDS = 300.0
#: how often a process waiting for a lock says what holds it
LOCK_MESSAGE_SECONDS = 10.0
#: the size of the record a lock's holder writes at its start (what it checks, padded)
LOCK_RECORD_BYTES = 4096


def _note_path(path: str, kind: str) -> str:
    """The note of ``path`` on this machine: a cache folder shared by several machines (a home
    on a network file system) holds one note per machine, and locks of each machine's own."""
    key = f"{platform.node()}\0{os.path.abspath(path)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(default_cache_dir(), kind, f"{digest}.json")


def _lock_path(note_path: str, of_its_own: bool = False) -> str:
    """The lock of the note at ``note_path``: one of this machine's 256 in its folder, by the
    note's name (a folder shared by several machines holds 256 for each), or ``of_its_own``."""
    if of_its_own:
        return note_path + ".lock"
    folder, name = os.path.split(note_path)
    return os.path.join(folder, f"{name[:2]}-{_machine_tag(platform.node())}.lock")


@functools.lru_cache(maxsize=4)
def _machine_tag(node: str) -> str:
    """A short name of the machine ``node`` for its locks' names, hashed once per process."""
    return hashlib.sha256(node.encode()).hexdigest()[:8]


def corpus_identity(idx_path: str, bin_nbytes: int) -> list[int]:
    """What identifies the files a check saw: the local ``.idx``'s identity and the ``.bin``'s
    size."""
    return [*file_identity(idx_path), bin_nbytes]


def was_checked(path: str, identity: Any, kind: str = CORPORA) -> bool:
    """Whether the files named by ``path`` (a corpus's ``.idx``, or what ``kind`` notes) passed
    the check with exactly this ``identity`` (JSON data)."""
    try:
        note = json.loads(read_unlinked(_note_path(path, kind)))
        return note == {"path": os.path.abspath(path), "identity": identity}
    except (OSError, ValueError):
        return False


def remember_checked(
    path: str, identity: Any, changed_ns: int, taken_ns: int, kind: str = CORPORA
) -> None:
    """Note that the files passed the check, unless the newest change time among them
    (``changed_ns``) was within a second of the moment the identity was taken (``taken_ns``,
    :func:`time.time_ns` before the ``stat`` calls), or the note cannot be written."""
    if not settled(changed_ns, taken_ns):
        return
    note_path = _note_path(path, kind)
    note = {"path": os.path.abspath(path), "identity": identity}
    if not _notes_folder(note_path):
        return
    with contextlib.suppress(OSError):
        write_atomically(note_path, json.dumps(note).encode())


@contextlib.contextmanager
def one_checker(path: str, kind: str = CORPORA, lock_of_its_own: bool = False) -> Iterator[None]:
    """Hold this machine's lock on the note of ``path`` while checking: a process that finds
    the lock taken waits, then finds the note the holder wrote (look again with
    :func:`was_checked`). Without a lock (a cache folder that cannot be written, no ``flock``)
    nothing waits. A check that may take minutes (a scan of a large file) takes a lock
    ``lock_of_its_own``, so that no check of another file sharing its lock waits for it."""
    lock_path = _lock_path(_note_path(path, kind), lock_of_its_own)
    fd = _open_lock(lock_path) if _notes_folder(lock_path) else None
    if fd is None:
        yield
        return
    try:
        if fcntl is not None and _lock(fd, lock_path, path):
            # what a process waiting for the lock names (a lock serves the notes of many files),
            # over the record before: truncating the file instead cost 250 us per check
            holder = f"process {os.getpid()} on {platform.node()} checking {redact(path)}"
            record = holder.encode()[:LOCK_RECORD_BYTES].ljust(LOCK_RECORD_BYTES)
            with contextlib.suppress(OSError):
                os.pwrite(fd, record, 0)
        yield
    finally:
        os.close(fd)  # releases the lock


#: the folders whose notes (a cache folder that is not one) or locks (none to take) were
#: reported not usable, each kind once per process
_reported_folders: set[str] = set()
_reported_lock_folders: set[str] = set()


def _notes_folder(note_path: str) -> bool:
    """Whether the folder of ``note_path`` is there (made if missing); a cache folder that is a
    file or a link to nothing is reported once per process and means no notes."""
    folder = os.path.dirname(note_path)
    try:
        make_folder(folder, "the cache folder of megafmt's notes ($MEGA_CACHE_DIR)")
        if os.path.islink(folder):  # the cache folder may be a link; its notes' folder not
            raise NotAFolderError(
                f"{folder}: the notes' folder is a symbolic link (to {os.readlink(folder)!r}); "
                "notes are written only into a folder of their own"
            )
    except NotAFolderError as error:
        if folder not in _reported_folders:
            _reported_folders.add(folder)
            logger.warning("%s; checking without notes", error)
        return False
    except OSError:  # read-only or unreachable: no notes, each process checks
        return False
    return True


def _open_lock(lock_path: str) -> int | None:
    """The descriptor of the lock file, or None when there is none to hold (a folder that
    cannot be written); a symbolic link at its name is not followed, but reported."""
    try:
        return os.open(lock_path, os.O_RDWR | os.O_CREAT | NO_FOLLOW, 0o644)
    except OSError as error:
        if os.path.islink(lock_path):
            logger.warning(
                "%s: a symbolic link stands at the lock's name (to %r); it is not followed, "
                "checking without the lock (%s)",
                lock_path,
                os.readlink(lock_path),
                error.strerror,
            )
        else:
            _report_once(lock_path, f"cannot be opened ({error.strerror})")
        return None


def _report_once(lock_path: str, what: str) -> None:
    """Say, once per folder of locks, that a lock is not taken and why: each process then
    checks by itself (the machine reads an index once per process instead of once)."""
    folder = os.path.dirname(lock_path)
    if folder not in _reported_lock_folders:
        _reported_lock_folders.add(folder)
        logger.warning(
            "%s: %s; checks run without this machine's locks (each process checks by itself)",
            lock_path,
            what,
        )


def _lock(fd: int, lock_path: str, path: str) -> bool:
    """Take the lock, waiting at most :data:`LOCK_WAIT_SECONDS` and saying every
    :data:`LOCK_MESSAGE_SECONDS` what holds it; then go on without it. Whether it was taken."""
    start = time.monotonic()
    last_message = start
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            now = time.monotonic()
            if now - start >= LOCK_WAIT_SECONDS:
                logger.warning(
                    "%s: another process has held %s for over %.0f s; checking without it",
                    path,
                    lock_path,
                    LOCK_WAIT_SECONDS,
                )
                return False
            if now - last_message >= LOCK_MESSAGE_SECONDS:
                last_message = now
                logger.warning(
                    "%s: waiting for %s, held by %s (at most %.0f s in all)",
                    path,
                    lock_path,
                    _holder(fd),
                    LOCK_WAIT_SECONDS,
                )
            time.sleep(0.05)
        except OSError as error:  # a file system without locks: each process checks
            _report_once(lock_path, f"cannot be locked ({error.strerror})")
            return False


def _holder(fd: int) -> str:
    """What the holder of the lock at ``fd`` wrote in it: its process and the file it checks."""
    try:
        record = os.pread(fd, LOCK_RECORD_BYTES, 0)
        return record.decode(errors="replace").strip() or "another process"
    except OSError:
        return "another process"
