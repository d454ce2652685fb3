"""The exceptions megaindex raises: each says what was required, what was found, and where.

Each is also an instance of what megatron-core raises in the same situation, so code written
against megatron-core catches them unchanged: megatron-core validates configurations, blends
and index builds with ``assert`` (and with ``ValueError`` here and there), so
:class:`ConfigError` and :class:`IndexBuildError` are both ``ValueError`` and
``AssertionError``; a count in ``sequences_per_dataset`` that disagrees with the ``.idx`` fails
an assert there (:class:`SequenceCountError`), a corpus it leaves out is a ``KeyError``
(:class:`MissingSequenceCountError`); a cache that ``fast_cache_load`` or
``defer_npy_index_mmap`` expects and does not find is a ``FileNotFoundError`` there
(:class:`MissingCacheError`). Unlike an ``assert``, these are raised under ``python -O`` too.
"""

from __future__ import annotations

from megafmt.redaction import RedactedMessage


class MegaindexError(RedactedMessage, Exception):
    """Base class of every error raised by megaindex (its message never shows credentials)."""


class ConfigError(MegaindexError, ValueError, AssertionError):
    """A dataset configuration, split or blend is invalid."""


class IndexBuildError(MegaindexError, ValueError, AssertionError):
    """The index tables cannot be built from this corpus and configuration."""


class EmptySplitError(IndexBuildError):
    """Samples are asked of a split that holds no tokens (megatron-core loops forever there;
    asked for none, it builds an empty dataset, and so does megaindex)."""


class SequenceCountError(MegaindexError, AssertionError):
    """``sequences_per_dataset`` gives a corpus counts that its ``.idx`` header contradicts,
    or gives none for a corpus of the blend."""


class MissingSequenceCountError(SequenceCountError, KeyError):
    """``sequences_per_dataset`` has no entry for a corpus of the blend (megatron-core's
    ``KeyError``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TokenDtypeError(MegaindexError, TypeError):
    """A GPTDataset's corpus holds float tokens: its tables build, its samples cannot be read
    (megatron-core's cast to int64 raises a ``TypeError`` there too)."""


class TokenRangeError(MegaindexError, ValueError):
    """A sample holds a token id at or above the tokenizer's ``vocab_size``: the corpus was
    tokenized with another vocabulary (megatron-core reads it, and the model fails or learns
    from rows of its padded embedding)."""


class CacheError(MegaindexError, OSError):
    """The index cache cannot be written, or is missing where it must exist."""


class MissingCacheError(CacheError, FileNotFoundError):
    """``fast_cache_load`` or ``defer_npy_index_mmap`` trusts a cache that is not there (or
    cannot be read): build it once without them first."""


class CacheDescriptionError(MegaindexError, ValueError):
    """A cache entry's description file lacks a field a report of it needs (megatron-core
    writes every field megaindex reads; a file written by other code may not)."""


class StaleCacheError(MegaindexError, RuntimeError):
    """A cached index was built from a corpus that has changed since."""


class SampleReadError(MegaindexError, RuntimeError):
    """Reading a sample's tokens failed: the message names the corpus, the sample and its
    documents, and the error underneath (chained) what went wrong."""
