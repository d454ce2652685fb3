"""megatron-core's object-storage settings, and the multi-storage-client library behind
``msc://`` URLs.

:class:`ObjectStorageConfig` is the dataclass megatron-core's ``IndexedDataset`` takes for a
corpus in object storage (``s3://`` or ``msc://``): where the local copy of its ``.idx`` goes,
and how many bytes of the ``.bin`` one request fetches. ``S3Config`` is its older name.

``msc://PROFILE/KEY`` URLs are read through NVIDIA's multi-storage-client, whose profiles (in
``$MSC_CONFIG`` or ``~/.msc_config.yaml``) map a name to a POSIX folder, an S3 bucket and
endpoint, and so on. It is an optional dependency: ``pip install 'megafmt[msc]'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from megafmt.errors import PluginError

#: the scheme of URLs served by multi-storage-client
MSC_PREFIX = "msc://"


@dataclass
class ObjectStorageConfig:
    """Where a remote corpus's ``.idx`` is copied, and the ``.bin`` request size."""

    path_to_idx_cache: str
    """The local folder that holds the copies of remote ``.idx`` files."""

    bin_chunk_nbytes: int = 256 * 1024 * 1024
    """Bytes of the ``.bin`` fetched per request (megatron-core's default: 256 MiB)."""


#: megatron-core's deprecated name of :class:`ObjectStorageConfig`
S3Config = ObjectStorageConfig


def is_msc_url(path: str) -> bool:
    """Whether ``path`` is served by multi-storage-client (``msc://PROFILE/KEY``)."""
    return path.startswith(MSC_PREFIX)


def import_msc(url: str) -> ModuleType:
    """The ``multistorageclient`` module, or an error naming the extra that installs it."""
    try:
        import multistorageclient
    except ImportError as error:
        raise PluginError(
            f"{url}: msc:// URLs are read through multi-storage-client, which is not installed "
            f"({error}); install it with: pip install 'megafmt[msc]'"
        ) from None
    return multistorageclient
