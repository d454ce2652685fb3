"""A fingerprint of a corpus: enough to notice that the files at a prefix have changed.

It holds the sizes of both files, a checksum of the whole ``.idx`` (small next to the ``.bin``:
every length and pointer counts, so any change to the index is noticed) and a hash of blocks
sampled evenly through the ``.bin``. Re-tokenizing into the same prefix changes it; caches keyed
by path alone (megatron-core's) cannot tell.

The checksum is CRC-32 (``zlib``, about 2 GB/s, at the speed the file is read): it notices
accidental changes (a rewrite, a damaged block), not deliberate forgeries.
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from typing import Any

from megafmt.format import HEADER_SIZE, get_bin_path, get_idx_path
from megafmt.index import open_readonly
from megafmt.readers import is_url
from megafmt.remote import object_version

#: a file changed more recently than this is not remembered by its identity (a write in the
#: same tick of the file system's clock would keep its change time)
SETTLED_SECONDS = 1.0
#: corpora whose fingerprint this process remembers (the splits of one corpus read it once)
REMEMBERED_FINGERPRINTS = 16
_fingerprints: dict[tuple[Any, ...], dict[str, int | str]] = {}

SAMPLED_BLOCKS = 16
BLOCK_BYTES = 4096
#: the first bytes of a ``.bin`` hashed before its sampled blocks
SAMPLED_HEADER_BYTES = HEADER_SIZE
READ_BYTES = 16 << 20  # read a whole file in steps of this size


def checksum(data: Any, running: int = 0) -> int:
    """The CRC-32 of a buffer (bytes, a contiguous numpy array), continuing ``running``."""
    return zlib.crc32(data, running)


def file_checksum(path: str, what: str) -> tuple[int, str]:
    """The size of the file at ``path`` and the CRC-32 of all its bytes (hex)."""
    fd = open_readonly(path, what)
    running, size = 0, 0
    try:
        # no larger than the file: a small .idx is not read through 16 MiB zeroed for it
        buffer = bytearray(min(READ_BYTES, os.fstat(fd).st_size + 1))
        while got := os.readv(fd, [buffer]):
            running = checksum(memoryview(buffer)[:got], running)
            size += got
    finally:
        os.close(fd)
    return size, f"{running:08x}"


def _sampled_hash(path: str, what: str, blocks: int) -> tuple[int, str]:
    """The size of the file at ``path`` and a hash of ``blocks`` blocks spread through it."""
    fd = open_readonly(path, what)
    try:
        size = os.fstat(fd).st_size
        digest = hashlib.blake2b(digest_size=16)
        step = max(size // blocks, BLOCK_BYTES)
        if step == BLOCK_BYTES:  # the blocks touch: the same bytes hashed, read at once
            whole = os.pread(fd, size, 0)
            sampled = [whole[:SAMPLED_HEADER_BYTES], whole, whole[max(size - BLOCK_BYTES, 0) :]]
        else:
            sampled = [os.pread(fd, SAMPLED_HEADER_BYTES, 0)]
            sampled += (os.pread(fd, BLOCK_BYTES, offset) for offset in range(0, size, step))
            sampled.append(os.pread(fd, BLOCK_BYTES, size - BLOCK_BYTES))
        for block in sampled:
            digest.update(block)
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def file_version(path: str, what: str) -> tuple[int, str]:
    """The size of a file and a hash of its contents: for a URL the store's ETag (nothing is
    read), else hashed sample blocks."""
    return object_version(path) if is_url(path) else _sampled_hash(path, what, SAMPLED_BLOCKS)


def corpus_fingerprint(path_prefix: str) -> dict[str, int | str]:
    """Sizes and content hashes of both files of the corpus at ``path_prefix``: the whole
    ``.idx``'s checksum and the ``.bin``'s sampled blocks; for a URL the store's ETags (nothing
    is read). A local corpus's is remembered in this process while both files keep their
    identity (``file_identity``), so the splits of one build read the ``.idx`` once."""
    idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
    if is_url(path_prefix):
        (idx_bytes, idx_hash), (bin_bytes, bin_hash) = map(object_version, (idx_path, bin_path))
        return {
            "idx_bytes": idx_bytes,
            "idx_hash": idx_hash,
            "bin_bytes": bin_bytes,
            "bin_hash": bin_hash,
        }
    taken = time.time_ns()
    idx_identity, bin_identity = file_identity(idx_path), file_identity(bin_path)
    key = (os.path.abspath(path_prefix), *idx_identity, *bin_identity)
    if key in _fingerprints:
        return dict(_fingerprints[key])
    idx_bytes, idx_crc = file_checksum(idx_path, "index file")
    bin_bytes, bin_hash = file_version(bin_path, "token file")
    fingerprint: dict[str, int | str] = {
        "idx_bytes": idx_bytes,
        "idx_crc32": idx_crc,
        "bin_bytes": bin_bytes,
        "bin_hash": bin_hash,
    }
    if settled(idx_identity[CHANGE_TIME], taken) and settled(bin_identity[CHANGE_TIME], taken):
        if len(_fingerprints) >= REMEMBERED_FINGERPRINTS:
            _fingerprints.pop(next(iter(_fingerprints)))
        _fingerprints[key] = dict(fingerprint)
    return fingerprint


#: where a :func:`file_identity` holds the change time
CHANGE_TIME = 2


def file_identity(path: str) -> list[int]:
    """Size, modification and change times (ns), inode and device of a local file. Equal
    identities mean the same bytes: a write in place changes the change time, which no one can
    set back, short of a write within the same tick of the file system's clock (a few
    milliseconds) as the moment the identity was taken."""
    return identity_of(os.stat(path))


def inode_of(path: str) -> int | None:
    """The inode of the file at ``path`` now (None: none there, or not stat'ed): whether a
    name still holds the file seen before."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def identity_of(status: os.stat_result) -> list[int]:
    """:func:`file_identity` from a ``stat`` or ``fstat`` result (of a file already open)."""
    return [
        status.st_size,
        status.st_mtime_ns,
        status.st_ctime_ns,
        status.st_ino,
        status.st_dev,
    ]


def settled(change_time_ns: int, taken_ns: int) -> bool:
    """Whether a file whose change time is ``change_time_ns`` can be remembered by the identity
    taken at ``taken_ns``: it had not changed for ``SETTLED_SECONDS`` then (a write in the same
    tick of the file system's clock keeps the change time)."""
    return taken_ns - change_time_ns >= SETTLED_SECONDS * 1e9


def corpus_stat(path_prefix: str) -> dict[str, list[int]]:
    """Size, modification time (ns) and inode of both files: two ``stat`` calls. Equal stats
    mean unchanged files (short of someone resetting the time on purpose); unequal ones call
    for :func:`corpus_fingerprint`, since a copy has the same contents under another stat."""
    stats: dict[str, list] = {}
    for suffix, path in (("idx", get_idx_path(path_prefix)), ("bin", get_bin_path(path_prefix))):
        if is_url(path):
            stats[suffix] = list(object_version(path))
            continue
        status = os.stat(path)
        stats[suffix] = [status.st_size, status.st_mtime_ns, status.st_ino]
    return stats


def sizes_and_inodes(stat: dict[str, list[int]]) -> list[int]:
    """The ``.idx``'s size and inode, then the ``.bin``'s, of a local :func:`corpus_stat`: what
    tells the files apart from others put at their path (a rename over them, a cut or a growth),
    and stays the same when only their times change (a ``touch``)."""
    return [stat["idx"][0], stat["idx"][2], stat["bin"][0], stat["bin"][2]]


def idx_modified_ns(stat: dict[str, list[int]]) -> int:
    """The ``.idx``'s modification time (ns) in a local :func:`corpus_stat`: what tells an
    ``.idx`` written in place (the same size and inode) from the one opened."""
    return stat["idx"][1]


def described_files(stat: dict[str, list[int]]) -> str:
    """A local :func:`corpus_stat` as its sizes and inodes, for messages."""
    idx_size, idx_inode, bin_size, bin_inode = sizes_and_inodes(stat)
    return (
        f".idx of {idx_size} bytes (inode {idx_inode}) and .bin of {bin_size} bytes "
        f"(inode {bin_inode})"
    )


def fingerprint_changes(old: dict, new: dict) -> list[str]:
    """What differs between two fingerprints, one ``"field: old -> new"`` line each."""
    return [
        f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
