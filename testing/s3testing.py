"""A real S3 endpoint on loopback for tests: moto's server, and a proxy in front of it that
fails, drops or delays a share of the requests.

Test support, not part of any package: megafmt's own tests, the cross-package ones and
``tools/bench/bench_s3.py`` import it from this folder (pytest puts it on ``sys.path``, see the
root pyproject.toml; the benchmark adds it itself). Needs ``moto[server]`` (and s3fs/boto3 to
talk to it). Credentials are fake and set in the environment, as a user's would be.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def moto_endpoint(
    separate_process: bool = False, first_byte_latency: float | None = None
) -> Iterator[str]:
    """Start moto's S3 server on loopback; yields its URL, with the environment pointing every
    S3 client at it (``AWS_ENDPOINT_URL``) and fake credentials set.

    The server runs on a thread of this process, or with ``separate_process`` in a process of
    its own, as a real endpoint would: it then does not share this interpreter's lock with the
    clients being measured (benchmarks).

    ``first_byte_latency`` (seconds; a separate process only) makes the server behave like S3
    for timing: every GET waits that long before its answer, and many wait at once; a byte
    range is cut from the object held in memory. moto as shipped copies the whole object for
    every ranged GET under a per-object lock, so a read's cost grows with the object's size and
    concurrent reads of one object queue up, which no S3 service does.
    """
    if first_byte_latency is not None and not separate_process:
        raise ValueError("first_byte_latency needs separate_process=True")
    # the server binds a port the system picks and says which: a port found free beforehand
    # could be taken meanwhile by another test run's server, whose requests this one would then
    # be sent (the cross-package tests run as two pytest processes at once)
    if separate_process:
        latency = [] if first_byte_latency is None else ["--latency", str(first_byte_latency)]
        server: Any = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *latency],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        port = _port_of(server)
    else:
        server, port = _started_moto()
    url = f"http://127.0.0.1:{port}"
    saved = {key: os.environ.get(key) for key in [*FAKE_CREDENTIALS, "AWS_ENDPOINT_URL"]}
    os.environ.update(FAKE_CREDENTIALS)
    os.environ["AWS_ENDPOINT_URL"] = url
    _forget_s3_clients()
    try:
        yield url
    finally:
        if separate_process:
            server.terminate()
            server.wait()
        else:
            server.stop()
        _forget_s3_clients()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _started_moto() -> tuple[Any, int]:
    """moto's server, started on a thread of this process on a loopback port the system
    picks, and that port."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return server, server.get_host_and_port()[1]


def _port_of(process: subprocess.Popen, timeout: float = 60.0) -> int:
    """The port the server ``process`` (``_serve``) listens on, from the line it prints."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if line.strip().isdigit():
        return int(line)
    process.kill()
    status = process.wait()
    raise RuntimeError(
        f"moto's server did not say its port within {timeout} s (it printed {line!r}; its "
        f"exit status: {status})"
    )


def _forget_s3_clients() -> None:
    """fsspec reuses S3 file systems made with the same arguments; one made for an earlier
    endpoint would keep talking to it."""
    try:
        import s3fs
    except ImportError:
        return
    s3fs.S3FileSystem.clear_instance_cache()


class FaultyProxy:
    """Forwards HTTP requests to ``target``; a ``failure_rate`` share of them is answered with
    a 503 SlowDown, cut off without an answer, or delayed by ``delay`` seconds first. The first
    ``stalls`` ranged GETs are held for ``stall`` seconds (a request stuck on a bad
    connection)."""

    def __init__(
        self,
        target: str,
        failure_rate: float,
        delay: float = 0.2,
        seed: int = 0,
        stalls: int = 0,
        stall: float = 10.0,
    ):
        self.target = target.removeprefix("http://")
        self.failure_rate = failure_rate
        self.delay = delay
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "503": 0, "dropped": 0, "delayed": 0, "stalled": 0}
        self.stalls = stalls
        self.stall = stall
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    roll = proxy.random.random()
                    stalled = proxy.stalls > 0 and "Range" in self.headers
                    if stalled:
                        proxy.stalls -= 1
                        proxy.counts["stalled"] += 1
                if stalled:
                    time.sleep(proxy.stall)
                fault = roll < proxy.failure_rate
                kind = ("503", "dropped", "delayed")[int(roll * 1000) % 3] if fault else None
                if kind == "503":
                    proxy._count("503")
                    message = b"<Error><Code>SlowDown</Code><Message>Reduce rate</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                if kind == "dropped":
                    proxy._count("dropped")
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if kind == "delayed":
                    proxy._count("delayed")
                    time.sleep(proxy.delay)
                connection = http.client.HTTPConnection(proxy.target, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.target
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                proxy._count("forwarded")
                self.send_response(answer.status)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # a connection that fails in here (its client gone, or the endpoint stopped
                # while a stalled request slept past the test's end) is left alone:
                # printed, it lands in whatever test's captured stderr runs by then. Anything
                # else is a bug of the proxy's, printed as socketserver does
                if not isinstance(sys.exc_info()[1], OSError | http.client.HTTPException):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def __enter__(self) -> FaultyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _serve(argv: list[str]) -> None:
    """moto's server on loopback, as a process of its own (see ``moto_endpoint``): prints the
    port it listens on, then serves until it is terminated."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float)
    args = parser.parse_args(argv)
    if args.latency is not None:
        os.environ["MOTO_S3_DEFAULT_KEY_BUFFER_SIZE"] = str(1 << 40)  # objects stay in memory
        from moto.s3.models import FakeKey

        def value(key: Any) -> bytes:
            time.sleep(args.latency)
            with key.lock:
                return key._value_buffer._file.getvalue()  # the bytes held, not a copy

        FakeKey.value = property(value, FakeKey.value.fset)
    print(_started_moto()[1], flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    _serve(sys.argv[1:])
