"""A ``.bin`` reader for object storage and any fsspec URL (s3://, gs://, az://, memory://).

Two kinds of request, each a byte range:

- Chunks of ``chunk_bytes``, kept in an LRU bounded by ``cache_bytes``, for reads that move
  forward through the file; the next ``readahead`` chunks are fetched ahead on a small thread
  pool, so a scan does not wait on one request at a time.
- Spans: the exact bytes of the reads a loader announced (``prefetch``: adjacent ranges merged
  into one request, all fetched at once, at most ``cache_bytes / 2`` of them held), and for a
  read that jumps elsewhere unannounced, ``random_read_bytes`` from where it starts (the rest of
  a sample's documents come with it). A shuffled GPT sample of a few KiB then costs a request
  of a few KiB, not a chunk of MiBs.

megatron-core's S3 reader keeps one chunk, fetches nothing ahead and fetches a whole chunk for
every sample. Requests that fail transiently are retried with backoff (``megafmt.retry``); a
short answer is retried too, never returned; a request a read waits on that is still unanswered
after ``hedge_after`` seconds is sent again on another connection, the first answer winning.
Over S3 every request times out after ``connect_timeout`` and ``read_timeout`` seconds, no
attempt starts after ``deadline`` seconds, and every read is bound to the ETag seen when the
reader opened the object: a replaced object is an :class:`~megafmt.errors.ObjectChangedError`
naming the URL and both ETags (see :mod:`megafmt.remote`).
The reader keeps no file descriptor, and after pickling or a fork (DataLoader workers) each
process opens its own client.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, runtime_checkable

import numpy

from megafmt.errors import ObjectChangedError, ReadError
from megafmt.readers.base import check_read_range, versions_opened
from megafmt.redaction import redact
from megafmt.remote import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    cached_index_version,
    etag_of,
    fetch_range,
    filesystem,
)
from megafmt.retry import RetryPolicy

#: spans that start at or before a read's first byte, looked at for one that holds the read
SPAN_CANDIDATES = 8


@runtime_checkable
class IdxCacheSetting(Protocol):
    """megatron-core's ``ObjectStorageConfig`` (or ``S3Config``), as far as this reader reads
    it: where the local copy of the ``.idx`` goes."""

    path_to_idx_cache: str


class Request(Future):
    """The bytes a request will bring, and how many sends of it (the first, and a hedged one)
    are still under way: a send that fails settles it only when it is the last."""

    def __init__(self) -> None:
        super().__init__()
        self.sends = 1


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
        random_read_bytes: int = 256 << 10,
        retries: int = 6,
        first_wait: float = 0.1,
        hedge_after: float | None = 2.0,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        deadline: float | None = 60.0,
        idx_cache_dir: str | None = None,
        storage_options: dict[str, Any] | None = None,
        object_storage_config: Any = None,
    ) -> None:
        if (
            chunk_bytes < 1
            or cache_bytes < chunk_bytes
            or readahead < 0
            or threads < 1
            or random_read_bytes < 1
            or not connect_timeout > 0
            or not read_timeout > 0
        ):
            raise ValueError(
                f"{redact(path)}: need chunk_bytes >= 1, cache_bytes >= chunk_bytes, "
                f"readahead >= 0, threads >= 1, random_read_bytes >= 1, connect_timeout > 0 and "
                f"read_timeout > 0; got {chunk_bytes}, {cache_bytes}, {readahead}, {threads}, "
                f"{random_read_bytes}, {connect_timeout}, {read_timeout}"
            )
        if idx_cache_dir is None and isinstance(object_storage_config, IdxCacheSetting):
            idx_cache_dir = object_storage_config.path_to_idx_cache
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.cache_bytes = cache_bytes
        self.readahead = readahead
        self.threads = threads
        self.random_read_bytes = random_read_bytes
        self.hedge_after = hedge_after
        self.idx_cache_dir = idx_cache_dir
        self.storage_options = dict(storage_options or {})
        self.timeouts = (connect_timeout, read_timeout)
        self.policy = RetryPolicy(retries, first_wait, deadline=deadline)
        self.version: str | None = None
        #: the size and ETag of the ``.idx`` version last copied (:attr:`local_idx_path`)
        self.idx_version: tuple[int, str] | None = None
        self._start()
        info = self.policy.call(path, self._fs.info, self._path_in_fs, counter=self.retry_count)
        self.nbytes = int(info["size"])
        #: the ETag seen at open: every read is bound to it
        self.version = etag_of(info)
        self._fs, self._path_in_fs = self._client(self.version)

    def _client(self, version: str | None) -> tuple[Any, str]:
        """A file system client with this reader's timeouts (bound to ``version``, if given)."""
        return filesystem(
            self.path,
            self.storage_options,
            connect_timeout=self.timeouts[0],
            read_timeout=self.timeouts[1],
            if_match=version,
        )

    def _start(self) -> None:
        """Per-process state: the client, the chunk cache, the prefetch threads."""
        self._pid = os.getpid()
        self._fs, self._path_in_fs = self._client(self.version)
        self._lock = threading.Lock()
        self._chunks: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cached = 0
        self._pending: dict[int, Request] = {}
        # (start, end) -> its bytes to come; the front is dropped first: spans already read
        # are moved there, new ones join at the back
        self._spans: collections.OrderedDict[tuple[int, int], Request] = collections.OrderedDict()
        self._span_keys: list[tuple[int, int]] = []  # the same keys, sorted: found by bisection
        self._span_bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._urgent: ThreadPoolExecutor | None = None
        self.hedge_count = [0]
        self._last_chunk = -1  # a first read in chunk 0 starts a scan
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
            "random_read_bytes",
            "hedge_after",
            "idx_cache_dir",
            "storage_options",
            "timeouts",
            "policy",
            "nbytes",
            "version",
            "idx_version",
        )
        return {name: getattr(self, name) for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    @property
    def local_idx_path(self) -> str:
        """A local copy of the corpus's ``.idx`` (fetched once, refreshed when it changes)."""
        idx_url = self.path[: -len(".bin")] + ".idx"
        local, size, etag = cached_index_version(
            idx_url,
            self.idx_cache_dir,
            self.storage_options,
            self.policy,
            self.retry_count,
            self.timeouts,
        )
        self.idx_version = (size, etag)
        return local

    @property
    def opened_versions(self) -> dict[str, int | str] | None:
        """The ``.bin`` as opened (every read is bound to it) and the ``.idx`` as copied."""
        return versions_opened(self.idx_version, self.nbytes, str(self.version))

    @property
    def retries(self) -> int:
        """Requests retried so far in this process."""
        return self.retry_count[0]

    @property
    def hedges(self) -> int:
        """Slow requests sent a second time so far in this process."""
        return self.hedge_count[0]

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the object: one request, retried when it fails."""
        fs = self._filesystem()
        try:
            return fetch_range(
                fs, self._path_in_fs, self.path, start, end, self.policy, self.retry_count
            )
        except ObjectChangedError as error:
            raise ObjectChangedError(
                f"{self.path}: the object changed since the corpus was opened: ETag "
                f"{self.version} then, {self._current_version()} now. Its index may have "
                "changed with it: reopen the corpus"
            ) from error

    def _current_version(self) -> str:
        """The object's ETag now (for the message of a changed object)."""
        fs, path_in_fs = self._client(None)
        try:
            return str(etag_of(self.policy.call(self.path, fs.info, path_in_fs)))
        except ReadError as error:
            return f"unknown ({error})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{redact(self.path)}: read from a closed reader")

    def _urgent_pool(self) -> ThreadPoolExecutor:
        """Threads for requests a read is waiting on, apart from the fetch-ahead ones."""
        self._check_open()
        if self._urgent is None:
            self._urgent = ThreadPoolExecutor(2 * self.threads, thread_name_prefix="megafmt-read")
        return self._urgent

    def _ahead_pool(self) -> ThreadPoolExecutor:
        """Threads for requests sent ahead of use (read-ahead, announced reads)."""
        self._check_open()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="megafmt-fetch")
        return self._pool

    def _wait(self, pending: Request, send_again: Callable[[], object]) -> bytes:
        """The answer to ``pending``. A request unanswered after ``hedge_after`` seconds is
        sent again on another connection, and the first answer wins: one slow request does not
        stall the step."""
        if self.hedge_after is None or pending.done():
            return pending.result()
        try:
            return pending.result(timeout=self.hedge_after)
        except FutureTimeout:
            self.hedge_count[0] += 1
            with self._lock:
                pending.sends += 1
            send_again()
            return pending.result()

    @staticmethod
    def _last_send_failed(pending: Request) -> bool:
        """Count a failed send of ``pending`` (lock held); True when it settles the request:
        no answer came and no other send is under way."""
        pending.sends -= 1
        return not pending.done() and pending.sends <= 0

    # chunks: reads moving forward through the file

    def _chunk_range(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.chunk_bytes
        return start, min(self.nbytes, start + self.chunk_bytes)

    def _request_chunk(self, chunk: int, pool: ThreadPoolExecutor) -> Request:
        """The bytes of ``chunk`` to come: from the cache (settled at once), from a request
        already under way, or from a new one sent on ``pool``."""
        with self._lock:
            data = self._chunks.get(chunk)
            if data is not None:
                self._chunks.move_to_end(chunk)
                cached = Request()
                cached.set_result(data)
                return cached
            pending = self._pending.get(chunk)
            if pending is not None:
                return pending
            pending = self._pending[chunk] = Request()
        pool.submit(self._load_chunk, chunk, pending)
        return pending

    def _load_chunk(self, chunk: int, pending: Request) -> None:
        """Fetch ``chunk`` into the cache and settle ``pending`` (unless a hedged twin did)."""
        try:
            data = self._fetch(*self._chunk_range(chunk))
        except BaseException as error:
            with self._lock:
                if self._last_send_failed(pending):
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

    def _read_chunks(self, first: int, last: int, sequential: bool) -> bytes:
        if sequential and self.readahead:
            final = (self.nbytes - 1) // self.chunk_bytes
            for chunk in range(last + 1, min(last + self.readahead, final) + 1):
                self._request_chunk(chunk, self._ahead_pool())
        urgent = self._urgent_pool()
        requests = [(chunk, self._request_chunk(chunk, urgent)) for chunk in range(first, last + 1)]
        pieces = [
            self._wait(pending, lambda c=chunk, p=pending: urgent.submit(self._load_chunk, c, p))
            for chunk, pending in requests
        ]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    # spans: announced reads, and reads that jump elsewhere

    def _span_holding(self, start: int, end: int) -> tuple[int, int] | None:
        """The span, fetched or under way, that holds bytes ``start`` to ``end`` (lock held):
        one of the few that start last at or before ``start`` (spans rarely nest deeper; a
        span missed costs a request, never a wrong byte)."""
        position = bisect.bisect_right(self._span_keys, (start, self.nbytes))
        for key in reversed(self._span_keys[max(0, position - SPAN_CANDIDATES) : position]):
            if end <= key[1]:
                return key
        return None

    def _drop_span(self, key: tuple[int, int]) -> None:
        """Forget the span ``key`` (lock held)."""
        del self._spans[key]
        del self._span_keys[bisect.bisect_left(self._span_keys, key)]
        self._span_bytes -= key[1] - key[0]

    def _held_in_chunks(self, start: int, end: int) -> bool:
        """Whether every chunk of bytes ``start`` to ``end`` is cached or under way (lock held)."""
        first, last = start // self.chunk_bytes, (end - 1) // self.chunk_bytes
        return all(c in self._chunks or c in self._pending for c in range(first, last + 1))

    def _add_span(
        self, key: tuple[int, int], pool: ThreadPoolExecutor, keep: set[tuple[int, int]] | None
    ) -> Request | None:
        """Send a request for the bytes of ``key`` (start, end) on ``pool``, dropping spans from
        the front to stay within half the cache (lock held). With ``keep`` (announced reads),
        none of those spans is dropped, and None is returned when there is no room (the plan is
        larger than the budget); without it (a read needs the bytes now) the span is always
        added."""
        size = key[1] - key[0]
        budget = self.cache_bytes // 2
        while self._spans and self._span_bytes + size > budget:
            front = next(iter(self._spans))
            if keep is not None and front in keep:
                return None
            self._drop_span(front)
        if keep is not None and self._span_bytes + size > budget:
            return None
        pending = self._spans[key] = Request()
        bisect.insort(self._span_keys, key)
        self._span_bytes += size
        pool.submit(self._load_span, key, pending)
        return pending

    def _load_span(self, key: tuple[int, int], pending: Request) -> None:
        """Fetch the bytes of ``key`` and settle ``pending`` (unless a hedged twin did)."""
        try:
            data = self._fetch(*key)
        except BaseException as error:
            with self._lock:
                if not self._last_send_failed(pending):
                    return
                if self._spans.get(key) is pending:  # a failed span is not kept
                    self._drop_span(key)
                pending.set_exception(error)
            return
        with self._lock:
            if not pending.done():
                pending.set_result(data)

    def _read_span(self, key: tuple[int, int], pending: Request) -> bytes:
        urgent = self._urgent_pool()
        return self._wait(pending, lambda: urgent.submit(self._load_span, key, pending))

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Start fetching the byte ``(offset, size)`` ranges read next, all at once on the fetch
        threads, in the order of their first use; overlapping or adjacent ranges are merged
        into one request, and ranges already held are skipped. At most half the cache is held
        in announced bytes, so a long plan is fetched as far as that allows and prefetching
        never drops what it fetched before it is read. Returns how many requests were started."""
        wanted = [
            (offset, offset + size)
            for offset, size in ranges
            if size > 0 and offset >= 0 and offset + size <= self.nbytes
        ]
        self._filesystem()
        pool = self._ahead_pool()
        keep: set[tuple[int, int]] = set()
        started = 0
        for start, end in merge_ranges(wanted):
            with self._lock:
                if self._held_in_chunks(start, end):
                    continue
                key = self._span_holding(start, end)
                if key is not None:  # announced again: read later than it seemed, keep it
                    self._spans.move_to_end(key)
                elif self._add_span((start, end), pool, keep) is None:
                    break
                else:
                    key = (start, end)
                    started += 1
                keep.add(key)
        return started

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """A new array of ``count`` items of ``dtype`` read at byte ``offset``."""
        itemsize = numpy.dtype(dtype).itemsize
        check_read_range(self.path, self.nbytes, offset, count, itemsize)
        size = count * itemsize
        self._check_open()
        if size == 0:
            return numpy.empty(0, dtype=dtype)
        self._filesystem()
        first, last = offset // self.chunk_bytes, (offset + size - 1) // self.chunk_bytes
        sequential = first in (self._last_chunk, self._last_chunk + 1)
        self._last_chunk = last
        span: tuple[tuple[int, int], Request] | None = None
        with self._lock:
            held = self._held_in_chunks(offset, offset + size)
            key = None if held else self._span_holding(offset, offset + size)
            if key is not None:  # dropped first from now on: reads rarely come back
                self._spans.move_to_end(key, last=False)
                span = key, self._spans[key]
            elif not held and not sequential:
                key = (offset, min(self.nbytes, offset + max(size, self.random_read_bytes)))
                span = key, self._add_span(key, self._urgent_pool(), None)  # type: ignore[assignment]
        if span is None:
            data = self._read_chunks(first, last, sequential)
            start = offset - first * self.chunk_bytes
        else:
            data = self._read_span(*span)
            start = offset - span[0][0]
        return numpy.frombuffer(data, dtype=dtype, count=count, offset=start).copy()

    def close(self) -> None:
        """Stop fetching and drop what is held; arrays already read stay valid, and a read
        still waiting fails with a clear error."""
        with self._lock:
            self._closed = True
            closed = ValueError(
                f"{redact(self.path)}: the reader was closed while this read waited"
            )
            for pending in [*self._pending.values(), *self._spans.values()]:
                if not pending.done():
                    pending.set_exception(closed)
            self._pending.clear()
            self._chunks.clear()
            self._cached = 0
            self._spans.clear()
            self._span_keys.clear()
            self._span_bytes = 0
        for pool in (self._pool, self._urgent):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._urgent = None


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``(start, end)`` ranges with overlapping or adjacent ones merged, in the order the
    first range of each merged one came."""
    spans: list[list[int]] = []  # start, end, position of its first range
    for position in sorted(range(len(ranges)), key=lambda i: ranges[i]):
        start, end = ranges[position]
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
            spans[-1][2] = min(spans[-1][2], position)
        else:
            spans.append([start, end, position])
    spans.sort(key=lambda span: span[2])
    return [(start, end) for start, end, _ in spans]
