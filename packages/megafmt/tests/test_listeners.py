"""``exposed_listeners``: the TCP sockets a process tree listens on beyond loopback, as
``mega preprocess --ray`` checks its local cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from megafmt.preprocess import on_ray
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


class LocalRay:
    """The Ray calls ``_connect`` makes for a local cluster, which here listens beyond loopback
    once started (whatever the installed Ray does: the refusal itself is tested)."""

    __version__ = "2.x"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def init(self, **options) -> None:
        self.calls.append(f"init on {options['_node_ip_address']}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


GCS = "0.0.0.0:6379 (gcs_server, pid 7)"


@pytest.fixture
def exposing_cluster(monkeypatch):
    scans = iter([["[::]:22 (sshd, pid 1)"], ["[::]:22 (sshd, pid 1)", GCS]])  # before, after
    monkeypatch.setattr(on_ray, "exposed_listeners", lambda: next(scans))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return LocalRay()


def test_a_local_cluster_listening_beyond_loopback_is_shut_down_and_named(exposing_cluster):
    with pytest.raises(on_ray.ExposedClusterError, match="--ray-local-any-interface") as caught:
        on_ray._connect(exposing_cluster, None, 1)
    assert GCS in str(caught.value) and "sshd" not in str(caught.value)  # only the cluster's
    assert exposing_cluster.calls == ["init on 127.0.0.1", "shutdown"]


def test_an_accepted_exposed_local_cluster_is_kept_and_its_sockets_said(exposing_cluster, capsys):
    on_ray._connect(exposing_cluster, None, 1, allow_exposed=True)
    assert exposing_cluster.calls == ["init on 127.0.0.1"]
    assert capsys.readouterr().err.strip() == (
        f"mega preprocess --ray: the local Ray cluster listens on {GCS}"
    )
