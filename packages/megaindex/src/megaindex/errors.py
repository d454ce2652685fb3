"""The exceptions megaindex raises: each says what was required, what was found, and where."""

from __future__ import annotations

from megafmt.shared import RedactedMessage


class MegaindexError(RedactedMessage):
    """Base class of every error raised by megaindex (its message never shows credentials)."""


class ConfigError(MegaindexError, ValueError):
    """A dataset configuration, split or blend is invalid."""


class IndexBuildError(MegaindexError, ValueError):
    """The index tables cannot be built from this corpus and configuration."""


class CacheError(MegaindexError, OSError):
    """The index cache cannot be written, or is missing where it must exist."""


class StaleCacheError(MegaindexError, RuntimeError):
    """A cached index was built from a corpus that has changed since."""


class SampleReadError(MegaindexError, RuntimeError):
    """Reading a sample's tokens failed: the message names the corpus, the sample and its
    documents, and the error underneath (chained) what went wrong."""
