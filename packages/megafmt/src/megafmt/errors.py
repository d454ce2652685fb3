"""The exceptions megafmt raises.

Every error derives from :class:`MegafmtError` and from the builtin that fits it, so callers
that already catch ``ValueError`` or ``OSError`` keep working. Messages name the file, the
field or offset, what was expected and what was found; credentials in a URL are masked.
"""

from __future__ import annotations

from megafmt.redaction import RedactedMessage


class MegafmtError(RedactedMessage, Exception):
    """Base class of every error raised by megafmt (its message never shows credentials)."""


class FormatError(MegafmtError, ValueError):
    """A ``.bin``/``.idx`` file does not follow the format (bad header, wrong size, ...)."""


class MissingFileError(MegafmtError, FileNotFoundError):
    """A file that a corpus needs does not exist."""


class ReadError(MegafmtError, OSError):
    """Reading a file failed, after the retries the reader allows."""


class ObjectChangedError(ReadError):
    """A remote object changed since the corpus was opened: its bytes would no longer match the
    index read then (the message names the URL and both versions)."""


class TokenValueError(MegafmtError, ValueError):
    """A value handed to the builder does not fit the corpus dtype."""


class BadInputError(MegafmtError, ValueError):
    """An input line cannot become a document and ``skip_bad_lines`` is off (raised by
    ``mega preprocess`` and by the SFT line index alike, so neither imports the other)."""


class PluginError(MegafmtError, LookupError):
    """A plugin name is unknown, or its entry point cannot be loaded or is malformed."""


class UnsafePathError(MegafmtError, ValueError):
    """A local path derived from a URL or a name would leave the folder it belongs in (a ``..``
    or an absolute component)."""


class OutputBlockedError(MegafmtError, IsADirectoryError):
    """A file megafmt writes finds a directory at its name (the message names it)."""


class NotAFolderError(MegafmtError, NotADirectoryError):
    """A folder the project writes into (a cache folder, an output folder) is something else
    at its name: a file, or a symbolic link to nothing."""
