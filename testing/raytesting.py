"""A Ray cluster on loopback for tests: a head and worker nodes, all on 127.0.0.1, started by
Ray's own ``ray.cluster_utils.Cluster`` in this process and stopped (only its own processes)
when the block ends.

Test support, not part of any package (pytest puts this folder on ``sys.path``). Needs ray.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Ray's switch between one-machine (loopback) and multi-node addressing
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: where Ray keeps what outlives a node (the address of the latest cluster, in ``ray/``):
#: ``/tmp`` unless set, and Ray expects ``/tmp/ray`` to exist there
RAY_TMPDIR = "RAY_TMPDIR"


@dataclass
class LoopbackCluster:
    """A running cluster: its address, and the node objects Ray started."""

    address: str
    nodes: list

    def raylet_pids(self) -> set[int]:
        return {
            process.pid
            for node in self.nodes
            for kind, process in node.live_processes()
            if kind == "raylet"
        }


@contextmanager
def loopback_cluster(workers: int = 2, start_timeout: float = 60.0) -> Iterator[LoopbackCluster]:
    """A head node with no CPUs (tasks run on the workers) and ``workers`` nodes of one CPU,
    bound to 127.0.0.1, with their own temporary folder and no dashboard."""
    from ray.cluster_utils import Cluster

    # Ray rewrites 127.0.0.1 to the machine's address where it expects multi-node clusters;
    # this keeps every address on loopback (drivers started from here inherit it)
    saved = {name: os.environ.get(name) for name in (LOOPBACK_ONLY, RAY_TMPDIR)}
    os.environ[LOOPBACK_ONLY] = "0"
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths have a length limit
    # the cluster's files, those Ray keeps outside a node's folder too, stay in this folder,
    # which is made here (a machine where Ray never ran has no /tmp/ray)
    os.environ[RAY_TMPDIR] = temp_dir
    os.makedirs(os.path.join(temp_dir, "ray"))
    common = dict(node_ip_address="127.0.0.1", temp_dir=temp_dir, include_dashboard=False)
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True, head_node_args=dict(num_cpus=0, **common), shutdown_at_exit=False
    )
    try:
        for _ in range(workers):
            cluster.add_node(num_cpus=1, **common)
        cluster.wait_for_nodes(timeout=max(1.0, start_timeout - (time.monotonic() - started)))
        yield LoopbackCluster(cluster.address, [cluster.head_node, *cluster.worker_nodes])
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _parent_and_title(pid: int) -> tuple[int, str]:
    with open(f"/proc/{pid}/stat", "rb") as stream:
        parent = int(stream.read().rsplit(b")", 1)[1].split()[1])
    with open(f"/proc/{pid}/cmdline", "rb") as stream:
        title = stream.read().split(b"\0")[0].decode(errors="replace")
    return parent, title


def _writes_under(pid: int, folder: str) -> bool:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder):
                return True
        except OSError:
            continue
    return False


def kill_task_writing(cluster: LoopbackCluster, function: str, folder: str, timeout: float) -> int:
    """SIGKILL a worker process of ``cluster`` that runs ``function`` (its process title is
    ``ray::<function>`` while it does) and has a file under ``folder`` open: a task caught in
    the middle of writing. Returns its pid; waits up to ``timeout`` seconds for one."""
    raylets = cluster.raylet_pids()
    folder = os.path.realpath(folder)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                parent, title = _parent_and_title(int(entry))
                if (
                    parent in raylets
                    and title.startswith(f"ray::{function}")
                    and _writes_under(int(entry), folder)
                ):
                    os.kill(int(entry), signal.SIGKILL)
                    return int(entry)
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.01)
    raise TimeoutError(f"no worker of the cluster was writing under {folder} within {timeout} s")
