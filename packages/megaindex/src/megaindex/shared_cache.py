"""Index tables shared through object storage: one build in the whole job, one download per node.

Set ``path_to_cache`` (``--data-cache-path``) to an fsspec URL (``s3://bucket/cache``,
``memory://...``, any file system fsspec knows) and the tables are kept there, under the same
file names as a local cache (``<md5>-<Class>-<split>-<table>.npy``, the description last), with
a local copy on every node, under ``object_storage_cache_path`` (the seed's local folder for
what comes from object storage; megafmt's cache folder when unset) at a path made of the URL.
Every process that needs a dataset's tables then:

1. maps the local copy when the node has it complete (nothing is sent; a process that may
   build first makes sure the store holds it too, by its listing, else a GET of the
   description, and uploads it under a lease, step 4, where the store does not: a run killed
   during its upload would otherwise leave the other nodes waiting for it; a process that may
   not build and finds the copy damaged fetches it again, once). A process that may build and
   rebuilds a copy it found stale (its corpus re-tokenized at the same path) or damaged
   replaces the store's copy with it under a lease, the store's description removed first:
   the description names the config, not the corpus's content, so the old one would
   otherwise serve the other nodes tables that no longer fit the corpus;
2. else takes the node's lock (``<base>-node.lock`` beside the local copy, ``flock``: released
   by the kernel when its holder dies), so that one process per node talks to the store while
   the others wait, and finds the copy that process made;
3. downloads the tables when the store holds them (the description is uploaded last and is the
   commit mark), compares the description with its own, and loads them through the usual
   checks (dtype, shape, the sidecar's checksums: a downloaded file is never the one saved).
   Which entries the store holds complete, and each object's size, come from one listing of
   the store per process (a LIST, taken when the process first needs an object); an entry
   committed after it is found by a GET of its description. The entry's objects are then
   fetched at once, ``FETCH_THREADS`` at a time, each with one GET into a temporary file,
   checked against the listed size and renamed into place, the description last;
4. else, where it may build (global rank 0, or a process on its own), claims the build with a
   lease object created by a conditional put (``<base>-lease-<n>.json``, refused when it
   exists): the one process that creates it builds, saves locally, uploads the tables, then
   the description, and removes the lease. While it builds, a thread rewrites the lease every
   ``heartbeat_seconds``.
5. A process that finds a lease watches it: a lease whose content has not changed for
   ``lease_seconds`` (measured on the watcher's own clock, so clocks of different nodes need
   not agree) belongs to a build that died; the watcher claims the next lease (again a
   conditional put: one winner) and builds again. After ``max_builds`` leases died the error
   names the store and the last holder, instead of waiting forever; a watcher that may not
   build waits two more ``lease_seconds`` for a process that may to claim the next lease, then
   fails naming the dead lease (a failed job's, left behind). A build that fails with an error
   (a damaged corpus, a full disk; not an interrupt) writes the error into its lease before it
   raises: a watcher that may build claims the next lease at once; one that may not waits one
   lease time for that claim (the failure may be another job's), then fails quoting the error
   (the ``max_builds``-th lease failed: every watcher fails at once).
   A process that gives up notes its error beside the node's lock
   (``<base>-node-verdict.json``, with the lease it saw): the node's next processes, which
   took the lock after it, fail with that error at once while the lease is unchanged, instead
   of each waiting as long again.
   While it waits, a process logs every ``message_seconds`` what it waits for: the object, its
   holder and its last heartbeat.

``requests_sent`` counts the requests this process sent to stores, by kind (a listing counts
once, however many pages the store answers it in).
"""

from __future__ import annotations

import collections
import errno
import fcntl
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from megafmt import MegafmtError
from megafmt.atomic import partial_path, remove_quietly, write_atomically, write_exclusively
from megafmt.confinement import confined_path, url_components
from megafmt.fingerprint import inode_of
from megafmt.folders import make_folder
from megafmt.readers import is_url
from megafmt.redaction import redact
from megafmt.remote import default_cache_dir
from megaindex.cache import CacheEntry, UnusableCopyError, write_error
from megaindex.errors import CacheError

logger = logging.getLogger(__name__)

#: environment variables that override :class:`SharedCacheConfig`'s defaults
LEASE_SECONDS_VARIABLE = "MEGAINDEX_SHARED_CACHE_LEASE_SECONDS"
#: objects of one entry fetched at once (its tables, sidecar and description)
FETCH_THREADS = 8
#: requests sent to shared caches by this process, by kind (list, exists, get, put, create,
#: remove)
requests_sent: collections.Counter[str] = collections.Counter()
#: the first wait for the node's lock, in seconds; each next one is twice as long, up to the
#: config's ``poll_seconds`` (a process of the node fetches the entry meanwhile, usually within
#: milliseconds)
FIRST_LOCK_PAUSE = 0.001

Result = TypeVar("Result")

_counting = threading.Lock()
#: each store's listing, taken once per process (by URL), and the lock of taking it
_listings: dict[str, dict[str, int]] = {}
_listing = threading.Lock()


def _count(kind: str) -> None:
    with _counting:  # the entry's objects are fetched on several threads
        requests_sent[kind] += 1


class SharedCacheError(CacheError):
    """The shared cache cannot provide a dataset's tables (the message names the store)."""


def _worded(error: BaseException) -> str:
    """``error`` and its causes as one line, naming each type: a timeout of fsspec's reads
    has an empty message, its cause the URL and the wait."""
    words = []
    seen: BaseException | None = error
    while seen is not None and len(words) < 4:
        words.append(f"{type(seen).__name__}: {seen}".rstrip(": "))
        seen = seen.__cause__ or seen.__context__
    return "; from ".join(words)


class _Transfers:
    """The transfers and requests under way in this process, and one thread that logs of each,
    every ``message_seconds``, that it is still under way: a stalled one (an endpoint gone
    quiet) would otherwise hold the build silently until the file system's own timeout. One
    thread for all: a thread per transfer would cost more than a small table's download. It
    ends once no transfer was under way for a while, and a forked child starts afresh."""

    #: how often the thread looks at the transfers, and how long it waits idle before ending
    POLL_SECONDS = 0.5
    IDLE_SECONDS = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._under_way: dict[object, list[Any]] = {}
        self._running = False

    @contextmanager
    def watched(self, what: str, every: float) -> Iterator[None]:
        """The block, said to be ``what`` every ``every`` seconds while it runs."""
        key, start = object(), time.monotonic()
        with self._lock:
            self._under_way[key] = [what, start, start + every, every]
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._watch, name="megaindex-transfers", daemon=True
                ).start()
        try:
            yield
        finally:
            with self._lock:
                del self._under_way[key]

    def _watch(self) -> None:
        # a pause of its own, not time.sleep: a test's stand-in for that would spin this thread
        idle_since, tick = None, threading.Event()
        while True:
            tick.wait(self.POLL_SECONDS)
            now, due = time.monotonic(), []
            with self._lock:
                if not self._under_way:
                    idle_since = idle_since or now
                    if now - idle_since >= self.IDLE_SECONDS:
                        self._running = False
                        return
                    continue
                idle_since = None
                for transfer in self._under_way.values():
                    what, start, next_message, every = transfer
                    if now >= next_message:
                        transfer[2] = now + every
                        due.append((what, now - start))
            for what, seconds in due:
                logger.warning("still %s, for %.0f s", what, seconds)

    def forked(self) -> None:
        """In a forked child: none of the parent's transfers, and no thread yet."""
        self._lock = threading.Lock()
        self._under_way.clear()
        self._running = False


_transfers = _Transfers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_transfers.forked)


@dataclass(frozen=True)
class SharedCacheConfig:
    """How processes share one store's tables."""

    url: str
    """The folder of the shared tables (an fsspec URL)."""
    lease_seconds: float = 60.0
    """A lease unchanged for this long belongs to a build that died."""
    heartbeat_seconds: float | None = None
    """How often the builder rewrites its lease (None: a quarter of ``lease_seconds``)."""
    max_builds: int = 2
    """Builds started at most for one table (the first and one redo)."""
    poll_seconds: float = 0.2
    """How often a waiting process looks at the store."""
    message_seconds: float = 10.0
    """How often a waiting process logs what it waits for."""

    def __post_init__(self) -> None:
        if not 0 < self.lease_seconds < math.inf:
            raise CacheError(
                f"lease_seconds must be a number of seconds above 0, got {self.lease_seconds}"
            )
        if self.heartbeat_seconds is not None and not (
            0 < self.heartbeat_seconds < self.lease_seconds
        ):
            raise CacheError(
                f"heartbeat_seconds must be above 0 and below lease_seconds "
                f"({self.lease_seconds:g}: a lease unchanged that long is declared dead), got "
                f"{self.heartbeat_seconds}"
            )
        if self.max_builds < 1:
            raise CacheError(f"max_builds must be at least 1, got {self.max_builds}")

    @property
    def heartbeat(self) -> float:
        return self.heartbeat_seconds or self.lease_seconds / 4

    @classmethod
    def from_environment(cls, url: str) -> SharedCacheConfig:
        """The defaults, with ``MEGAINDEX_SHARED_CACHE_LEASE_SECONDS`` when it is set."""
        text = os.environ.get(LEASE_SECONDS_VARIABLE)
        if text is None:
            return cls(url)
        try:
            return cls(url, lease_seconds=float(text))
        except (ValueError, CacheError):
            raise CacheError(
                f"{LEASE_SECONDS_VARIABLE}={text!r}: expected a finite number of seconds above 0"
            ) from None


def cache_location(
    path_to_cache: str | None, object_storage_cache_path: str | None
) -> tuple[str | None, str | None]:
    """The local folder of a dataset's tables and the URL of the shared store (None: none).

    A URL ``path_to_cache`` is the shared store; its local copy lies under
    ``object_storage_cache_path`` (else megafmt's cache folder), at a path made of the URL's
    scheme, host and key."""
    if path_to_cache is None or not is_url(path_to_cache):
        return path_to_cache, None
    root = object_storage_cache_path or default_cache_dir()
    return confined_path(root, "tables", *url_components(path_to_cache)), path_to_cache


class _Store:
    """The requests to one store, counted in ``requests_sent``."""

    def __init__(self, url: str, message_seconds: float) -> None:
        self._address = url
        self.url = redact(url.rstrip("/"))
        """The store's URL as messages and logs show it: its credentials masked."""
        self.message_seconds = message_seconds
        """How often a request still unanswered is logged."""

    @cached_property
    def _located(self) -> tuple[AbstractFileSystem, str]:
        """The store's file system and its folder there, made at the first request: a process
        that its node's copy serves sends none, and never imports the store's client (s3fs and
        botocore: most of a second of each rank's start on a loaded node)."""
        return fsspec.core.url_to_fs(self._address)

    @property
    def fs(self) -> AbstractFileSystem:
        return self._located[0]

    @property
    def root(self) -> str:
        return self._located[1]

    def key(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    @contextmanager
    def _asked(
        self, kind: str, name: str | None = None, doing: str | None = None
    ) -> Iterator[None]:
        """One request of ``kind`` (about object ``name``), counted, and logged every
        ``message_seconds`` while it waits for the answer (an endpoint that takes connections
        and never answers holds it for the client's retries of its read timeout: 7 minutes of
        botocore's). A failure that is not the store's answer about an object (no such
        object, one there already) is a :class:`SharedCacheError` naming the store, the object
        and the request: a client's own errors (botocore's EndpointConnectionError for an
        endpoint that does not answer, NoCredentialsError) are not OSErrors and name neither.
        ``doing`` words the wait in the log (an upload's: a long one is under way, not
        waiting for an answer)."""
        _count(kind)
        where = self.url if name is None else f"{self.url}/{name}"
        doing = doing or f"waiting for {where} to answer a {kind} request"
        try:
            with _transfers.watched(doing, self.message_seconds):
                yield
        except (FileNotFoundError, FileExistsError, SharedCacheError):
            raise
        except Exception as error:
            raise SharedCacheError(
                f"{where}: the store could not be asked ({kind}): {_worded(error)}"
            ) from error

    def exists(self, name: str) -> bool:
        with self._asked("exists", name):
            return self.fs.exists(self.key(name))

    def read(self, name: str) -> bytes | None:
        try:
            with self._asked("get", name):
                return self.fs.cat_file(self.key(name))
        except FileNotFoundError:
            return None

    def listing(self) -> dict[str, int | None]:
        """The objects in the store's folder, by name, with their sizes (None where the file
        system lists none; one LIST request).
        The file system's own cache of listings is emptied after: it would answer later
        existence checks of leases from this snapshot."""
        try:
            with self._asked("list"):
                try:
                    found = self.fs.ls(self.root, detail=True, refresh=True)
                finally:
                    self.fs.invalidate_cache(self.root)
        except FileNotFoundError:
            found = []
        sizes = {os.path.basename(o["name"].rstrip("/")): o.get("size") for o in found}
        return {name: None if size is None else int(size) for name, size in sizes.items()}

    def download(self, name: str, local: str) -> None:
        """Copy the object to the file ``local`` (one GET, streamed by the file system; its
        failures are worded by the caller, which knows how long it took)."""
        _count("get")
        self.fs.get_file(self.key(name), local)

    def upload(self, local: str, name: str) -> None:
        """Copy the file ``local`` to the object (streamed by the file system: a table of a
        large run is GBs, not read into memory whole)."""
        with self._asked("put", name, f"uploading {local} to {self.url}/{name}"):
            self.fs.put_file(local, self.key(name))

    def write(self, name: str, data: bytes) -> None:
        with self._asked("put", name):
            self.fs.pipe_file(self.key(name), data)

    def create(self, name: str, data: bytes) -> bool:
        """Write ``data`` unless the object exists (a conditional put); whether it did
        (``data``, a lease naming its holder and time, is this call's own). On a local file
        system the file is created exclusively (fsspec's local create looks, then writes: two
        processes could both create it), and removed again when its write fails. A put that
        fails otherwise (S3 answers a conditional put raced by another with 409, which s3fs
        reports as an I/O error; a reply lost after the put landed) is settled by what the store
        then holds under the name, looked at for :data:`CONFLICT_SECONDS`."""
        key = self.key(name)
        if isinstance(self.fs, LocalFileSystem):  # exclusive: nothing to settle
            with self._asked("create", name):
                return self._create_local(key, data)
        try:
            with self._asked("create", name):
                self.fs.pipe_file(key, data, mode="create")
        except FileExistsError:
            return False
        except FileNotFoundError as error:  # no such bucket: not settled by waiting
            raise SharedCacheError(
                f"{self.url}/{name}: the lease could not be created: the store's bucket or "
                f"folder does not exist ({error}); create it, or give path_to_cache "
                "(--data-cache-path) a URL in one that does"
            ) from error
        except OSError as error:
            deadline = time.monotonic() + CONFLICT_SECONDS
            while True:
                found = self.read(name)
                if found is not None:
                    return found == data
                if time.monotonic() >= deadline:
                    raise SharedCacheError(
                        f"{self.url}/{name}: the lease could not be created ({error}), and "
                        f"no other process held it {CONFLICT_SECONDS:g} s later"
                    ) from error
                time.sleep(CONFLICT_POLL_SECONDS)
        return True

    def _create_local(self, path: str, data: bytes) -> bool:
        """A local store's folder is made with its first lease, as a local cache folder is."""
        try:
            make_folder(os.path.dirname(path), "the shared index cache's folder")
            write_exclusively(path, data)
        except FileExistsError:
            return False
        except OSError as error:  # nothing is left at the name: not another process's lease
            raise SharedCacheError(
                f"{path}: the lease could not be created or written ({error})"
            ) from error
        return True

    def remove(self, name: str) -> None:
        with suppress(FileNotFoundError), self._asked("remove", name):
            self.fs.rm_file(self.key(name))


#: the most characters of a failed build's error its lease records
FAILURE_CHARACTERS = 2000
#: how long a conditional put that failed with an error is settled by looking at the store
CONFLICT_SECONDS = 5.0
CONFLICT_POLL_SECONDS = 0.2


@dataclass
class _Watch:
    """What a waiting process saw of one lease: its content and when that last changed."""

    content: bytes | None = None
    changed: float = 0.0


class SharedTableCache:
    """The tables of one store, obtained for local cache entries (see the module's text)."""

    def __init__(self, config: SharedCacheConfig) -> None:
        self.config = config
        self.store = _Store(config.url, config.message_seconds)
        #: by entry, the objects a download found missing beside a committed description
        self._lacking: dict[str, list[str]] = {}
        #: the entries whose node copy is complete and the store's is not (objects lost or
        #: cut short since their commit): uploaded again, never downloaded over the copy
        self._stale_in_store: set[str] = set()

    def obtain(
        self,
        entry: CacheEntry,
        description: str,
        load_or_build: Callable[[], Result],
        may_build: bool,
        rebuilt: Callable[[Result], bool] = lambda result: False,
    ) -> Result:
        """Make ``entry`` complete locally (downloaded, or built by ``load_or_build`` under a
        lease and uploaded), then return ``load_or_build()``, which loads it. ``may_build``:
        whether this process may claim a build; one that may not and finds nothing in the store
        and no build under way calls ``load_or_build`` as it is (whose error says why).

        A process that may build and finds the entry complete locally but not in the store (a
        run killed, or a store that refused it, before the upload ended; objects deleted since)
        uploads it under a lease: the other nodes would otherwise wait for it in vain (a store
        that cannot be asked, or refuses the upload, leaves the node's copy to serve, with a
        warning). A process that may not build and finds the node's copy damaged or gone
        fetches it again, once. Where ``load_or_build`` rebuilt the copy it found (``rebuilt``
        says it of its result: a corpus re-tokenized in place, a damaged table), a process that
        may build replaces the store's copy with it."""
        unusable = None  # the description of a copy that could not be used
        if self._complete_here(entry, description, may_build):
            committed = inode_of(entry.description_path)
            try:
                return self._served(entry, load_or_build, may_build, rebuilt)
            except UnusableCopyError as error:  # a disk error, a file cut short, a corpus
                # changed since: once more (rank 0 replaced the store's copy meanwhile)
                logger.warning("%s; fetching the tables again from %s", error, self.store.url)
                unusable = committed
                with _listing:  # its sizes may be those of the copy replaced since
                    _listings.pop(self.store.url, None)
        with self._node_lock(entry):
            if unusable is not None and inode_of(entry.description_path) == unusable:
                remove_quietly(entry.description_path)  # not fetched again by another meanwhile
            if self._complete_here(entry, description, may_build):  # fetched by another process
                return self._served(entry, load_or_build, may_build, rebuilt)
            complete = entry.complete()  # here, not in the store: uploaded under a lease
            try:
                return self._fetch_or_build(entry, description, load_or_build, may_build, rebuilt)
            except (SharedCacheError, OSError) as error:  # a store down, or refusing it
                if not complete:
                    raise
                logger.warning("%s; this node's copy is used as it is", error)
                return load_or_build()

    def _served(
        self,
        entry: CacheEntry,
        load_or_build: Callable[[], Result],
        may_build: bool,
        rebuilt: Callable[[Result], bool],
    ) -> Result:
        """``load_or_build()`` of the node's complete copy; where it rebuilt that copy (its
        corpus changed, or it was damaged: ``rebuilt`` says it of the result) and this process
        may build, the store's copy, as old, is replaced by it."""
        result = load_or_build()
        if may_build and rebuilt(result):
            return self._replace(entry, result)
        return result

    def _replace(self, entry: CacheEntry, result: Result) -> Result:
        """Upload the node's copy, just rebuilt (its corpus changed, or it was damaged), over
        the store's, under lease 1. Their description is the same text (it describes the
        config, not the corpus's content), so the store's is removed first: no process then
        downloads old and new tables mixed; those that wait see the lease. Where a lease is
        there already (another job's build, or one a failed job left) nothing is replaced, and
        where the store refuses the removal the lease is removed again: both are logged, and
        the other nodes then find the store's copy stale, naming it. A failed upload is
        recorded in the lease (the other nodes fail quoting it)."""
        name = os.path.basename(entry.description_path)
        lease = self._lease_name(entry, 1)
        try:
            if self._current_generation(entry, 0) > 0:
                raise SharedCacheError(
                    f"{self._url(lease)} exists: another build holds these tables, or a failed "
                    "job left its lease"
                )
            if not self._claim(entry, 1, None):
                raise SharedCacheError(f"{self._url(lease)} was claimed by another process")
        except Exception as error:
            return self._not_replaced(name, error, result)
        try:
            self.store.remove(name)
            with _listing:
                _listings.get(self.store.url, {}).pop(name, None)
        except Exception as error:  # nothing changed in the store but the lease: removed
            with suppress(Exception):
                self.store.remove(lease)
            return self._not_replaced(name, error, result)
        logger.warning(
            "%s: the store's copy of these tables is older than the one rebuilt here; replacing it",
            self._url(entry.base),
        )
        try:
            return self._build(entry, 1, lambda: result)
        except Exception as error:  # the lease records the failure (_build)
            return self._not_replaced(name, error, result)

    def _not_replaced(self, name: str, error: Exception, result: Result) -> Result:
        logger.warning(
            "%s: the tables rebuilt here did not replace the store's older copy (%s); this "
            "node uses its own, and the other nodes fail naming what the store holds",
            self._url(name),
            error,
        )
        return result

    def _complete_here(self, entry: CacheEntry, description: str, may_build: bool) -> bool:
        """Whether the entry is complete locally, and, where this process may build, in the
        store too (a store that cannot be asked leaves the node's copy to serve)."""
        if not entry.complete():
            return False
        if not may_build:
            return True
        name = os.path.basename(entry.description_path)
        expected = description.encode("utf-8")
        try:
            committed = self._committed(name, expected)
        except Exception as error:  # a store down, credentials expired: the copy still serves
            logger.warning(
                "%s: not found out whether the store holds these tables (%s); this node's "
                "copy is used as it is",
                self._url(name),
                error,
            )
            return True
        if committed is None or committed[0] != expected:
            return False
        lacking = self._store_lacks(entry) if committed[1] else []
        if lacking:  # objects deleted or cut since: the other nodes could not fetch them
            self._stale_in_store.add(entry.base)
            logger.warning(
                "%s: the store holds these tables' description but %s; this node's copy is "
                "uploaded again",
                self._url(name),
                "; ".join(lacking),
            )
            return False
        return True

    def _store_lacks(self, entry: CacheEntry) -> list[str]:
        """What the store's listing lacks of the tables of this node's complete copy: each
        table object absent, or listed with another size than the local file's."""
        listed, lacking = self._listed(), []
        for table in entry.tables:
            path = entry.table_path(table)
            name, size = os.path.basename(path), os.path.getsize(path)
            if name not in listed:
                lacking.append(f"no {name}")
            elif listed[name] is not None and listed[name] != size:
                lacking.append(f"{name} of {listed[name]} bytes, not {size}")
        return lacking

    def _committed(self, name: str, expected: bytes) -> tuple[bytes, bool] | None:
        """The store's description ``name``, and whether the listing vouched for it: ``expected``
        itself where the listing holds it with that size (or none), else as a GET reads it; None
        where there is none, or only a start of ``expected`` (an upload under way: a file
        system whose put writes in place, with no commit of its own)."""
        listed = self._listed()
        if name in listed and listed[name] in (None, len(expected)):
            return expected, True
        fetched = self.store.read(name)
        if fetched is None or (len(fetched) < len(expected) and expected.startswith(fetched)):
            return None
        return fetched, False

    def _fetch_or_build(self, entry, description, load_or_build, may_build, rebuilt):
        """:meth:`obtain`'s work under the node's lock."""
        watch, last_message = _Watch(), time.monotonic()
        generation = 0
        # the node's copy is good and the store's is not: uploaded under a lease, not fetched
        upload_only = may_build and entry.base in self._stale_in_store and entry.complete()
        self._stale_in_store.discard(entry.base)
        while True:  # bounded: each lease is built or declared dead within lease_seconds
            if not upload_only and self._download(entry, description):
                return self._served(entry, load_or_build, may_build, rebuilt)
            generation = self._current_generation(entry, generation)
            if generation > 0 and not may_build:  # another process of this node gave up on it
                verdict = self._verdict(entry, generation)
                if verdict is not None:
                    raise SharedCacheError(verdict)
            if generation == 0 or self._died(entry, generation, watch):
                if not may_build and generation == 0:
                    lacking = self._lacking.pop(entry.base, None)
                    if lacking:  # committed, with objects gone since: not for the loader to say
                        raise SharedCacheError(
                            f"{self._url(os.path.basename(entry.description_path))}: the store "
                            f"holds these tables' description but not {', '.join(lacking)}: "
                            "its copy is damaged. Global rank 0 uploads its own again when it "
                            "finds it so (at its next start); else remove the description there "
                            "to have the tables rebuilt"
                        )
                    return load_or_build()
                if generation >= self.config.max_builds:
                    raise self._give_up(entry, generation, watch, self._gave_up)
                # the build failed or died: a process that may build claims the next lease (at
                # once, or after watching a dead one for lease_seconds itself); one that may not
                # waits for that one lease time after a failure, two after a death, then says
                # what is missing
                if may_build:
                    if self._claim(entry, generation + 1, watch.content):
                        # (the store's copy found lacking objects: not fetched again)
                        if (
                            not upload_only
                            and entry.base not in self._lacking
                            and self._fetched_meanwhile(entry, description, generation + 1)
                        ):
                            return self._served(entry, load_or_build, may_build, rebuilt)
                        return self._build(entry, generation + 1, load_or_build)
                    watch = _Watch()  # another process claimed it: watch the new lease
                else:
                    waited = time.monotonic() - watch.changed
                    if _failure(watch.content) is not None:
                        if waited >= self.config.lease_seconds:
                            raise self._give_up(entry, generation, watch, self._failed)
                    elif waited >= 3 * self.config.lease_seconds:
                        raise self._give_up(entry, generation, watch, self._unclaimed)
            if time.monotonic() - last_message >= self.config.message_seconds:
                last_message = time.monotonic()
                logger.warning(self._waiting(entry, generation, watch))
            time.sleep(self.config.poll_seconds)

    def _give_up(
        self,
        entry: CacheEntry,
        generation: int,
        watch: _Watch,
        why: Callable[[CacheEntry, int, _Watch], str],
    ) -> SharedCacheError:
        """The error of a wait for lease ``generation`` that ends without tables (``why``
        words it), noted for the node's other processes (:meth:`_verdict`): they take the
        node's lock one after another, and would each wait as long again."""
        message = why(entry, generation, watch)
        verdict = {
            "generation": generation,
            "lease": (watch.content or b"").hex(),
            "time": time.time(),
            "error": message,
        }
        with suppress(OSError):  # unnoted, the next process waits on its own
            write_atomically(entry.path("node-verdict.json"), json.dumps(verdict).encode())
        return SharedCacheError(message)

    def _verdict(self, entry: CacheEntry, generation: int) -> str | None:
        """The error another process of this node ended its wait for lease ``generation``
        with, less than ``lease_seconds`` ago (by this node's clock: an older note is another
        job's, whose rank 0 may be about to claim the next lease) and while that lease is still
        what it saw (one GET); None: no such note."""
        try:
            with open(entry.path("node-verdict.json"), "rb") as stream:
                verdict = json.loads(stream.read())
            if verdict["generation"] != generation:
                return None
            if not 0 <= time.time() - float(verdict["time"]) < self.config.lease_seconds:
                return None
            seen, message = bytes.fromhex(verdict["lease"]), str(verdict["error"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if self.store.read(self._lease_name(entry, generation)) != seen:
            return None  # the lease changed since: a build under way again
        return f"{message} (as another process of this node found)"

    def _lease_name(self, entry: CacheEntry, generation: int) -> str:
        return f"{entry.base}-lease-{generation}.json"

    def _url(self, name: str) -> str:
        return f"{self.store.url}/{name}"

    def _current_generation(self, entry: CacheEntry, known: int) -> int:
        """The newest lease's number (0: none), looking from ``known`` on."""
        generation = known
        while generation < self.config.max_builds and self.store.exists(
            self._lease_name(entry, generation + 1)
        ):
            generation += 1
        return generation

    def _died(self, entry: CacheEntry, generation: int, watch: _Watch) -> bool:
        """Whether lease ``generation`` has not changed for ``lease_seconds`` of this clock, or
        records a failed build."""
        content = self.store.read(self._lease_name(entry, generation))
        now = time.monotonic()
        if content != watch.content or watch.changed == 0.0:
            watch.content, watch.changed = content, now
        return _failure(content) is not None or now - watch.changed >= self.config.lease_seconds

    def _claim(self, entry: CacheEntry, generation: int, previous: bytes | None) -> bool:
        """Claim lease ``generation``; ``previous``: what lease ``generation - 1`` held."""
        claimed = self.store.create(self._lease_name(entry, generation), _lease_text(0))
        if claimed and generation > 1:
            failure = _failure(previous)
            logger.warning(
                "%s: the build under lease %d %s; building again here (%s)",
                self._url(entry.base),
                generation - 1,
                f"stopped sending heartbeats for {self.config.lease_seconds:g} s"
                if failure is None
                else f"failed: {failure}",
                _holder(),
            )
        return claimed

    def _fetched_meanwhile(self, entry: CacheEntry, description: str, generation: int) -> bool:
        """Whether another builder committed the entry between this process's look for it and
        its claim of lease ``generation`` (it committed, then removed its own lease, which this
        process then claimed), and it was downloaded: the lease is given back, and the tables
        are not built a second time. One request per build (the description's GET); a copy
        the download finds incomplete is built under the lease. A download that fails gives
        the lease back too (left, it would hold off every later replacement of the entry)."""
        lease = self._lease_name(entry, generation)
        try:
            fetched = self._download(entry, description)
        except BaseException:
            with suppress(Exception):
                self.store.remove(lease)
            raise
        if not fetched:
            return False
        logger.info(
            "%s: committed by another process meanwhile; downloaded, not built",
            self._url(os.path.basename(entry.description_path)),
        )
        try:
            self.store.remove(lease)
        except Exception as error:  # the tables are here: a lease left is the store's to clear
            logger.warning("%s: the lease not given back (%s)", self._url(lease), error)
        return True

    def _build(self, entry: CacheEntry, generation: int, load_or_build: Callable[[], Result]):
        lease = self._lease_name(entry, generation)
        stop = threading.Event()
        beats = threading.Thread(
            target=self._beat, args=(lease, stop), name="megaindex-lease", daemon=True
        )
        beats.start()
        try:
            try:
                result = load_or_build()
                self._upload(entry)
            finally:
                stop.set()
                beats.join()
        except Exception as error:  # interrupted (Ctrl-C), the lease is left to die
            self._record_failure(lease, error)
            raise
        for number in range(1, generation + 1):
            lease = self._lease_name(entry, number)
            try:
                self.store.remove(lease)
            except Exception as error:  # the tables are committed: a lease left is harmless
                logger.warning(
                    "%s: the lease of a finished build not removed (%s); the tables are in "
                    "the store",
                    self._url(lease),
                    error,
                )
        return result

    def _record_failure(self, lease: str, error: Exception) -> None:
        """Write the build's error into its lease, for the processes that wait for it (every
        reader of the store reads it: credentials in it are masked); a store that refuses the
        write leaves the lease to be declared dead, and the build's error is the one raised."""
        try:
            text = redact(f"{type(error).__name__}: {error}".removesuffix(": "))
            if len(text) > FAILURE_CHARACTERS:
                text = text[: FAILURE_CHARACTERS - 3] + "..."
            self.store.write(lease, _lease_text(-1, text))
        except Exception as refused:
            logger.warning("%s: the build's failure not recorded (%s)", self._url(lease), refused)

    def _beat(self, lease: str, stop: threading.Event) -> None:
        beat = 0
        while not stop.wait(self.config.heartbeat):
            beat += 1
            try:
                self.store.write(lease, _lease_text(beat))
            except Exception as error:  # the next beat may get through (s3fs passes botocore's
                # errors through untranslated: a thread that stopped would let a live build
                # be declared dead)
                logger.warning("%s: heartbeat %d not written (%s)", self._url(lease), beat, error)

    def _upload(self, entry: CacheEntry) -> None:
        """The tables and the sidecar, then the description: the commit mark."""
        paths = [entry.table_path(t) for t in entry.tables] + [entry.sidecar_path]
        for path in [p for p in paths if os.path.isfile(p)] + [entry.description_path]:
            self.store.upload(path, os.path.basename(path))
            with _listing:  # this process's listing holds what it committed since
                _listings.get(self.store.url, {})[os.path.basename(path)] = os.path.getsize(path)
        logger.info("uploaded the %s tables to %s", entry.base, self.store.url)

    def _listed(self) -> dict[str, int | None]:
        """The store's objects and sizes, as this process listed them first."""
        with _listing:
            if self.store.url not in _listings:
                _listings[self.store.url] = self.store.listing()
            return _listings[self.store.url]

    def _download(self, entry: CacheEntry, description: str) -> bool:
        """Download the entry when the store holds it complete; whether it did.

        A description listed with this text's size is not fetched: its name is the md5 of its
        text, and the entry's other objects were complete before it was committed, so their
        listed sizes are checked against the downloads. One committed since the listing, or
        listed with another size, is fetched and compared whole, and the listing's sizes are
        not used: they may be of an upload then under way. A shorter start of this text is
        one being written (a file system whose put writes in place) and counts as none yet."""
        self._lacking.pop(entry.base, None)  # found again below, if still so
        name = os.path.basename(entry.description_path)
        committed = self._committed(name, description.encode("utf-8"))
        if committed is None:
            return False
        found, vouched = committed
        if not vouched:  # the listing's sizes may be of an upload then under way
            self._check_description(name, found, description)
        listed = self._listed()
        sizes = listed if vouched else {}
        sidecar = os.path.basename(entry.sidecar_path)
        wanted = {os.path.basename(entry.table_path(t)): entry.table_path(t) for t in entry.tables}
        if name not in listed or sidecar in listed:  # where it is not listed, it may exist
            wanted[sidecar] = entry.sidecar_path
        with _local_copy_writes(entry):
            pass  # the folder, made before the downloads
        partials = {object_name: partial_path(path) for object_name, path in wanted.items()}
        try:
            with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="megaindex-fetch") as pool:
                futures = {
                    object_name: pool.submit(self._fetch, entry, object_name, partial, sizes)
                    for object_name, partial in partials.items()
                }
                missing = [n for n, future in futures.items() if not future.result()]
            if missing and missing != [sidecar]:
                # listed, then gone: the store changed since this process listed it
                with _listing:
                    _listings.pop(self.store.url, None)
                self._lacking[entry.base] = [n for n in missing if n != sidecar]
                return False
            with _local_copy_writes(entry):
                for object_name, path in wanted.items():
                    if object_name not in missing:
                        os.replace(partials[object_name], path)
        finally:
            for partial in partials.values():
                remove_quietly(partial)
        with _local_copy_writes(entry):
            write_atomically(entry.description_path, found)  # last: the local commit mark
        logger.info("downloaded the %s tables from %s", entry.base, self.store.url)
        return True

    def _fetch(
        self, entry: CacheEntry, name: str, local: str, listed: dict[str, int | None]
    ) -> bool:
        """Download object ``name`` of ``entry`` to the file ``local``; False when the store has
        no such object. Raises when its size is not the one ``listed`` (where it lists one); a
        full disk is the node folder's error, naming ``object_storage_cache_path``."""
        start = time.monotonic()
        try:
            with _transfers.watched(f"downloading {self._url(name)}", self.config.message_seconds):
                self.store.download(name, local)
        except FileNotFoundError:
            return False
        except Exception as error:  # a stalled or dropped transfer: s3fs may word it as nothing
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise write_error(entry, error) from error  # the node's disk, not the store
            raise SharedCacheError(
                f"{self._url(name)}: the download to {local} failed after "
                f"{time.monotonic() - start:.0f} s: {_worded(error)}"
            ) from error
        size = os.path.getsize(local)
        if listed.get(name) is not None and size != listed[name]:
            raise SharedCacheError(
                f"{self._url(name)}: downloaded {size} bytes to {local}, but the store listed "
                f"the object with {listed[name]}: it changed or the transfer was cut short"
            )
        return True

    def _check_description(self, name: str, found: bytes, description: str) -> None:
        """Refuse the store's description ``found`` unless it is ``description``."""
        if found.decode("utf-8", "replace") == description:
            return
        raise SharedCacheError(
            f"{self._url(name)}: the description does not match this dataset's (expected "
            f"the {len(description.encode('utf-8'))} bytes this config describes, found "
            f"{len(found)} bytes of another): the store holds other tables under this name"
        )

    def _waiting(self, entry: CacheEntry, generation: int, watch: _Watch) -> str:
        holder, failure = _describe_lease(watch.content), _failure(watch.content)
        what = (
            f"waiting for {self._url(os.path.basename(entry.description_path))}: lease {generation}"
        )
        if failure is not None:
            return (
                f"{what}: the build by {holder} failed ({failure}); waiting at most "
                f"{self.config.lease_seconds:g} s for a process that builds shared files to "
                f"claim lease {generation + 1}"
            )
        return (
            f"{what} held by {holder}, last changed {time.monotonic() - watch.changed:.0f} s ago "
            f"(declared dead after {self.config.lease_seconds:g} s)"
        )

    def _unclaimed(self, entry: CacheEntry, generation: int, watch: _Watch) -> str:
        lease = self._lease_name(entry, generation)
        return (
            f"{self._url(lease)}: held by {_describe_lease(watch.content)}, unchanged for "
            f"{time.monotonic() - watch.changed:.0f} s (declared dead after "
            f"{self.config.lease_seconds:g} s), and no process that builds shared files (global "
            f"rank 0) claimed lease {generation + 1} since; this process does not build them. "
            f"Is rank 0 building this dataset? A lease a failed job left behind is removed with "
            f"{self._url(entry.base + '-lease-*.json')}"
        )

    def _failed(self, entry: CacheEntry, generation: int, watch: _Watch) -> str:
        return (
            f"{self._url(self._lease_name(entry, generation))}: the build by "
            f"{_describe_lease(watch.content)} failed: {_failure(watch.content)}; no process "
            f"that builds shared files (global rank 0) claimed lease {generation + 1} within "
            f"{self.config.lease_seconds:g} s, and this process does not build them. A lease a "
            f"failed job left behind is removed with {self._url(entry.base + '-lease-*.json')}"
        )

    def _gave_up(self, entry: CacheEntry, generation: int, watch: _Watch) -> str:
        failure = _failure(watch.content)
        ended = (
            f"stopped sending heartbeats for {self.config.lease_seconds:g} s"
            if failure is None
            else f"failed: {failure}"
        )
        return (
            f"{self._url(entry.base)}: {generation} builds of these tables started and none "
            f"finished (the last by {_describe_lease(watch.content)} {ended}); at most "
            f"{self.config.max_builds} are tried. Remove "
            f"{self._url(entry.base + '-lease-*.json')} to try again"
        )

    @contextmanager
    def _node_lock(self, entry: CacheEntry) -> Iterator[None]:
        """Hold this node's lock of ``entry``, logging every ``message_seconds`` who holds it."""
        path = entry.path("node.lock")
        with _local_copy_writes(entry):
            stream = open(path, "a+")  # noqa: SIM115 (held below, with the lock)
        with stream:
            last_message, pause = time.monotonic(), FIRST_LOCK_PAUSE
            while True:  # bounded by the holder: the kernel frees the lock when it dies
                try:
                    fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                except OSError as error:  # a network file system without locks
                    raise SharedCacheError(
                        f"{path}: the node's lock of the shared index cache's local copy could "
                        f"not be taken ({error}); put object_storage_cache_path "
                        "(--object-storage-cache-path) on a local disk"
                    ) from error
                if time.monotonic() - last_message >= self.config.message_seconds:
                    last_message = time.monotonic()
                    stream.seek(0)
                    logger.warning(
                        "waiting for %s, held by %s (fetching or building %s)",
                        path,
                        stream.read().strip() or "another process",
                        entry.base,
                    )
                time.sleep(pause)
                pause = min(pause * 2, self.config.poll_seconds)
            try:
                stream.truncate(0)
                stream.write(_holder())
                stream.flush()
                yield
            finally:
                fcntl.flock(stream, fcntl.LOCK_UN)


@contextmanager
def _local_copy_writes(entry: CacheEntry) -> Iterator[None]:
    """Writes into the node's folder of ``entry``, made first: a folder that cannot be made or
    written, or a full disk, is a :class:`CacheError` naming it and
    ``object_storage_cache_path``, the setting that moves it."""
    try:
        make_folder(entry.directory, "the local copy of the shared index cache")
        yield
    except (MegafmtError, CacheError):  # worded already (a file where a folder belongs)
        raise
    except OSError as error:
        raise write_error(entry, error) from error


def _holder() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def _lease_text(beat: int, failure: str | None = None) -> bytes:
    """A lease's content: its holder, heartbeat and time, and the error of a failed build."""
    lease: dict[str, Any] = {"holder": _holder(), "beat": beat, "time": time.time()}
    if failure is not None:
        lease["failed"] = failure
    return json.dumps(lease).encode()


def _parsed_lease(content: bytes | None) -> dict[str, Any]:
    try:
        lease = json.loads(content or b"")
    except ValueError:
        return {}
    return lease if isinstance(lease, dict) else {}


def _failure(content: bytes | None) -> str | None:
    """The error a lease records of its failed build (None: it records none)."""
    failure = _parsed_lease(content).get("failed")
    return None if failure is None else str(failure)


def _describe_lease(content: bytes | None) -> str:
    """The lease's holder, and its last heartbeat (a failed build's lease has none)."""
    lease = _parsed_lease(content)
    if "holder" not in lease:
        return "an unknown process"
    if "failed" in lease or "beat" not in lease:
        return str(lease["holder"])
    return f"{lease['holder']} (heartbeat {lease['beat']})"
