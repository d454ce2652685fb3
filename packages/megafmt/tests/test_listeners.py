"""``exposed_listeners``: the TCP sockets a process tree listens on beyond loopback, as
``mega preprocess --ray`` checks its local cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from megafmt.preprocess.listeners import exposed_listeners

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

#: a child that listens on the given address and prints its port, then waits for stdin to close
LISTENER = (
    "import socket, sys; family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET; "
    "s = socket.socket(family); s.bind((sys.argv[1], 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); sys.stdin.read()"
)


@pytest.mark.parametrize(
    ("address", "shown"), [("0.0.0.0", "0.0.0.0"), ("::", "[::]"), ("127.0.0.1", None)]
)
def test_sockets_of_child_processes_beyond_loopback_are_listed(address, shown):
    if ":" in address and not socket.has_ipv6:
        pytest.skip("no IPv6")
    before = set(exposed_listeners())
    child = subprocess.Popen(
        [sys.executable, "-c", LISTENER, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(child.stdout.readline())
        new = [found for found in exposed_listeners() if found not in before]
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    if shown is None:
        assert new == []
    else:
        name = os.path.basename(sys.executable)[:15]  # the kernel's process name
        assert new == [f"{shown}:{port} ({name}, pid {child.pid})"]


def test_sockets_of_other_process_trees_are_not_listed():
    outsider = socket.socket()
    outsider.bind(("0.0.0.0", 0))
    outsider.listen()
    port = outsider.getsockname()[1]
    try:
        assert any(f"0.0.0.0:{port} " in found for found in exposed_listeners())  # its own
        sibling = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        try:
            assert exposed_listeners(sibling.pid) == []
        finally:
            sibling.stdin.close()
            sibling.wait(timeout=30)
    finally:
        outsider.close()
