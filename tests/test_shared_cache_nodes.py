"""Several "nodes" on this machine share index tables through S3 (moto on loopback): each node
its own local cache folder, every process a rank of one gloo group (testing/sharednodes.py).

CI runs 2 nodes x 4 processes (64 processes that each import torch take minutes on a 2-core
machine); tools/bench/bench_shared_cache.py runs 8 x 8."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import boto3
from s3testing import moto_endpoint
from sharednodes import Job, launch, worker_command

from megafmt.testing import write_corpus

pytestmark = pytest.mark.s3

NODES, PER_NODE = 2, 4


def fresh_bucket() -> str:
    """A new bucket (moto keeps its buckets for the whole test process)."""
    name = f"shared-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def corpora(folder) -> list[str]:
    """Three corpora of 1, 30 and 300 documents."""
    return [
        write_corpus(str(folder / f"corpus{n}"), documents, seed=n)
        for n, documents in enumerate((1, 30, 300))
    ]


def requests_of(reports: list[dict], node: int, kind: str | None = None) -> int:
    """The requests the processes of ``node`` sent to the store (of ``kind``, or all)."""
    return sum(
        sum(r["requests"].values()) if kind is None else r["requests"].get(kind, 0)
        for r in reports
        if r["node"] == node
    )


def test_two_nodes_start_cold_with_one_build_and_warm_with_one_download_per_node(tmp_path):
    with moto_endpoint():
        bucket = fresh_bucket()
        job = Job(f"s3://{bucket}/cache", corpora(tmp_path), [0.2, 0.3, 0.5], samples=200)
        cold = launch(job, tmp_path / "cold", NODES, PER_NODE)
        # global rank 0 built every table and uploaded it; nobody else built anything
        assert set(cold[0]["kinds"]) == {"built"}
        assert all(set(r["kinds"]) == {"cache"} for r in cold[1:])
        assert sum(r["requests"].get("create", 0) for r in cold) == 4  # 3 corpora + the blend
        # node 0's other ranks mapped rank 0's local copy; node 1 fetched each table once (the
        # process that took the node's lock for it)
        assert all(sum(r["requests"].values()) == 0 for r in cold[1:PER_NODE])
        assert requests_of(cold, 1, "create") == requests_of(cold, 1, "put") == 0
        # node 1 listed the store while the corpora's tables were there and the blend's not
        # yet: a GET for each corpus's sidecar and tables; for the blend's, by the process that
        # fetched them, its description and its sidecar too (a GET that finds none) unless that
        # process listed the store after the blend's upload
        once = 3 + 3 * 3 + 2
        assert once <= requests_of(cold, 1, "get") <= once + 2
        # a warm start on fresh nodes: every table comes from the store, once per node, each
        # fetching process lists the store once, and a listed description is not fetched
        warm = launch(job, tmp_path / "warm", NODES, PER_NODE)
        assert all(set(r["kinds"]) == {"cache"} for r in warm)
        assert not any(r["requests"].get("create") or r["requests"].get("put") for r in warm)
        for node in range(NODES):
            assert requests_of(warm, node, "get") == once
            assert 1 <= requests_of(warm, node, "list") <= PER_NODE
            assert requests_of(warm, node) == once + requests_of(warm, node, "list")
        by_rank = {r["rank"]: r["first_tokens"] for r in cold}
        assert all(by_rank[r["rank"]] == r["first_tokens"] for r in warm)


def test_a_node_that_dies_while_building_is_replaced_by_one_rebuild(tmp_path):
    with moto_endpoint():
        bucket = fresh_bucket()
        job = Job(f"s3://{bucket}/cache", corpora(tmp_path), [0.2, 0.3, 0.5], samples=200)
        workdir = tmp_path / "jobs"
        workdir.mkdir()
        env = {**os.environ, "MEGAINDEX_SHARED_CACHE_LEASE_SECONDS": "2"}
        marker = tmp_path / "building"
        dying = subprocess.Popen(
            worker_command(job, workdir, 0, 0, hang_while_building=marker), env=env
        )
        for _ in range(1200):  # torch's import on a loaded machine: up to 2 minutes
            if marker.exists() or dying.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), "node 0 never started building"
        survivor = subprocess.Popen(
            worker_command(job, workdir, 1, 1),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(3)  # node 1 waits on node 0's live lease meanwhile
        dying.send_signal(signal.SIGKILL)
        dying.wait()
        output = survivor.communicate(timeout=300)[0]
        assert survivor.returncode == 0, output
        assert output.count("stopped sending heartbeats for 2 s; building again here") == 1
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
        assert not [key for key in keys if "-lease-" in key]
        assert sum(key.endswith("-description.txt") for key in keys) == 4
