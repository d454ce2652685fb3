"""Retrying reads from storage: which failures are worth another attempt, and the backoff.

A failure is judged by its exception type and, for an HTTP answer, its status and error code;
never by the words of its message, so a bug (a ``TypeError`` whose message happens to say
"connection reset") is raised at once instead of being retried.

- Transient, retried: the builtin ``TimeoutError`` and ``ConnectionError``; an ``OSError``
  whose errno marks a passing fault (``EIO``, ``EBUSY``, ``ESTALE``: a stale NFS handle ...;
  s3fs turns an S3 SlowDown into ``EBUSY``); the transport errors of botocore, aiohttp and
  ``http.client`` (a dropped connection, a timeout, a cut-off body); an HTTP answer of 5xx,
  408 or 429, or one whose error code says throttling or a timeout (``SlowDown``,
  ``Throttling``, ``RequestTimeout`` ...).
- Missing: ``FileNotFoundError``, HTTP 404, ``NoSuchKey``, ``NoSuchBucket``.
- Changed: HTTP 412 (``PreconditionFailed``): a read bound to the version seen at open
  (``If-Match``) found another version; raised at once as
  :class:`~megafmt.errors.ObjectChangedError`.
- Permanent, raised at once as a :class:`~megafmt.errors.ReadError`: any other answer of the
  storage (403 access denied, 400 ...), any other ``OSError``.
- Not an I/O failure: every other exception (``TypeError``, ``KeyError``, ``ValueError`` ...: a
  bug, or a caller's mistake) is raised at once as itself, never relabelled an I/O error.
- megafmt's own errors (a reopen's :class:`~megafmt.errors.ReadError` that found no descriptor
  left ...) name their file and cause already: raised at once as themselves, unless transient
  (:class:`~megafmt.remote.ShortRead`, retried).

The optional storage libraries are never imported here: an exception of one of their types
can only exist once the library is loaded, so their types are looked up in ``sys.modules``.
"""

from __future__ import annotations

import enum
import errno
import http.client
import logging
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from megafmt.errors import MegafmtError, MissingFileError, ObjectChangedError, ReadError
from megafmt.redaction import redact

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Failure(enum.Enum):
    """What a failed attempt says about the next one."""

    TRANSIENT = "transient"  # may succeed on another attempt
    MISSING = "missing"  # the file, object or bucket does not exist
    PERMANENT = "permanent"  # another attempt fails the same way (or it is a bug)
    CHANGED = "changed"  # the object is not the version the read is bound to
    NOT_IO = "not an I/O failure"  # a bug or a caller's mistake: raised as it is


#: errno values of an OSError that may go away on another attempt (ETIMEDOUT, ECONNRESET and
#: the like make a TimeoutError or ConnectionError already)
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EAGAIN",
        "EBUSY",
        "EINTR",
        "EIO",
        "ESTALE",
        "EREMOTEIO",
        "ENOTCONN",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
    )
    if hasattr(errno, name)  # some platforms lack a few
)
#: HTTP statuses worth another attempt: request timeout, too many requests, server errors
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: error codes of a storage service's answer worth another attempt (throttling, timeouts, the
#: service's own failures), whatever the status they came with
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "OperationAborted",
        "InternalError",
        "ServiceUnavailable",
    }
)
#: error codes of an answer saying the object is not the version a read asked for (If-Match)
CHANGED_CODES = frozenset({"PreconditionFailed", "412"})
#: error codes of an answer saying the object or its bucket does not exist
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})

#: (module, class names) of the optional libraries' transport errors: a dropped or refused
#: connection, a timeout, a body cut off
TRANSPORT_ERRORS = (
    (
        "botocore.exceptions",
        (
            "EndpointConnectionError",
            "ConnectTimeoutError",
            "ReadTimeoutError",
            "ConnectionClosedError",
            "ResponseStreamingError",
            "IncompleteReadError",
            "ProxyConnectionError",
        ),
    ),
    ("aiohttp", ("ClientConnectionError", "ClientPayloadError")),
    ("asyncio", ("TimeoutError",)),  # not the builtin one before Python 3.11
    ("concurrent.futures", ("TimeoutError",)),
)
#: (module, class names) of what an HTTP client raises about the exchange itself (as opposed
#: to a bug in it): botocore wraps those it does not name in its plain ``HTTPClientError``
HTTP_CLIENT_ERRORS = (
    ("aiohttp", ("ClientError",)),
    ("aiohttp.http_exceptions", ("HttpProcessingError",)),
    ("urllib3.exceptions", ("HTTPError",)),
)


def loaded_types(
    libraries: tuple[tuple[str, tuple[str, ...]], ...],
) -> tuple[type[BaseException], ...]:
    """The exception classes named in ``libraries`` whose module is imported already; names a
    version of a library lacks are skipped."""
    found: list[type[BaseException]] = []
    for module_name, names in libraries:
        module = sys.modules.get(module_name)
        if module is not None:
            found.extend(getattr(module, name) for name in names if hasattr(module, name))
    return tuple(found)


def classify(error: BaseException) -> Failure:
    """Whether another attempt after ``error`` may succeed, or the thing is missing, or
    retrying cannot help."""
    botocore = sys.modules.get("botocore.exceptions")
    aiohttp = sys.modules.get("aiohttp")
    if botocore is not None:
        if isinstance(error, botocore.ClientError):
            return _classify_answer(_status(error.response), _code(error.response))
        cause = error.__cause__
        if isinstance(error, OSError) and isinstance(cause, botocore.ClientError):
            return classify(cause)  # s3fs's translation of the service's answer
        if type(error) is botocore.HTTPClientError:  # wraps what the HTTP client raised
            wrapped = error.kwargs.get("error")
            exchange = (OSError, http.client.HTTPException, *loaded_types(HTTP_CLIENT_ERRORS))
            if wrapped is None or isinstance(wrapped, exchange):
                return Failure.TRANSIENT
            return Failure.PERMANENT
    if aiohttp is not None and isinstance(error, aiohttp.ClientResponseError):
        return _classify_answer(error.status, None)
    if not _is_io_error(error):
        return Failure.NOT_IO
    if isinstance(error, FileNotFoundError):
        return Failure.MISSING
    if isinstance(error, (PermissionError, IsADirectoryError, NotADirectoryError)):
        return Failure.PERMANENT
    transient_types = (TimeoutError, ConnectionError, http.client.IncompleteRead)
    if isinstance(error, transient_types + loaded_types(TRANSPORT_ERRORS)):
        return Failure.TRANSIENT
    if isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS:
        return Failure.TRANSIENT
    return Failure.PERMANENT


def _is_io_error(error: BaseException) -> bool:
    """Whether ``error`` is about the storage or the exchange with it (an ``OSError``, an HTTP
    client's or a storage library's own error), as opposed to a bug in the calling code."""
    botocore = sys.modules.get("botocore.exceptions")
    storage = (botocore.BotoCoreError, botocore.ClientError) if botocore is not None else ()
    io_types = (OSError, http.client.HTTPException, *storage)
    return isinstance(error, io_types + loaded_types(TRANSPORT_ERRORS + HTTP_CLIENT_ERRORS))


def _classify_answer(status: int | None, code: str | None) -> Failure:
    """The failure an HTTP answer with ``status`` and error ``code`` means."""
    if status in TRANSIENT_STATUSES or code in TRANSIENT_CODES:
        return Failure.TRANSIENT
    if status == 404 or code in MISSING_CODES:
        return Failure.MISSING
    if status == 412 or code in CHANGED_CODES:
        return Failure.CHANGED
    return Failure.PERMANENT


def _status(response: dict[str, Any]) -> int | None:
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _code(response: dict[str, Any]) -> str | None:
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` more attempts after a transient failure. The wait before the k-th retry is
    drawn between half and all of ``first_wait * 2**(k-1)``, capped at ``max_wait`` (jittered,
    so many readers that failed together do not retry together). No attempt starts later than
    ``deadline`` seconds after the first (None: no limit), so a call takes at most the deadline
    plus one attempt, which the storage client's own timeouts bound."""

    retries: int = 6
    first_wait: float = 0.1
    max_wait: float = 10.0
    deadline: float | None = 60.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.first_wait < 0 or self.max_wait < 0:
            raise ValueError(
                f"RetryPolicy: retries, first_wait and max_wait must be >= 0, got "
                f"{self.retries}, {self.first_wait} and {self.max_wait}"
            )
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(
                f"RetryPolicy: deadline must be > 0 seconds or None, got {self.deadline}"
            )

    def wait(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (from 1)."""
        return min(self.first_wait * 2 ** (retry - 1), self.max_wait) * random.uniform(0.5, 1.0)

    def call(
        self, what: str, function: Callable[..., T], *args: Any, counter: list[int] | None = None
    ) -> T:
        """``function(*args)``, retried on transient failures, each retry added to
        ``counter[0]``. ``what`` (the file or URL, and the range) names it in the error raised:
        :class:`~megafmt.errors.MissingFileError` when it does not exist,
        :class:`~megafmt.errors.ObjectChangedError` when it is not the version asked for, else
        :class:`~megafmt.errors.ReadError`, the failure chained. An exception that is no I/O
        failure (a ``TypeError`` ...: a bug), or one of megafmt's own that no retry helps (a
        reopen that found no descriptor left: it names its file and cause already), is raised
        as it is, at once."""
        started = time.monotonic()
        for attempt in range(1, self.retries + 2):
            try:
                return function(*args)
            except Exception as error:
                failure = classify(error)
                if failure is Failure.NOT_IO:
                    raise
                if isinstance(error, MegafmtError) and failure is not Failure.TRANSIENT:
                    raise
                if failure is Failure.MISSING:
                    raise MissingFileError(f"{what}: not found ({error})") from error
                if failure is Failure.CHANGED:
                    raise ObjectChangedError(
                        f"{what}: the object changed since it was opened ({error})"
                    ) from error
                if failure is Failure.PERMANENT:
                    raise ReadError(
                        f"{what}: {type(error).__name__}: {error} (not retried: not a "
                        "transient failure)"
                    ) from error
                if attempt > self.retries:
                    raise ReadError(
                        f"{what}: gave up after {attempt} attempts: {type(error).__name__}: {error}"
                    ) from error
                pause = self.wait(attempt)
                elapsed = time.monotonic() - started
                if self.deadline is not None and elapsed + pause > self.deadline:
                    raise ReadError(
                        f"{what}: gave up after {attempt} attempts in {elapsed:.1f} s (the "
                        f"deadline is {self.deadline:g} s): {type(error).__name__}: {error}"
                    ) from error
                if counter is not None:
                    counter[0] += 1
                logger.warning(
                    "%s: %s: %s; retry %d of %d in %.2f s",
                    redact(what),
                    type(error).__name__,
                    redact(str(error)),
                    attempt,
                    self.retries,
                    pause,
                )
                time.sleep(pause)
        raise AssertionError("unreachable")
