"""The errors megadist raises. All are ``ValueError``s: a wrong layout or a malformed batch."""

from __future__ import annotations


class MegadistError(ValueError):
    """Base class of megadist's errors."""


class TopologyError(MegadistError):
    """The parallel layout or the topology's settings are inconsistent."""


class BatchError(MegadistError):
    """A micro-batch does not have the keys, shapes or dtypes its topology promises."""


class PartitionError(MegadistError):
    """A batch cannot be split across context-parallel ranks as asked."""


class SourceError(MegadistError):
    """The TP source rank could not send its batch; raised on the ranks that waited for it."""
