"""Which failures the shared retry policy retries, and what it raises when it stops."""

import errno
import http.client
import logging
import subprocess
import sys

import pytest

from megafmt import retry as retry_module
from megafmt.errors import MissingFileError, ObjectChangedError, ReadError
from megafmt.remote import ShortRead
from megafmt.retry import Failure, RetryPolicy, classify

URL = "s3://corpora/web/c.bin bytes 0-100"


@pytest.fixture
def sleeps(monkeypatch):
    """The pauses the policy took, instead of taking them."""
    taken = []
    monkeypatch.setattr(retry_module.time, "sleep", taken.append)
    return taken


def failing(*errors):
    """A function that raises ``errors`` one call after another, then answers "data"; the
    list it returns counts the calls."""
    calls = []

    def function():
        calls.append(None)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "data"

    return function, calls


def retried_twice(error, sleeps):
    """Whether the policy gets through two failures with ``error``, counting both."""
    function, calls = failing(error, error)
    counter = [0]
    assert RetryPolicy(retries=3).call(URL, function, counter=counter) == "data"
    return len(calls) == 3 and counter == [2] and len(sleeps) == 2


def raised_at_once(error, sleeps, expected=ReadError):
    """The error the policy raises for ``error``, checked to come from the first attempt."""
    function, calls = failing(error)
    counter = [0]
    with pytest.raises(expected) as raised:
        RetryPolicy(retries=3).call(URL, function, counter=counter)
    assert len(calls) == 1 and counter == [0] and sleeps == []
    assert URL in str(raised.value) and raised.value.__cause__ is error
    return raised.value


def bug_inside_a_handler():
    """A KeyError raised while a dropped connection was being handled (its __context__)."""
    try:
        raise ConnectionResetError("connection reset by peer")
    except ConnectionResetError:
        try:
            {}["timeout"]
        except KeyError as error:
            return error


@pytest.mark.parametrize(
    "error",
    [
        TypeError("bad operand"),
        KeyError("connection"),
        ValueError("503 Service Unavailable"),
        TypeError("connection reset by peer"),
        ValueError("timed out: 500 internal error, slow down"),
        bug_inside_a_handler(),
    ],
    ids=repr,
)
def test_a_bug_is_raised_at_once_as_itself_whatever_its_message_says(error, sleeps):
    """Not retried, and not relabelled a ReadError (an OSError): a bug keeps its kind."""
    function, calls = failing(error)
    counter = [0]
    with pytest.raises(type(error)) as raised:
        RetryPolicy(retries=3).call(URL, function, counter=counter)
    assert raised.value is error and not isinstance(raised.value, ReadError)
    assert len(calls) == 1 and counter == [0] and sleeps == []
    assert classify(error) is Failure.NOT_IO


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("timed out"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        BrokenPipeError(errno.EPIPE, "broken pipe"),
        ShortRead("asked for 100 bytes, got 10"),
        OSError(errno.EIO, "Input/output error"),
        OSError(errno.EBUSY, "Reduce rate"),  # s3fs's SlowDown
        OSError(errno.ESTALE, "Stale file handle"),
        http.client.IncompleteRead(b"partial", 100),
    ],
    ids=repr,
)
def test_builtin_transient_failures_are_retried_and_counted(error, sleeps):
    assert retried_twice(error, sleeps)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (FileNotFoundError(errno.ENOENT, "No such file"), MissingFileError),
        (PermissionError(errno.EACCES, "Access denied"), ReadError),
        (IsADirectoryError(errno.EISDIR, "Is a directory"), ReadError),
        (OSError(errno.EINVAL, "Invalid argument"), ReadError),
        (OSError("no errno at all"), ReadError),
    ],
    ids=repr,
)
def test_permanent_builtin_failures_fail_at_once_naming_the_url(error, expected, sleeps):
    raised = raised_at_once(error, sleeps, expected)
    if expected is MissingFileError:
        assert str(raised).startswith(f"{URL}: not found")


@pytest.mark.parametrize(
    "error",
    [
        ReadError("/data/c.bin: cannot open the token file: no file descriptor left"),
        MissingFileError("/data/c.bin: not found"),
        ObjectChangedError("s3://corpora/c.bin: the object changed"),
    ],
    ids=repr,
)
def test_megafmts_own_errors_no_retry_helps_are_raised_as_they_are(error, sleeps):
    # they name their file and cause already: wrapped, they read "...: ReadError: ... (not
    # retried ...)"
    function, calls = failing(error)
    with pytest.raises(type(error)) as raised:
        RetryPolicy().call(URL, function)
    assert raised.value is error
    assert len(calls) == 1 and sleeps == []


def test_the_last_failure_is_raised_after_the_retries(sleeps, caplog):
    error = TimeoutError("read timed out")
    function, calls = failing(*[error] * 5)
    counter = [0]
    with caplog.at_level(logging.WARNING), pytest.raises(ReadError) as raised:
        RetryPolicy(retries=2, first_wait=0.5).call(URL, function, counter=counter)
    assert str(raised.value) == f"{URL}: gave up after 3 attempts: TimeoutError: read timed out"
    assert raised.value.__cause__ is error
    assert len(calls) == 3 and counter == [2] and len(sleeps) == 2
    assert f"{URL}: TimeoutError: read timed out; retry 1 of 2 in" in caplog.text
    assert "retry 2 of 2" in caplog.text


def test_waits_double_jittered_and_capped():
    policy = RetryPolicy(retries=10, first_wait=0.5, max_wait=3.0)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (8, 3.0)]:
        waits = [policy.wait(retry) for _ in range(200)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits)
        assert len(set(waits)) > 100  # jittered: readers that failed together spread out


def test_a_policy_with_negative_settings_is_refused():
    with pytest.raises(ValueError, match="retries, first_wait and max_wait must be >= 0"):
        RetryPolicy(retries=-1)


def test_classifying_imports_no_storage_library():
    script = (
        "import sys\n"
        "from megafmt.retry import Failure, classify\n"
        "assert classify(TimeoutError()) is Failure.TRANSIENT\n"
        "assert classify(TypeError('connection reset')) is Failure.NOT_IO\n"
        "loaded = {'botocore', 'aiohttp', 'urllib3', 's3fs'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


# botocore and aiohttp: their transport errors, and the answers of a storage service


def client_error(status, code, operation="GetObject"):
    from botocore.exceptions import ClientError

    answer = {"Error": {"Code": code, "Message": "..."}, "ResponseMetadata": {}}
    if status is not None:
        answer["ResponseMetadata"]["HTTPStatusCode"] = status
    return ClientError(answer, operation)


def aiohttp_answer(status, message="..."):
    """The error aiohttp raises for an HTTP answer with ``status``."""
    aiohttp = pytest.importorskip("aiohttp")
    from yarl import URL

    url = URL("http://127.0.0.1:9000/corpora/c.bin")
    request = aiohttp.RequestInfo(url, "GET", {}, url)
    return aiohttp.ClientResponseError(request, (), status=status, message=message)


def botocore_transport_errors():
    exceptions = pytest.importorskip("botocore.exceptions")
    endpoint = {"endpoint_url": "http://127.0.0.1:9000/corpora/c.bin"}
    return [
        exceptions.EndpointConnectionError(**endpoint),
        exceptions.ConnectTimeoutError(**endpoint),
        exceptions.ReadTimeoutError(**endpoint),
        exceptions.ConnectionClosedError(**endpoint),
        exceptions.ResponseStreamingError(error="Connection broken"),
        exceptions.IncompleteReadError(actual_bytes=10, expected_bytes=100),
        exceptions.ProxyConnectionError(proxy_url="http://proxy"),
        # what botocore wraps when the HTTP client raised something it does not name: a
        # response it could not parse (seen with moto behind a faulty proxy), a cut connection
        exceptions.HTTPClientError(error=aiohttp_answer(400, "Bad status line")),
        exceptions.HTTPClientError(error=ConnectionResetError("reset")),
    ]


def aiohttp_transport_errors():
    aiohttp = pytest.importorskip("aiohttp")
    return [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ClientConnectionError("Connection lost"),
        aiohttp.ClientOSError(errno.ECONNRESET, "reset"),
        aiohttp.ServerTimeoutError("Timeout on reading data from socket"),
    ]


def test_transport_errors_of_botocore_and_aiohttp_are_retried(sleeps):
    for error in [*botocore_transport_errors(), *aiohttp_transport_errors()]:
        sleeps.clear()
        assert retried_twice(error, sleeps), error


def test_a_bug_botocore_wrapped_as_an_http_client_error_is_raised_at_once(sleeps):
    exceptions = pytest.importorskip("botocore.exceptions")
    error = exceptions.HTTPClientError(error=TypeError("'NoneType' object is not iterable"))
    raised_at_once(error, sleeps)


TRANSIENT_ANSWERS = [
    (503, "SlowDown"),
    (503, "ServiceUnavailable"),
    (500, "InternalError"),
    (502, "BadGateway"),
    (504, "GatewayTimeout"),
    (429, "TooManyRequests"),
    (400, "RequestTimeout"),  # S3 answers a slow upload with 400 and this code
    (400, "Throttling"),
    (None, "SlowDown"),
    (503, "503"),  # a HEAD answer has no body: the code is the status
]


@pytest.mark.parametrize(("status", "code"), TRANSIENT_ANSWERS)
def test_transient_answers_are_retried_as_botocore_and_s3fs_raise_them(status, code, sleeps):
    error = client_error(status, code)
    assert retried_twice(error, sleeps)
    errors = pytest.importorskip("s3fs.errors")
    sleeps.clear()
    assert retried_twice(errors.translate_boto_error(client_error(status, code)), sleeps)


PERMANENT_ANSWERS = [
    (403, "AccessDenied", ReadError),
    (403, "403", ReadError),
    (404, "NoSuchKey", MissingFileError),
    (404, "NoSuchBucket", MissingFileError),
    (404, "404", MissingFileError),
    (400, "InvalidArgument", ReadError),
    (416, "InvalidRange", ReadError),
    (400, "SomethingNew", ReadError),  # s3fs makes an unknown code an OSError(EIO)
    (409, "BucketNotEmpty", ReadError),
]


@pytest.mark.parametrize(("status", "code", "expected"), PERMANENT_ANSWERS)
def test_permanent_answers_fail_at_once_naming_the_url(status, code, expected, sleeps):
    raised_at_once(client_error(status, code), sleeps, expected)
    errors = pytest.importorskip("s3fs.errors")
    raised_at_once(errors.translate_boto_error(client_error(status, code)), sleeps, expected)


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (503, Failure.TRANSIENT),
        (429, Failure.TRANSIENT),
        (404, Failure.MISSING),
        (403, Failure.PERMANENT),
    ],
)
def test_an_http_answer_from_aiohttp_is_judged_by_its_status(status, failure):
    assert classify(aiohttp_answer(status)) is failure


def test_an_answer_of_another_version_is_an_object_changed_error(sleeps):
    from megafmt.errors import ObjectChangedError

    error = client_error(412, "PreconditionFailed")
    assert classify(error) is Failure.CHANGED
    raised_at_once(error, sleeps, ObjectChangedError)
    errors = pytest.importorskip("s3fs.errors")  # as s3fs hands it on
    raised_at_once(errors.translate_boto_error(error), sleeps, ObjectChangedError)


def test_no_attempt_starts_after_the_deadline(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(retry_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(
        retry_module.time, "sleep", lambda pause: clock.__setitem__(0, clock[0] + pause)
    )

    def slow_timeout():
        clock[0] += 4.0  # each attempt waits out a 4 s read timeout
        raise TimeoutError("read timed out")

    with pytest.raises(ReadError) as raised:
        RetryPolicy(retries=100, first_wait=0.5, deadline=10.0).call(URL, slow_timeout)
    assert "(the deadline is 10 s)" in str(raised.value)
    assert clock[0] <= 10.0 + 4.0  # the deadline plus one attempt


def test_a_policy_with_a_deadline_of_zero_is_refused():
    with pytest.raises(ValueError, match="deadline must be > 0 seconds or None, got 0"):
        RetryPolicy(deadline=0)
