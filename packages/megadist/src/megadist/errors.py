"""The errors megadist raises. All are ``ValueError``s (a wrong layout, a malformed batch, ranks
that disagree); a collective that fails or outlasts its group's timeout is also a
``RuntimeError``, what torch raises for it."""

from __future__ import annotations

from megafmt.redaction import RedactedMessage


class MegadistError(RedactedMessage, ValueError):
    """Base class of megadist's errors (their messages never show credentials)."""


class TopologyError(MegadistError):
    """The parallel layout or the topology's settings are inconsistent."""


class BatchError(MegadistError):
    """A micro-batch does not have the keys, shapes or dtypes its topology promises."""


class PartitionError(MegadistError):
    """A batch cannot be split across context-parallel ranks as asked."""


class SourceError(MegadistError):
    """The TP source rank could not send its batch; raised on the ranks that waited for it."""


class AgreementError(MegadistError):
    """The ranks of a TP group describe what they send and expect differently; raised on every
    rank of the group, before any data moves."""


class CollectiveError(MegadistError, RuntimeError):
    """A collective of a megadist group failed: a peer stalled past the group's timeout, or left."""
