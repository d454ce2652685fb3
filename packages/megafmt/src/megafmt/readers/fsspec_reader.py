"""A ``.bin`` reader for object storage and any fsspec URL (s3://, gs://, az://, memory://).

Bytes are fetched in chunks of ``chunk_bytes`` with byte-range requests and kept in an LRU
bounded by ``cache_bytes``. When reads move forward through the file, the next ``readahead``
chunks are fetched ahead on a small thread pool, so a sequential scan does not wait on one
request at a time (megatron-core's S3 reader keeps one chunk and fetches nothing ahead).
Requests that fail transiently are retried with backoff (``megafmt.remote``); a short answer is
retried too, never returned; a request a read waits on that is still unanswered after
``hedge_after`` seconds is sent again on another connection, the first answer winning. The
reader keeps no file descriptor, and after pickling or a fork (DataLoader workers) each process
opens its own client.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy

from megafmt.readers.base import check_read_range
from megafmt.remote import RetryPolicy, cached_index, filesystem


class ShortRead(ConnectionError):
    """The storage answered with fewer bytes than asked for (retried as transient)."""


class FsspecBinReader:
    """Reads a remote ``.bin`` in cached, prefetched chunks."""

    holds_descriptor = False

    def __init__(
        self,
        path: str,
        *,
        chunk_bytes: int = 8 << 20,
        cache_bytes: int = 256 << 20,
        readahead: int = 2,
        threads: int = 4,
        retries: int = 6,
        first_wait: float = 0.1,
        hedge_after: float | None = 2.0,
        idx_cache_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        object_storage_config: Any = None,
    ) -> None:
        if chunk_bytes < 1 or cache_bytes < chunk_bytes or readahead < 0 or threads < 1:
            raise ValueError(
                f"need chunk_bytes >= 1, cache_bytes >= chunk_bytes, readahead >= 0 and "
                f"threads >= 1; got {chunk_bytes}, {cache_bytes}, {readahead}, {threads}"
            )
        if idx_cache_dir is None and object_storage_config is not None:
            idx_cache_dir = getattr(object_storage_config, "path_to_idx_cache", None)
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.cache_bytes = cache_bytes
        self.readahead = readahead
        self.threads = threads
        self.hedge_after = hedge_after
        self.idx_cache_dir = idx_cache_dir
        self.storage_options = dict(storage_options or {})
        self.policy = RetryPolicy(retries, first_wait)
        self._start()
        info = self.policy.call(
            path, self._filesystem().info, self._path_in_fs, counter=self.retry_count
        )
        self.nbytes = int(info["size"])

    def _start(self) -> None:
        """Per-process state: the client, the chunk cache, the prefetch threads."""
        self._pid = os.getpid()
        self._fs, self._path_in_fs = filesystem(self.path, self.storage_options)
        self._lock = threading.Lock()
        self._chunks: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cached = 0
        self._pending: dict[int, Future[bytes]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._urgent: ThreadPoolExecutor | None = None
        self.hedge_count = [0]
        self._last_chunk = -2
        self._closed = False
        self.retry_count = [0]

    def _filesystem(self) -> Any:
        if os.getpid() != self._pid:  # forked into a worker: the parent's client is not ours
            self._start()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "path",
            "chunk_bytes",
            "cache_bytes",
            "readahead",
            "threads",
            "hedge_after",
            "idx_cache_dir",
            "storage_options",
            "policy",
            "nbytes",
        )
        return {name: getattr(self, name) for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    @property
    def local_idx_path(self) -> str:
        """A local copy of the corpus's ``.idx`` (fetched once, refreshed when it changes)."""
        idx_url = self.path[: -len(".bin")] + ".idx"
        return cached_index(
            idx_url, self.idx_cache_dir, self.storage_options, self.policy, self.retry_count
        )

    @property
    def retries(self) -> int:
        """Requests retried so far in this process."""
        return self.retry_count[0]

    @property
    def hedges(self) -> int:
        """Slow requests sent a second time so far in this process."""
        return self.hedge_count[0]

    def _fetch(self, chunk: int) -> bytes:
        start = chunk * self.chunk_bytes
        end = min(self.nbytes, start + self.chunk_bytes)
        fs = self._filesystem()

        def get() -> bytes:
            data = fs.cat_file(self._path_in_fs, start=start, end=end)
            if len(data) != end - start:
                raise ShortRead(f"asked for {end - start} bytes, got {len(data)}")
            return data

        return self.policy.call(f"{self.path} bytes {start}-{end}", get, counter=self.retry_count)

    def _chunk(self, chunk: int) -> bytes:
        """The bytes of ``chunk``: from the cache, from a request already under way, or from a
        new one. A request unanswered after ``hedge_after`` seconds is sent again on another
        connection, and the first answer wins: one slow request does not stall the step."""
        with self._lock:
            data = self._chunks.get(chunk)
            if data is not None:
                self._chunks.move_to_end(chunk)
                return data
            pending = self._pending.get(chunk)
            mine = pending is None
            if mine:
                pending = self._pending[chunk] = Future()
        urgent = self._urgent_pool()
        if mine:
            urgent.submit(self._load, chunk, pending)
        if self.hedge_after is None:
            return pending.result()
        try:
            return pending.result(timeout=self.hedge_after)
        except FutureTimeout:
            self.hedge_count[0] += 1
            urgent.submit(self._load, chunk, pending)
            return pending.result()

    def _urgent_pool(self) -> ThreadPoolExecutor:
        """Threads for requests a read is waiting on, apart from the read-ahead ones."""
        if self._urgent is None:
            self._urgent = ThreadPoolExecutor(2 * self.threads, thread_name_prefix="megafmt-read")
        return self._urgent

    def _load(self, chunk: int, pending: Future[bytes]) -> None:
        """Fetch ``chunk`` into the cache and settle ``pending`` (unless a hedged twin did)."""
        try:
            data = self._fetch(chunk)
        except BaseException as error:
            with self._lock:
                if pending.done():
                    return
                self._pending.pop(chunk, None)
                pending.set_exception(error)
            return
        with self._lock:
            if pending.done():
                return
            self._pending.pop(chunk, None)
            self._chunks[chunk] = data
            self._cached += len(data)
            while self._cached > self.cache_bytes and len(self._chunks) > 1:
                _, evicted = self._chunks.popitem(last=False)
                self._cached -= len(evicted)
            pending.set_result(data)

    def _read_ahead(self, first: int, last: int) -> None:
        sequential = first in (self._last_chunk, self._last_chunk + 1)
        self._last_chunk = last
        if not sequential or not self.readahead:
            return
        final = (self.nbytes - 1) // self.chunk_bytes
        self._fetch_in_background(list(range(last + 1, min(last + self.readahead, final) + 1)))

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Start fetching the chunks that the byte ``(offset, size)`` ranges read next need, in
        that order, on the fetch threads; adjacent ranges share their chunks. At most half the
        cache is spent on chunks not yet used, so prefetching never evicts what it fetched
        before it is read. Returns how many requests were started."""
        budget = max(1, self.cache_bytes // self.chunk_bytes // 2)
        wanted: dict[int, None] = {}
        for offset, size in ranges:
            if size <= 0 or offset < 0 or offset + size > self.nbytes:
                continue
            first, last = offset // self.chunk_bytes, (offset + size - 1) // self.chunk_bytes
            wanted.update(dict.fromkeys(range(first, last + 1)))
            if len(wanted) >= budget:
                break
        return self._fetch_in_background(list(wanted)[:budget])

    def _fetch_in_background(self, chunks: list[int]) -> int:
        self._filesystem()
        started = 0
        for chunk in chunks:
            with self._lock:
                if chunk in self._chunks or chunk in self._pending:
                    continue
                pending = self._pending[chunk] = Future()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="megafmt-fetch")
            self._pool.submit(self._load, chunk, pending)
            started += 1
        return started

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """A new array of ``count`` items of ``dtype`` read at byte ``offset``."""
        itemsize = numpy.dtype(dtype).itemsize
        check_read_range(self.path, self.nbytes, offset, count, itemsize)
        size = count * itemsize
        if self._closed:
            raise ValueError(f"{self.path}: read from a closed reader")
        if size == 0:
            return numpy.empty(0, dtype=dtype)
        self._filesystem()
        first, last = offset // self.chunk_bytes, (offset + size - 1) // self.chunk_bytes
        self._read_ahead(first, last)
        pieces = [self._chunk(chunk) for chunk in range(first, last + 1)]
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        start = offset - first * self.chunk_bytes
        return numpy.frombuffer(data, dtype=dtype, count=count, offset=start).copy()

    def close(self) -> None:
        """Stop fetching ahead and drop the cached chunks; arrays already read stay valid."""
        self._closed = True
        for pool in (self._pool, self._urgent):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._urgent = None
        with self._lock:
            self._chunks.clear()
            self._cached = 0
