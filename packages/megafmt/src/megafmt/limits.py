"""Errors that come from a limit of the machine, said with the limit named.

A full disk, the open-files limit, the address-space limit and the file-size limit all reach
Python as a bare ``OSError`` or ``MemoryError`` ("[Errno 28] No space left on device", "[Errno
24] Too many open files", "Cannot allocate memory") that names neither the file being written
nor the limit that was met. :func:`limit_hint` says which limit it was and its value (``ulimit``
and the ``resource`` name), :func:`naming_full_disk` names the files a write was for; the CLI
adds the hint to every error it prints.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import TypeVar

try:
    import resource
except ImportError:  # not POSIX: no limits to name
    resource = None

#: errno values of a write that failed for want of room: the disk, or the user's quota, is full
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def soft_limit(name: str) -> int | None:
    """The soft limit ``resource.<name>`` (``"RLIMIT_NOFILE"`` ...), or None when it is
    unlimited or unknown (not POSIX)."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(getattr(resource, name))
    return None if soft == resource.RLIM_INFINITY else soft


def _limit(name: str) -> str | None:
    """The soft limit ``resource.<name>`` as text, or None when it is unlimited or unknown."""
    soft = soft_limit(name)
    return None if soft is None else f"{soft:,}"


def limit_hint(error: BaseException, fewer: str | None = "--workers") -> str:
    """What limit of the machine ``error`` met, with its value and how to raise it (or to use
    fewer of ``fewer``, where given: the CLI's workers); ``""`` for an error that is no
    limit's."""
    instead = f", or use fewer {fewer}" if fewer else ""
    code = error.errno if isinstance(error, OSError) else None
    if code in (errno.EMFILE, errno.ENFILE):
        value = _limit("RLIMIT_NOFILE")
        where = "the system's open-files table" if code == errno.ENFILE else "the open-files limit"
        return (
            f"{where} was reached"
            + (f" (ulimit -n, RLIMIT_NOFILE: {value} files)" if value else "")
            + f"; raise it{instead}"
        )
    if code == errno.EFBIG:
        value = _limit("RLIMIT_FSIZE")
        if value is not None:
            return f"the file-size limit (ulimit -f, RLIMIT_FSIZE: {value} bytes) was reached"
    if isinstance(error, MemoryError) or code == errno.ENOMEM:
        value = _limit("RLIMIT_AS")
        if value is not None:
            return (
                f"the address-space limit (ulimit -v, RLIMIT_AS: {value} bytes) was reached; "
                f"raise it{instead}"
            )
        return "the machine ran out of memory"
    if code in FULL:
        return "the disk (or the user's quota) is full; free space, or write elsewhere"
    return ""


OwnError = TypeVar("OwnError", bound=OSError)


def carrying_errno(error: OwnError, cause: OSError) -> OwnError:
    """``error`` (a library's own, worded with the file and the limit) with the ``errno`` of
    the ``cause`` it replaces: :func:`limit_hint` and callers that branch on it still see
    which limit was met."""
    error.errno = cause.errno
    return error


@contextlib.contextmanager
def naming_full_disk(*destinations: str) -> Iterator[None]:
    """Re-raise a full disk or a file-size limit met inside the block as an ``OSError`` (same
    errno) naming ``destinations``, the files being written; the operating system names none
    ("No space left on device")."""
    try:
        yield
    except OSError as error:
        if (error.errno in FULL or error.errno == errno.EFBIG) and error.filename is None:
            raise OSError(
                error.errno, f"{error.strerror} (writing {', '.join(destinations)})"
            ) from error
        raise
