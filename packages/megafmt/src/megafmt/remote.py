"""Object storage (s3://, gs://, az://, memory://, any fsspec URL): retries and the local
``.idx`` cache.

Requests are retried by a :class:`~megafmt.retry.RetryPolicy`: transient failures (timeouts,
dropped connections, 5xx answers, throttling) with exponential backoff and jitter; a missing
object or bucket, access denied, or a bug fail at once with the URL in the message.
Credentials and endpoints come from where the storage library looks for them (for S3: the
environment, ``~/.aws``, ``AWS_ENDPOINT_URL``); nothing is hard-coded.

Bounded time (S3): every request has a connect and a read timeout of our own
(``CONNECT_TIMEOUT``, ``READ_TIMEOUT``), botocore's and s3fs's own retries are off so that every
attempt counts in the :class:`~megafmt.retry.RetryPolicy`, and the policy starts no attempt after
its ``deadline``: an endpoint that accepts connections and never answers fails after at most
``deadline + connect_timeout + read_timeout`` seconds. Options a user passes in
``storage_options`` (``config_kwargs``) win over these defaults.

Version-safe reads (S3): a reader binds its requests to the ETag seen when it opened the object
(``If-Match``); an object replaced since fails with
:class:`~megafmt.errors.ObjectChangedError` naming the URL and both ETags, instead of mixing
the old index with new bytes. Other fsspec file systems are read without that check.

The ``.idx`` of a remote corpus is copied once into a local folder (megatron-core's
``path_to_idx_cache``; by default ``$MEGA_CACHE_DIR`` or ``~/.cache/megafmt/idx``), atomically,
with a note of the remote size and ETag beside it: a changed object is fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import fsspec

from megafmt.atomic import read_unlinked, write_atomically
from megafmt.confinement import confined_path, url_components
from megafmt.errors import MegafmtError, MissingFileError, ReadError
from megafmt.folders import make_folder
from megafmt.format import get_idx_path
from megafmt.readers import is_url
from megafmt.redaction import redact, split_user_info
from megafmt.retry import RetryPolicy

logger = logging.getLogger(__name__)
#: the retries of a request made without a reader's own policy
DEFAULT_POLICY = RetryPolicy()
#: seconds to wait for a connection, and for each answer on it (S3)
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 10.0
#: fsspec protocols served by s3fs, whose requests get the timeouts and version binding
S3_PROTOCOLS = ("s3", "s3a")


class ShortRead(MegafmtError, ConnectionError):
    """The storage answered with fewer bytes than asked for (retried as transient)."""


def fetch_range(
    fs: Any,
    path_in_fs: str,
    url: str,
    start: int,
    end: int,
    policy: RetryPolicy = DEFAULT_POLICY,
    counter: list[int] | None = None,
) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of ``url`` (``path_in_fs`` on ``fs``), retried on
    transient errors; a short answer is retried too, never returned."""

    def get() -> bytes:
        data = fs.cat_file(path_in_fs, start=start, end=end)
        if len(data) != end - start:
            raise ShortRead(f"asked for {end - start} bytes, got {len(data)}")
        return data

    return policy.call(f"{url} bytes {start}-{end}", get, counter=counter)


def read_range(path: str, start: int, size: int) -> bytes:
    """``size`` bytes at ``start`` of a local file or an object, read in place."""
    fs, inner = filesystem(path)
    return fetch_range(fs, inner, path, start, start + size)


def filesystem(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    if_match: str | None = None,
) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path within it. For S3, a client of its own
    whose requests time out after ``connect_timeout`` and ``read_timeout`` seconds and are not
    retried by botocore or s3fs (the caller's policy retries), and with ``if_match`` (an ETag)
    whose reads fail with HTTP 412 once the object is another version. An S3 URL with user
    info (``s3://KEY:SECRET@bucket``) is refused: s3fs would take it for a bucket name and the
    storage library would quote the secret in its error."""
    options = dict(storage_options or {})
    if url.partition("://")[0] not in S3_PROTOCOLS:
        return fsspec.core.url_to_fs(url, **options)
    if split_user_info(url)[1] is not None:
        raise ValueError(
            f"{redact(url)}: credentials in an S3 URL are not used; expected s3://BUCKET/KEY "
            "with the credentials in the environment, ~/.aws or storage_options"
        )
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", connect_timeout)
    config.setdefault("read_timeout", read_timeout)
    config.setdefault("retries", {"total_max_attempts": 1})
    options["config_kwargs"] = config
    if if_match is not None:
        options["s3_additional_kwargs"] = {
            **(options.get("s3_additional_kwargs") or {}),
            "IfMatch": f'"{if_match}"',
        }
    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **options)
    fs.retries = 1  # s3fs's own loop: one attempt, the policy retries
    return fs, path


def object_version(url: str, storage_options: dict[str, Any] | None = None) -> tuple[int, str]:
    """The size and ETag (or the store's closest equivalent) of the object at ``url``."""
    fs, path = filesystem(url, storage_options)
    info = DEFAULT_POLICY.call(url, fs.info, path)
    return int(info["size"]), str(etag_of(info))


def default_cache_dir() -> str:
    return os.environ.get("MEGA_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "megafmt", "idx"
    )


def etag_of(info: dict[str, Any]) -> str | None:
    """The ETag (or the store's closest equivalent) in an fsspec ``info`` answer, unquoted."""
    for key in ("ETag", "etag", "md5Hash", "content_md5", "mtime", "LastModified"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return None


def cached_index(url: str, *args: Any, **kwargs: Any) -> str:
    """A local copy of the remote ``.idx`` at ``url`` (:func:`cached_index_version`'s
    arguments)."""
    return cached_index_version(url, *args, **kwargs)[0]


def cached_index_version(
    url: str,
    cache_dir: str | None = None,
    storage_options: dict[str, Any] | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
    counter: list[int] | None = None,
    timeouts: tuple[float, float] = (CONNECT_TIMEOUT, READ_TIMEOUT),
) -> tuple[str, int, str]:
    """A local copy of the remote ``.idx`` at ``url``, fetched once and again only when the
    remote size or ETag changes, with the size and ETag (as :func:`object_version` gives it) of
    the version copied: what tables cut from the copy describe. Requests time out after
    ``timeouts`` (connect, read). A key with a ``..`` or ``.`` component is refused
    (:class:`~megafmt.errors.UnsafePathError`)."""
    folder = cache_dir or default_cache_dir()
    local = local_copy_path(folder, url)  # an unsafe key fails here, before any request
    fs, path = filesystem(
        url, storage_options, connect_timeout=timeouts[0], read_timeout=timeouts[1]
    )
    info = policy.call(url, fs.info, path, counter=counter)
    size, etag = int(info["size"]), etag_of(info)
    make_folder(folder, "the .idx cache folder ($MEGA_CACHE_DIR, or path_to_idx_cache)")
    if local_copy_is_current(local, url, size, etag):
        return local, size, str(etag)
    bound, _ = filesystem(  # bound to the version just seen
        url, storage_options, connect_timeout=timeouts[0], read_timeout=timeouts[1], if_match=etag
    )
    data = policy.call(url, bound.cat_file, path, counter=counter)
    store_local_copy(local, data, url, size, etag)
    return local, size, str(etag)


def local_copy_path(folder: str, url: str) -> str:
    """Where the local copy of ``url`` lies in ``folder``: named after the URL without its
    credentials (user info, signature parameters), so that no secret, not even hashed, makes a
    file name, and a re-signed URL of the same object finds the same copy."""
    digest = hashlib.sha256(redact(url).encode()).hexdigest()[:16]
    return confined_path(folder, f"{digest}-{url_components(url)[-1]}")


def _source_note(url: str, size: int, etag: str | None) -> dict[str, Any]:
    return {"url": redact(url), "size": size, "etag": etag}


def local_copy_is_current(local: str, url: str, size: int, etag: str | None) -> bool:
    """Whether ``local`` is a copy of the object at ``url`` as it is now (``size`` and
    ``etag``), by the note :func:`store_local_copy` left beside it. A symbolic link at the copy's
    or the note's name is not followed: the copy is fetched again, over the link."""
    try:
        note = json.loads(read_unlinked(local + ".source.json"))
        return note == _source_note(url, size, etag) and (
            not os.path.islink(local) and os.path.getsize(local) == size
        )
    except (OSError, ValueError):
        return False


def store_local_copy(local: str, data: bytes, url: str, size: int, etag: str | None) -> None:
    """Write ``data`` (the object at ``url``, ``size`` bytes, version ``etag``) to ``local``
    atomically, with the note that says which version it is."""
    if len(data) != size:
        raise ReadError(f"{url}: fetched {len(data)} bytes, but the object has {size}")
    write_atomically(local, data)
    write_atomically(local + ".source.json", json.dumps(_source_note(url, size, etag)).encode())
    logger.info("cached %s (%d bytes) at %s", redact(url), size, local)


def file_size(path: str, storage_options: dict[str, Any] | None = None) -> int | None:
    """The size of the file or object at ``path`` (local or URL); None when it does not exist."""
    if not is_url(path):
        return os.path.getsize(path) if os.path.isfile(path) else None
    fs, inner = filesystem(path, storage_options)
    try:
        return int(DEFAULT_POLICY.call(path, fs.info, inner)["size"])
    except MissingFileError:
        return None


def local_index_path(path_prefix: str, cache_dir: str | None = None) -> str:
    """Where the ``.idx`` of ``path_prefix`` can be read on this machine: the file itself, or
    for a URL its cached local copy."""
    idx_path = get_idx_path(path_prefix)
    return cached_index(idx_path, cache_dir) if is_url(path_prefix) else idx_path
