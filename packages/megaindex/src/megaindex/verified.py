"""Index caches this machine verified in full, remembered so that opening one again costs stats.

A cache whose files are not the very ones its sidecar recorded at the save (a cache copied or
moved here, a corpus copied to this machine's disk) is verified in full at load: a CRC-32 of
every table's bytes and of the whole ``.idx`` (:mod:`megaindex.cache`, :mod:`megaindex.tables`).
At 146M documents that is 0.6 GB of tables and a 2.9 GB ``.idx``, read again by every process
that opens the cache, at every start. Once a cache passed, the identity of each file that was
verified (the sidecar, the tables and the corpus's two files: size, modification and change
times, inode and device, megafmt's ``file_identity``) is noted under megafmt's cache folder
(``verified/``, per machine and user, as megafmt notes the corpora that passed their
consistency check), and later loads skip those two checks while every identity is the same.
Processes that load an unnoted cache at once (the ranks of a node) verify it one at a time,
under megafmt's lock beside the note: the first reads and notes, the others find the note.

What stays caught: any write to one of these files changes its change time, which no one can
set back, so a table damaged or a corpus re-tokenized after the note no longer matches it and
is verified in full on its next load, exactly as without the note. Files changed within the
last second are not noted (a write in the same tick of the file system's clock could keep the
change time). The settings, the description and each table's dtype and shape are still compared
at every load (they cost no read of the data). A corpus in object storage has no such identity:
its fingerprint (the store's ETags) reads nothing, and is always compared.
"""

from __future__ import annotations

from typing import Any

from megafmt import get_bin_path, get_idx_path
from megafmt.checked import remember_checked, was_checked
from megafmt.fingerprint import CHANGE_TIME, file_identity
from megafmt.readers import is_url
from megaindex.cache import CacheEntry

#: megafmt's cache folder holds the notes in this folder
NOTES = "verified"


def cache_identity(entry: CacheEntry, corpus: str | None) -> dict[str, Any] | None:
    """The identities of the files a full verification of ``entry`` reads; None where there is
    nothing to note: a corpus in object storage, or a file gone (the load reports it)."""
    if corpus is not None and is_url(corpus):
        return None
    paths = {"sidecar": entry.sidecar_path}
    paths.update({table: entry.table_path(table) for table in entry.tables})
    if corpus is not None:
        paths.update({"idx": get_idx_path(corpus), "bin": get_bin_path(corpus)})
    try:
        return {name: file_identity(path) for name, path in paths.items()}
    except OSError:
        return None


def was_verified(entry: CacheEntry, identity: dict[str, Any] | None) -> bool:
    """Whether this machine verified ``entry`` in full with exactly these files."""
    return identity is not None and was_checked(entry.sidecar_path, identity, NOTES)


def remember_verified(entry: CacheEntry, identity: dict[str, Any] | None, taken_ns: int) -> None:
    """Note that ``entry`` passed its full verification with these files (none changed within
    a second before ``taken_ns``, when their identities were taken)."""
    if identity is not None:
        newest = max(found[CHANGE_TIME] for found in identity.values())
        remember_checked(entry.sidecar_path, identity, newest, taken_ns, NOTES)
