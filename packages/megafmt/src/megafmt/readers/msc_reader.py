"""A ``.bin`` reader for ``msc://PROFILE/KEY`` URLs, through multi-storage-client.

multi-storage-client resolves the profile (a POSIX folder, an S3 bucket and endpoint, ...) from
its configuration (``$MSC_CONFIG`` or ``~/.msc_config.yaml``) and serves byte ranges of the
object. Each ``read`` is one ranged request, as in megatron-core's
``_MultiStorageClientBinReader``; range checks and errors are megafmt's. The corpus's ``.idx``
is copied once into a local folder (``idx_cache_dir``, or the ``path_to_idx_cache`` of a
megatron-core ``ObjectStorageConfig``) at ``<folder>/<PROFILE>/<KEY>``, the place megatron-core
copies it to, and fetched again when the remote size or ETag changes. Needs ``megafmt[msc]``.

multi-storage-client has no read bound to an object's version (fsspec's reader sends S3's
``If-Match``): the reader says which versions it opened (:class:`~megafmt.readers.base.
VersionReporting`), so a corpus replaced while its index tables build is not cached under the
replacement's versions (megaindex compares them with the corpus's fingerprint once built).
"""

from __future__ import annotations

import os
from typing import Any

import numpy

from megafmt.confinement import confined_path, url_components
from megafmt.errors import ReadError
from megafmt.format import get_idx_path
from megafmt.object_storage import MSC_PREFIX, import_msc
from megafmt.readers.base import check_read_range, versions_opened
from megafmt.remote import (
    default_cache_dir,
    etag_of,
    local_copy_is_current,
    store_local_copy,
)
from megafmt.retry import RetryPolicy


class MscBinReader:
    """Reads the ``.bin`` at an ``msc://`` URL with ranged requests."""

    holds_descriptor = False

    def __init__(
        self,
        path: str,
        *,
        idx_cache_dir: str | None = None,
        object_storage_config: Any = None,
        retries: int = 6,
        first_wait: float = 0.1,
    ) -> None:
        if not path.startswith(MSC_PREFIX):
            raise ValueError(f"{path}: expected an msc://PROFILE/KEY URL")
        if idx_cache_dir is None and object_storage_config is not None:
            idx_cache_dir = object_storage_config.path_to_idx_cache
        self.path = path
        self.idx_cache_dir = idx_cache_dir
        self.policy = RetryPolicy(retries, first_wait)
        self._connect()

    def _connect(self) -> None:
        """Resolve the profile to a client (again in each process the reader is pickled to)."""
        self._closed = False
        self._msc = import_msc(self.path)
        self._client, self._key = self._msc.resolve_storage_client(self.path)
        info = self._info(self._client, self._key, self.path)  # a missing one: MissingFileError
        self.nbytes = int(info.content_length)
        self.version = object_version_of(info)
        #: the size and version of the ``.idx`` as copied (None: not copied yet)
        self.idx_version: tuple[int, str] | None = None

    def _info(self, client: Any, key: str, url: str) -> Any:
        return self.policy.call(url, client.info, key)

    @property
    def opened_versions(self) -> dict[str, int | str] | None:
        """The ``.bin`` as opened and the ``.idx`` as copied, keyed and worded as
        :func:`megafmt.fingerprint.corpus_fingerprint` records a URL's (None: the ``.idx`` was
        not copied yet)."""
        return versions_opened(self.idx_version, self.nbytes, self.version)

    def read(self, dtype: Any, count: int, offset: int) -> numpy.ndarray:
        """``count`` items of ``dtype`` at byte ``offset``: one ranged request."""
        itemsize = numpy.dtype(dtype).itemsize
        check_read_range(self.path, self.nbytes, offset, count, itemsize)
        if self._closed:
            raise ValueError(f"{self.path}: read from a closed reader")
        size = count * itemsize
        if size == 0:
            return numpy.empty(0, dtype=dtype)
        byte_range = self._msc.types.Range(offset=int(offset), size=size)
        data = self.policy.call(
            f"{self.path} bytes {offset}-{offset + size}",
            self._client.read,
            self._key,
            byte_range,
        )
        if len(data) != size:
            raise ReadError(f"{self.path}: asked for {size} bytes at {offset}, got {len(data)}")
        return numpy.frombuffer(data, dtype=dtype)

    @property
    def local_idx_path(self) -> str:
        """The local copy of the corpus's ``.idx``, fetched again when the object's size or
        ETag changed since (the note beside it says which version it is)."""
        url = get_idx_path(self.path.removesuffix(".bin"))
        local = confined_path(self.idx_cache_dir or default_cache_dir(), *url_components(url)[1:])
        client, key = self._msc.resolve_storage_client(url)
        info = self._info(client, key, url)
        size, version = int(info.content_length), object_version_of(info)
        if not local_copy_is_current(local, url, size, version):
            os.makedirs(os.path.dirname(local), exist_ok=True)
            store_local_copy(local, self.policy.call(url, client.read, key), url, size, version)
        self.idx_version = (size, version)
        return local

    def close(self) -> None:
        """Refuse later reads (requests hold no descriptor; arrays returned stay valid)."""
        self._closed = True

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "idx_cache_dir": self.idx_cache_dir, "policy": self.policy}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connect()

    def __repr__(self) -> str:
        return f"MscBinReader({self.path!r})"


def object_version_of(info: Any) -> str:
    """The version of an object as multi-storage-client describes it (its ``ObjectMetadata``),
    worded as :func:`megafmt.remote.etag_of` words fsspec's answer for the same object (what a
    corpus's fingerprint records): the ETag unquoted, else the modification time (POSIX
    profiles report no ETag)."""
    return etag_of({"ETag": info.etag, "LastModified": info.last_modified}) or ""


def msc_exists(url: str) -> bool:
    """Whether the object at an ``msc://`` URL exists."""
    return bool(import_msc(url).is_file(url))
