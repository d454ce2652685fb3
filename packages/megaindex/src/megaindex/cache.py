"""The on-disk cache of index tables, shared with megatron-core.

A dataset's tables live in one directory as ``<md5>-<Class>-<split>-<table>.npy`` beside
``<md5>-<Class>-<split>-description.txt``, the md5 being that of the description: megatron-core's
names, so either implementation loads what the other built. What this module adds:

* Writes are atomic: each file is written under a temporary name and renamed into place, the
  description last. A build killed half way leaves no description, which both implementations
  read as "not cached", so the next build starts over.
* Two processes building the same tables do not corrupt them: each writes its own temporary
  files, the tables are deterministic so either rename gives the same bytes, and a process that
  finds the cache completed while it was building uses that one.
* A damaged cache (truncated or unreadable ``.npy``, a table of the wrong dtype or shape, a
  description that does not match) is detected and rebuilt with a warning naming the file.
* A sidecar ``<md5>-<Class>-<split>-megaindex.json`` records a fingerprint of the corpus, the
  table shapes and a checksum of each table. megatron-core's key holds the corpus path but
  nothing of its contents; the sidecar notices a corpus re-tokenized into the same path, and
  the checksums a table damaged inside its valid range (checked at load, at the speed the
  tables are read, for each table file that is not exactly the one saved: a write or a copy
  gives it another identity, until this machine verified it once: :mod:`megaindex.verified`;
  ``fast_cache_load`` and deferred mapping skip it, as they skip every check).
* Temporary files of builds that were killed (their process is gone) are removed by the next
  build of the same entry.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import logging
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy

from megafmt.atomic import (
    atomic_write,
    remove_quietly,
    remove_stale_partials_in,
    write_atomically,
)
from megafmt.fingerprint import checksum, file_identity, identity_of
from megafmt.folders import make_folder
from megafmt.limits import carrying_errno, limit_hint
from megafmt.mapping import map_file
from megafmt.redaction import redact
from megaindex import distributed
from megaindex.errors import CacheError, MegaindexError, StaleCacheError
from megaindex.file_writes import (
    CHECKSUMS_MARK,
    CorpusFiles,
    FileBytes,
    FileWrite,
    TablesJob,
    Written,
    current,
    held_bytes,
    write_files,
)
from megaindex.utils import is_count

logger = logging.getLogger(__name__)

SIDECAR_FORMAT = 1
#: tables (and corpora) smaller than this are written (and fingerprinted) on the calling
#: thread: a blend of thousands of small corpora would spend its time starting threads
SIDE_BY_SIDE_BYTES = 16 << 20
#: each cache folder's modification time when the last of this process's saves into it ended
#: with no other under way
_unchanged_since_save: dict[str, int | None] = {}
#: this process's saves under way in each cache folder (the builder's threads)
_saves_under_way: dict[str, int] = {}
_saves_lock = threading.Lock()


def _begin_save(directory: str) -> bool:
    """A save into ``directory`` begins; whether it should list the folder for the leftovers
    of killed builds: only when something else than this process's saves wrote there since the
    last of them, and none of them is under way (another thread's files, or this build's
    written in the background, change the folder between this one's saves, and every save
    would list the whole folder: a 2,400-corpus blend on 2 threads took 10 s instead of 5).
    Each is ended by :func:`_end_save` once its files are written."""
    with _saves_lock:  # decided before another save of this process can write there
        alone = not _saves_under_way.get(directory)
        list_leftovers = alone and _unchanged_since_save.get(directory) != _modified(directory)
        _saves_under_way[directory] = _saves_under_way.get(directory, 0) + 1
    return list_leftovers


def _end_save(directory: str) -> None:
    with _saves_lock:
        _saves_under_way[directory] -= 1
        if not _saves_under_way[directory]:
            del _saves_under_way[directory]
            _unchanged_since_save[directory] = _modified(directory)


def _after_fork_in_child() -> None:
    """A child forked during a save has none of its parent's saves under way, nor its lock."""
    global _saves_lock
    _saves_lock = threading.Lock()
    _saves_under_way.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _modified(directory: str) -> int | None:
    """The folder's modification time (None: it does not exist yet)."""
    try:
        return os.stat(directory).st_mtime_ns
    except OSError:
        return None


class DamagedCacheError(MegaindexError):
    """A cached table cannot be used as it is (internal: the cache is rebuilt)."""


#: errno values of a read that failed for want of something of the process's or the machine's
#: (descriptors, memory), not for anything wrong with the file
LIMITS_MET = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


def unreadable(path: str, error: OSError, what: str) -> MegaindexError:
    """The error of a cache file that could not be read (``what``: how it failed): damage,
    rebuilt, unless a limit was met (the open-files limit ...): that cache is sound, and
    withdrawing and rebuilding it (on global rank 0, under every other rank's reads) helps
    nothing, so the error names the file and the limit."""
    if error.errno in LIMITS_MET:
        refused = CacheError(
            f"{path}: cannot be read ({error.strerror}): {limit_hint(error, fewer=None)}. The "
            "cached file is left as it is"
        )
        return carrying_errno(refused, error)
    return DamagedCacheError(f"{path}: {what} ({error})")


class UnusableCopyError(CacheError):
    """A process that does not build found the cached tables damaged or gone: global rank 0
    should have built them (with a shared store, the node's copy is fetched again instead)."""


@dataclass(frozen=True)
class TableSpec:
    """What a cached table must look like: one of ``dtypes`` and exactly ``shape``."""

    dtypes: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CacheEntry:
    """The files of one dataset's cached tables."""

    directory: str
    base: str
    tables: tuple[str, ...]
    remote: str | None = None
    """The URL of a store shared by every node (:mod:`megaindex.shared_cache`), or None."""

    @classmethod
    def for_dataset(
        cls,
        directory: str,
        description_hash: str,
        class_name: str,
        split: str,
        tables: tuple[str, ...],
        remote: str | None = None,
    ) -> CacheEntry:
        """The entry of a dataset's tables in ``directory``, made absolute: a dataset pickled
        into a worker in another working directory maps the same files."""
        base = f"{description_hash}-{class_name}-{split}"
        return cls(os.path.abspath(directory), base, tables, remote)

    def path(self, affix: str) -> str:
        return os.path.join(self.directory, f"{self.base}-{affix}")

    @property
    def description_path(self) -> str:
        return self.path("description.txt")

    @property
    def sidecar_path(self) -> str:
        return self.path("megaindex.json")

    def table_path(self, table: str) -> str:
        return self.path(f"{table}.npy")

    def complete(self) -> bool:
        """Whether every file of the entry exists (megatron-core's test for a hit): the
        description first, the one a cold build lacks, each name made only when asked."""
        return os.path.isfile(self.description_path) and all(
            os.path.isfile(self.table_path(table)) for table in self.tables
        )


#: the start of a version 1.0 ``.npy`` file: its magic, its version, then the header's length
_NPY_V1_MAGIC = b"\x93NUMPY\x01\x00"
#: the header ``numpy.save`` writes for a plain array (a simple dtype, any shape)
_PLAIN_NPY_HEADER = re.compile(
    r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), "
    r"'shape': \(((?:\d+, ?)*\d*)\), \}[ ]*\n\Z"
)


def read_npy_header(stream: BinaryIO) -> tuple[tuple[int, ...], bool, numpy.dtype]:
    """The shape, Fortran order and dtype of the ``.npy`` file ``stream`` is at the start of;
    leaves ``stream`` at the first byte of the data.

    The header ``numpy.save`` writes for a table (version 1.0, a plain dtype) is read with one
    regular expression; any other goes through numpy's reader, which evaluates it as a Python
    literal (a tenth of a millisecond: a cache hit of thousands of corpora reads three each)."""
    start = stream.tell()
    prefix = stream.read(len(_NPY_V1_MAGIC) + 2)
    if prefix[: len(_NPY_V1_MAGIC)] == _NPY_V1_MAGIC and len(prefix) == len(_NPY_V1_MAGIC) + 2:
        header = stream.read(int.from_bytes(prefix[-2:], "little")).decode("latin1")
        plain = _PLAIN_NPY_HEADER.match(header)
        if plain is not None:
            shape = tuple(int(size) for size in re.findall(r"\d+", plain.group(3)))
            return shape, plain.group(2) == "True", numpy.dtype(plain.group(1))
    stream.seek(start)
    version = numpy.lib.format.read_magic(stream)
    if version == (1, 0):
        return numpy.lib.format.read_array_header_1_0(stream)
    return numpy.lib.format.read_array_header_2_0(stream)


def load_table(path: str, spec: TableSpec | None) -> numpy.ndarray:
    """A cached ``.npy`` table, mapped read-only, after checking its header, size and shape.

    The result is a plain ndarray over one read-only mapping that holds no descriptor:
    numpy.memmap's Python-level indexing costs microseconds per lookup, and ``__getitem__``
    makes several."""
    return load_table_and_identity(path, spec)[0]


def load_table_and_identity(path: str, spec: TableSpec | None) -> tuple[numpy.ndarray, list[int]]:
    """:func:`load_table`, and the identity (:func:`~megafmt.fingerprint.file_identity`) of the
    very file it mapped."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as error:
        raise unreadable(path, error, "unreadable") from error
    with stream:
        try:
            shape, fortran_order, dtype = read_npy_header(stream)
        except OSError as error:
            raise unreadable(path, error, "unreadable .npy header") from error
        except ValueError as error:
            raise DamagedCacheError(f"{path}: unreadable .npy header ({error})") from error
        data_start = stream.tell()
        status = os.fstat(stream.fileno())
        size = status.st_size
        count = math.prod(shape)
        expected = data_start + count * dtype.itemsize
        _check_table(path, spec, shape, fortran_order, dtype, size, expected)
        if count == 0:  # an empty region cannot be mapped
            return numpy.empty(shape, dtype=dtype), identity_of(status)
        try:
            data = map_file(path, stream.fileno(), size)
        except OSError as error:  # the process's mappings or memory, never the file's damage
            refused = CacheError(f"{error.strerror}; the cached file is left as it is")
            raise carrying_errno(refused, error) from error
    return data[data_start:].view(dtype).reshape(shape), identity_of(status)


def _check_table(
    path: str,
    spec: TableSpec | None,
    shape: tuple[int, ...],
    fortran_order: bool,
    dtype: numpy.dtype,
    size: int,
    expected_size: int,
) -> None:
    if size != expected_size:
        raise DamagedCacheError(
            f"{path}: {size} bytes, expected {expected_size} for a {dtype} array of shape "
            f"{shape} (truncated?)"
        )
    if dtype.hasobject:
        raise DamagedCacheError(f"{path}: holds Python objects ({dtype}), not an index table")
    if fortran_order:
        raise DamagedCacheError(f"{path}: a {dtype} array in Fortran order, not an index table")
    if spec is not None and (dtype.name not in spec.dtypes or tuple(shape) != spec.shape):
        raise DamagedCacheError(
            f"{path}: a {dtype.name} array of shape {tuple(shape)}, expected "
            f"{' or '.join(spec.dtypes)} of shape {spec.shape}"
        )


class MappedOnUse(Mapping[str, numpy.ndarray]):
    """The tables of a cache entry whose files need no check but their own header's: the very
    files saved (just now, or with the identity the sidecar recorded). Each is mapped when it
    is first read, after its header and size are checked against ``specs``, not before: a
    blend of thousands of corpora maps the tables of the corpora it reads, and a cache hit
    opens no table file. Shapes are answered from ``specs`` without mapping.

    A table file that no longer has the identity it had (another process rebuilt the entry
    since) is used only where its bytes have the checksum recorded for the one it replaced (the
    same tables, built again); otherwise reading it raises :class:`CacheError`."""

    def __init__(
        self,
        entry: CacheEntry,
        specs: Mapping[str, TableSpec],
        identities: Mapping[str, list[int]] | Callable[[], Mapping[str, list[int]]],
        checksums: Mapping[str, str] | Callable[[], Mapping[str, str]] | None,
    ) -> None:
        """``identities``: each table file's, or what gives them once the files are written
        (a save in a build's background, :mod:`megaindex.file_writes`); ``checksums`` the
        same (tables the writer built)."""
        self._entry = entry
        self._specs = dict(specs)
        self._identities = identities
        self._checksums = checksums if callable(checksums) else dict(checksums or {})
        self._mapped: dict[str, numpy.ndarray] = {}

    def __getitem__(self, name: str) -> numpy.ndarray:
        table = self._mapped.get(name)
        if table is None:
            if name not in self._entry.tables:
                raise KeyError(name)
            table = self._mapped[name] = self._map(name)
        return table

    def _map(self, name: str) -> numpy.ndarray:
        path = self._entry.table_path(name)
        if callable(self._identities):  # saved in a build's background: written first
            try:
                self._identities = dict(self._identities())
            except OSError as error:
                raise CacheError(f"{path}: the index cache was not written ({error})") from error
            if callable(self._checksums):
                self._checksums = dict(self._checksums())
        try:
            table, identity = load_table_and_identity(path, self._specs.get(name))
        except DamagedCacheError as error:  # gone, or another file: not what was loaded
            raise CacheError(f"{error}: the index cache changed after it was loaded") from None
        recorded = self._identities.get(name)
        if recorded is None or identity == recorded:
            return table
        expected = self._checksums.get(name)
        if expected is None or table_checksums({name: table})[name] != expected:
            raise CacheError(
                f"{path}: replaced with other tables after this dataset loaded the cache "
                "(another process rebuilt it, from other data or settings); build the "
                "datasets again"
            )
        return table

    def __iter__(self) -> Iterator[str]:
        return iter(self._entry.tables)

    def __len__(self) -> int:
        return len(self._entry.tables)

    def shape(self, name: str) -> tuple[int, ...]:
        """Table ``name``'s shape, mapping it only where no spec gives it."""
        spec = self._specs.get(name)
        return spec.shape if spec is not None else self[name].shape


def read_sidecar(path: str) -> dict[str, Any] | None:
    """The sidecar at ``path``, or None when there is none (a cache megatron-core built) or it
    is of another format (a later megaindex's). One that cannot be read, is not JSON, or holds
    a field of the wrong kind is a :class:`DamagedCacheError` naming the file and the field:
    the entry is rebuilt (its tables were checked by this sidecar: without it, only their
    shapes would be)."""
    try:
        with open(path, "rb") as stream:  # bytes: a text stream doubles the cost of a hit's read
            sidecar = json.loads(stream.read())
    except FileNotFoundError:
        return None
    except OSError as error:
        raise unreadable(path, error, "the sidecar cannot be read") from None
    except ValueError as error:
        raise DamagedCacheError(f"{path}: the sidecar cannot be read ({error})") from None
    if not isinstance(sidecar, dict):
        raise DamagedCacheError(
            f"{path}: the sidecar is a JSON {type(sidecar).__name__}, not an object"
        )
    if sidecar.get("format") != SIDECAR_FORMAT:
        return None
    for key, (allowed, test) in _SIDECAR_FIELDS.items():
        if key in sidecar and not test(sidecar[key]):
            raise DamagedCacheError(
                f"{path}: the sidecar's {key!r} is {sidecar[key]!r:.200}; expected {allowed}"
            )
    return sidecar


def _mapping_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, dict) and all(map(test, value.values()))


def _is_spec(spec: Any) -> bool:
    return (
        isinstance(spec, dict)
        and isinstance(spec.get("dtype"), str)
        and isinstance(spec.get("shape"), list)
        and all(map(is_count, spec["shape"]))
    )


#: what each field of a sidecar this version writes must hold, where present
_SIDECAR_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "tables": ("a mapping of table to its dtype and shape", _mapping_of(_is_spec)),
    "checksums": (
        "a mapping of table to its CRC-32 (hex)",
        _mapping_of(lambda v: isinstance(v, str)),
    ),
    "table_files": (
        "a mapping of table to its file's identity (integers)",
        _mapping_of(lambda v: isinstance(v, list) and all(isinstance(n, int) for n in v)),
    ),
    "corpus": ("a mapping or null", lambda v: v is None or isinstance(v, dict)),
    "corpus_stat": ("a mapping or null", lambda v: v is None or isinstance(v, dict)),
    "config": ("a mapping or null", lambda v: v is None or isinstance(v, dict)),
    "plan": ("a mapping or null", lambda v: v is None or isinstance(v, dict)),
}


class IndexCache:
    """Reads and writes the tables of one cache entry."""

    def __init__(self, entry: CacheEntry, description: str) -> None:
        self.entry = entry
        self.description = description

    def read_sidecar(self) -> dict[str, Any] | None:
        """The sidecar of the entry, or None (a cache megatron-core built has none)."""
        return read_sidecar(self.entry.sidecar_path)

    def load(
        self, specs: Mapping[str, TableSpec] | None, check: bool = True
    ) -> dict[str, numpy.ndarray]:
        """The tables, checked against ``specs`` and the description unless ``check`` is off.

        Raises :class:`DamagedCacheError` naming the file at fault.
        """
        if check:
            self.check_description()
        return {
            table: load_table(
                self.entry.table_path(table), specs.get(table) if check and specs else None
            )
            for table in self.entry.tables
        }

    def check_description(self) -> None:
        """Raise :class:`DamagedCacheError` unless the entry's description is this dataset's."""
        try:
            with open(self.entry.description_path, "rb") as stream:
                found = stream.read()
        except OSError as error:
            raise unreadable(self.entry.description_path, error, "unreadable") from error
        if found != self.description.encode("utf-8"):
            raise DamagedCacheError(
                f"{self.entry.description_path}: the description does not match this dataset's"
            )

    def map_on_use(self, sidecar: Mapping[str, Any]) -> MappedOnUse:
        """The tables of files known to hold what ``sidecar`` recorded (the very files saved,
        or ones verified), after the description's check: each mapped when first read
        (:class:`MappedOnUse`), if it is still the file it is now."""
        self.check_description()
        entry = self.entry
        try:
            now = {table: file_identity(entry.table_path(table)) for table in entry.tables}
        except OSError as error:
            raise DamagedCacheError(f"{error.filename}: {error.strerror}") from error
        return MappedOnUse(entry, specs_from_sidecar(sidecar), now, sidecar.get("checksums"))

    def save(
        self,
        tables: Mapping[str, numpy.ndarray],
        sidecar: dict[str, Any] | None,
        background: bool = True,
    ) -> Callable[[], dict[str, list[int]]]:
        """Write the tables, then the sidecar (if any), then the description (the commit mark);
        returns what gives the identity (:func:`~megafmt.fingerprint.file_identity`) of each
        table file. Small tables are written by :mod:`megaindex.file_writes`: in a build's
        background where ``background`` (the identities wait for them), else at once."""
        entry = self.entry
        with self._saving() as hand_over:
            if sum(tables[t].nbytes for t in entry.tables) >= SIDE_BY_SIDE_BYTES:
                return self._write_large(tables, sidecar)
            files = self._small_files([_npy_file(tables[t]) for t in entry.tables], sidecar)
            hand_over()
            written = self._write_small(files, background)
        # the sidecar's and the description's identities follow the tables'
        return lambda: dict(zip(entry.tables, written.identities(), strict=False))

    def save_built_by_writer(
        self,
        job: TablesJob,
        specs: Mapping[str, TableSpec],
        sidecar: dict[str, Any],
        mend: Callable[[OSError, Callable[[OSError], Exception]], Exception | None],
    ) -> Written:
        """Write the tables of ``specs`` that ``job`` builds, then ``sidecar`` with their
        checksums, then the description, all in the build's background
        (:class:`~megaindex.file_writes.TablesJob`: the tables are built by the writer). A
        failure is ``mend(error, worded)``'s (None: mended), ``worded`` giving the cache's
        own wording of it."""
        heads = [
            _npy_header(numpy.dtype(specs[t].dtypes[0]), specs[t].shape) for t in self.entry.tables
        ]
        with self._saving() as hand_over:
            files = self._small_files(heads, {**sidecar, "checksums": CHECKSUMS_MARK})
            hand_over()
            return self._write_small(files, True, job, mend)

    @contextlib.contextmanager
    def _saving(self) -> Iterator[Callable[[], None]]:
        """A save into the entry's folder (made, its leftovers of killed builds removed):
        ended when the block ends, unless the block hands it over (the call it gives) to a
        write that ends it once written. A write's OSError is worded by :func:`write_error`."""
        directory = self.entry.directory
        handed_over = []  # whether a write ends the save (when it is finished)
        list_leftovers = _begin_save(directory)
        try:
            make_folder(directory, "the index cache folder")
            # a folder nobody wrote to since this process's last save here holds no new
            # leftovers: listing it for every entry of a large blend is quadratic in its size
            if list_leftovers:  # every entry's: those of entries not saved again stayed
                for leftover in remove_stale_partials_in(directory):
                    logger.info("removed %s, left by a build that was killed", leftover)
            yield lambda: handed_over.append(True)
        except CacheError:  # an OSError too, worded already (a corpus changed meanwhile)
            raise
        except OSError as error:
            raise write_error(self.entry, error) from error
        finally:
            if not handed_over:
                _end_save(directory)

    def _small_files(
        self, tables: list[bytes | FileBytes], sidecar: dict[str, Any] | None
    ) -> list[FileWrite]:
        """Small tables (each ``.npy`` file's bytes, in the entry's order), each in one write,
        then the sidecar (which records the table files' identities, taken as they are
        written; its ``checksums`` may be :data:`~megaindex.file_writes.CHECKSUMS_MARK`, for
        the writer to fill), then the description."""
        entry = self.entry
        pairs = zip(entry.tables, tables, strict=True)
        files = [FileWrite(entry.table_path(t), data) for t, data in pairs]
        if sidecar is not None:
            # one line: json writes an indented text item by item in Python, a tenth of the
            # cold build of a blend of thousands of small corpora
            corpus = sidecar.get("corpus")
            in_write = isinstance(corpus, CorpusFiles)  # fingerprinted by the writer
            marked = sidecar.get("checksums") is CHECKSUMS_MARK  # taken by the writer
            sidecar = {
                key: value
                for key, value in sidecar.items()
                if not ((key == "corpus" and in_write) or (key == "checksums" and marked))
            }
            text = json.dumps({"format": SIDECAR_FORMAT, **sidecar})[:-1].encode()
            if marked:
                text += b', "checksums": ' + CHECKSUMS_MARK
            files.append(
                FileWrite(
                    entry.sidecar_path,
                    text + (b', "corpus": ' if in_write else b', "table_files": '),
                    tuple((json.dumps(t), n) for n, t in enumerate(entry.tables)),
                    "}",
                    corpus if in_write else None,
                    ', "table_files": ' if in_write else "",
                )
            )
        files.append(
            FileWrite(entry.description_path, self.description.encode("utf-8"), commit_mark=True)
        )
        return files

    def _write_small(
        self,
        files: list[FileWrite],
        background: bool,
        job: TablesJob | None = None,
        mend: Callable[[OSError, Callable[[OSError], Exception]], Exception | None] | None = None,
    ) -> Written:
        """Write :meth:`_small_files` (in a build's background where there is one and
        ``background``; ``job``: its tables built by the writer first, a failure ``mend``ed);
        ends the save when they are written."""
        entry = self.entry
        directory = entry.directory

        def done() -> None:
            _end_save(directory)
            logger.info("saved %s tables to %s", entry.base, directory)

        # the corpus the writer reads for the sidecar's fingerprint, and its files
        corpus = next((f.corpus for f in files if f.corpus), None)
        corpus_files = set() if corpus is None else set(corpus.paths())

        def error_of(error: OSError) -> CacheError:
            if error.filename is None or os.fsdecode(error.filename) not in corpus_files:
                return write_error(entry, error)
            if error.errno == errno.ESTALE:  # not the files opened (CorpusFiles.opened)
                try:
                    corpus.check_as_opened()  # the error naming what was opened, what is there
                except CacheError as changed:
                    return changed
            cause = limit_hint(error, fewer=None) if error.errno in LIMITS_MET else ""
            refused = CacheError(
                f"{os.fsdecode(error.filename)}: cannot be read to fingerprint its corpus for "
                f"the index cache in {directory}: {error.strerror} ("
                + (cause or "the corpus changed or went away while its index was built")
                + ")"
            )
            return carrying_errno(refused, error)

        return write_files(
            files,
            done,
            error_of if mend is None else lambda error: mend(error, error_of),
            # a shared store uploads the files right after
            background=background and entry.remote is None,
            tables=job,
        )

    def _write_large(
        self, tables: Mapping[str, numpy.ndarray], sidecar: dict[str, Any] | None
    ) -> Callable[[], dict[str, list[int]]]:
        """Large tables side by side: numpy writes without the GIL (a 7B run's tables are
        1.4 GB); then the sidecar and the description."""
        entry = self.entry
        with ThreadPoolExecutor(max(1, len(entry.tables))) as pool:
            written = pool.map(lambda table: self._write_table(table, tables[table]), entry.tables)
            # the identity of each table file now in place, where it is still this one's
            stats = {
                t: _identity_if_written(entry.table_path(t), own)
                for t, own in zip(entry.tables, written, strict=True)
            }
        if sidecar is not None and isinstance(sidecar.get("corpus"), CorpusFiles):
            sidecar = {**sidecar, "corpus": sidecar["corpus"].fingerprint()}
        if sidecar is not None:
            text = json.dumps({"format": SIDECAR_FORMAT, **sidecar, "table_files": stats})
            write_atomically(entry.sidecar_path, text.encode())
        write_atomically(entry.description_path, self.description.encode("utf-8"))
        logger.info("saved %s tables to %s", entry.base, entry.directory)
        return lambda: stats

    def _write_table(self, table: str, array: numpy.ndarray) -> os.stat_result:
        """Write one table; the status of the file written (taken before its rename)."""
        with atomic_write(self.entry.table_path(table)) as stream:
            numpy.save(stream, array, allow_pickle=False)
            stream.flush()
            return os.fstat(stream.fileno())


def _identity_if_written(path: str, written: os.stat_result) -> list[int]:
    """The identity of the file at ``path`` when it is the one ``written`` (same inode), else
    that of the one written: another process renamed its own over it since, and a reader is
    to check that one by its checksum rather than take it for this one."""
    found = os.stat(path)
    ours = (found.st_ino, found.st_dev) == (written.st_ino, written.st_dev)
    return identity_of(found if ours else written)


def write_error(entry: CacheEntry, error: OSError) -> CacheError:
    """``error``, met writing ``entry``'s folder, with what to do about its cause: the setting
    that moves the folder is ``object_storage_cache_path`` for the node's copy of a shared
    store's tables, else ``path_to_cache``."""
    if entry.remote is None:
        what, setting = "the index cache", "path_to_cache (--data-cache-path)"
    else:
        what = f"the local copy of the shared index cache {redact(entry.remote)}"
        setting = "object_storage_cache_path (--object-storage-cache-path)"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = (
            "By default the cache sits beside the data (<prefix>/cache), which is often "
            f"read-only: set {setting} to a writable directory"
            if entry.remote is None
            else f"Set {setting} to a writable directory"
        )
    elif error.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = f"The disk is full: free space there, or set {setting} to another disk"
    elif error.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
        advice = (
            "Something is in the way of a cache file (a folder where a file belongs, or a file "
            f"where a folder does): move it away, or set {setting} to another directory"
        )
    elif error.errno in LIMITS_MET:
        hint = limit_hint(error, fewer=None)
        advice = hint[:1].upper() + hint[1:]
    elif error.errno == errno.ENOENT:
        advice = (
            "The folder, or files in it, went away while the build ran (removed, or a cleanup "
            "of the cache): build again, and keep cleanups off the cache while builds run"
        )
    else:
        advice = f"Where the folder is the cause, set {setting} to a writable directory"
    refused = CacheError(f"cannot write {what} to {entry.directory}: {error}. {advice}")
    return carrying_errno(refused, error)


#: the ``.npy`` header numpy writes for a dtype and shape, by the dtype and the number of
#: digits of each dimension (the header's padding depends on nothing else): the header of a
#: shape with the same digits, and that shape's text in it
_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], tuple[str, str]] = {}


def _npy_header(dtype: numpy.dtype, shape: tuple[int, ...]) -> bytes:
    """The header ``numpy.save`` writes before a C-ordered array of ``dtype`` and ``shape``:
    numpy's own (``write_array_header_1_0``, the version it picks for a table's short header),
    for a shape with as many digits in each dimension, with the shape's text replaced."""
    key = (dtype.str, tuple(len(str(size)) for size in shape))
    known = _NPY_HEADERS.get(key)
    if known is None:
        probe = tuple(10 ** (digits - 1) for digits in key[1])
        buffer = io.BytesIO()
        header = {
            "descr": numpy.lib.format.dtype_to_descr(dtype),
            "fortran_order": False,
            "shape": probe,
        }
        numpy.lib.format.write_array_header_1_0(buffer, header)
        known = _NPY_HEADERS[key] = (buffer.getvalue().decode("latin1"), f"'shape': {probe!r}")
    header, probe_text = known
    return header.replace(probe_text, f"'shape': {shape!r}", 1).encode("latin1")


def _npy_file(array: numpy.ndarray) -> bytes | FileBytes:
    """The bytes of ``array``'s ``.npy`` file, as ``numpy.save`` writes them: a C-ordered
    array's copied once, into memory the cache's writer takes as it is
    (:func:`~megaindex.file_writes.held_bytes`)."""
    if array.flags.c_contiguous and not array.dtype.hasobject and array.dtype.names is None:
        return held_bytes(_npy_header(array.dtype, array.shape), array)
    buffer = io.BytesIO()
    numpy.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@functools.cache
def dtype_name(dtype: numpy.dtype | type) -> str:
    """numpy's name of a dtype (or scalar type), looked up once: ``dtype.name`` is Python code
    of 2 us, asked several times per dataset of a blend of thousands."""
    return numpy.dtype(dtype).name


def table_specs(tables: Mapping[str, numpy.ndarray]) -> dict[str, dict[str, Any]]:
    """The dtype and shape of each table, as recorded in the sidecar."""
    return recorded_specs(specs_of(tables))


def recorded_specs(specs: Mapping[str, TableSpec]) -> dict[str, dict[str, Any]]:
    """Table specs (one dtype each) as the sidecar records them."""
    return {
        name: {"dtype": spec.dtypes[0], "shape": list(spec.shape)} for name, spec in specs.items()
    }


def table_checksums(tables: Mapping[str, numpy.ndarray]) -> dict[str, str]:
    """The CRC-32 of each table's bytes, as recorded in the sidecar."""
    return {
        name: f"{checksum(numpy.ascontiguousarray(table)):08x}" for name, table in tables.items()
    }


def changed_tables(entry: CacheEntry, sidecar: Mapping[str, Any]) -> list[str]:
    """The tables with a recorded checksum whose file is not exactly the one saved (another
    inode, size, modification or change time: a copy, or written to since)."""
    recorded, saved_files = sidecar.get("checksums", {}), sidecar.get("table_files", {})
    return [
        name
        for name in entry.tables
        if name in recorded and saved_files.get(name) != file_identity(entry.table_path(name))
    ]


def check_checksums(
    entry: CacheEntry, tables: Mapping[str, numpy.ndarray], sidecar: Mapping[str, Any]
) -> None:
    """Raise :class:`DamagedCacheError` naming the first table whose bytes no longer have the
    checksum the sidecar recorded when it was saved. A table file that is exactly the one saved
    (:func:`changed_tables`: nothing wrote to it since) is not read."""
    recorded = sidecar.get("checksums", {})
    changed = {name: tables[name] for name in changed_tables(entry, sidecar) if name in tables}
    for name, found in table_checksums(changed).items():
        if found != recorded[name]:
            raise DamagedCacheError(
                f"{entry.table_path(name)}: checksum {found}, but {entry.sidecar_path} "
                f"recorded {recorded[name]} when it was saved: the table changed since"
            )


def specs_of(tables: Mapping[str, numpy.ndarray]) -> dict[str, TableSpec]:
    """The dtype and shape of each of ``tables``, as specs their files must match."""
    return {name: TableSpec((dtype_name(a.dtype),), tuple(a.shape)) for name, a in tables.items()}


def specs_from_sidecar(sidecar: Mapping[str, Any]) -> dict[str, TableSpec]:
    """The table specs recorded in a sidecar."""
    return {
        name: TableSpec((spec["dtype"],), tuple(spec["shape"]))
        for name, spec in sidecar.get("tables", {}).items()
    }


def _uncommit(entry: CacheEntry, damage: Exception) -> None:
    """Remove the commit mark (the description) of an entry found ``damage``d, before it is
    rewritten file by file: a run killed midway then leaves no mix of old and new tables that a
    later one (or megatron-core, or fast_cache_load) takes for complete. A folder that takes no
    change (read-only) is a :class:`CacheError` naming both."""
    try:
        remove_quietly(entry.description_path)
    except OSError as error:
        raise CacheError(f"{damage}; it cannot be rebuilt: {write_error(entry, error)}") from error


def load_or_build(
    cache: IndexCache,
    load: Callable[[], Mapping[str, numpy.ndarray]],
    build: Callable[[], dict[str, numpy.ndarray]],
    sidecar: Callable[[dict[str, numpy.ndarray]], dict[str, Any] | None],
    seconds: dict[str, float],
    built_by_writer: Callable[[], Mapping[str, numpy.ndarray] | None] = lambda: None,
) -> tuple[Mapping[str, numpy.ndarray], str]:
    """The tables of ``cache``: loaded (``load`` checks them) or built, saved, and returned.
    ``built_by_writer``: the tables handed to the build's background writes to build and save
    (mapped when first read), where it can (else None: built here).

    Returns the tables (built ones as the files just saved, mapped when first read) and
    ``"cache"`` or ``"built"``. Only global rank 0 (or a process on its own) builds; other
    ranks load what rank 0 saved before the builder's barrier. A damaged or stale cache is
    rebuilt with a warning; a cache completed by another process while this one was building
    is used instead of this one's copy. ``seconds`` receives the save time.
    """
    builds_here = distributed.builds_shared_files()
    rank = distributed.global_rank()
    writes = current()
    if writes is not None:  # the same entry saved in this build's background: wait for it
        writes.wait_for(cache.entry.description_path)
    if cache.entry.complete():
        try:
            return load(), "cache"
        except DamagedCacheError as damage:
            if not builds_here:
                raise UnusableCopyError(
                    f"rank {rank}: {damage}; global rank 0 should have rebuilt it before the "
                    "others load it"
                ) from None
            _uncommit(cache.entry, damage)  # before the build: a folder that takes no file
            # fails here, not after it
            warnings.warn(f"rebuilding the index cache: {damage}", stacklevel=3)
    elif not builds_here:
        raise UnusableCopyError(
            f"rank {rank} found no complete index cache at {cache.entry.description_path}: "
            "global rank 0 builds it before the other ranks load it (do all ranks call the "
            "dataset builder?)"
        )
    handed = built_by_writer()
    if handed is not None:
        return handed, "built"
    tables = build()
    if cache.entry.complete():  # another process finished the same cache meanwhile
        try:
            return load(), "cache"
        except (DamagedCacheError, StaleCacheError) as damage:
            _uncommit(cache.entry, damage)
    start = time.perf_counter()
    record = sidecar(tables)
    identities = cache.save(tables, record)
    seconds["save"] = time.perf_counter() - start
    # the saved files serve from here on, mapped as a load maps them when first read: their
    # pages belong to the page cache (shared with every process that opens the cache), and
    # this process gives the built copies back (a 7B run's tables are 1.4 GB) before it builds
    # the next split
    # what a file rebuilt the same (another process's save over this one's) is checked against
    checksums = table_checksums(tables) if record is None else record["checksums"]
    return MappedOnUse(cache.entry, specs_of(tables), identities, checksums), "built"
