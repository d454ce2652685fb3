"""``preprocess_on_ray`` when a shard fails: the run ends at that failure (the shards still
waiting are cancelled, not run to their end first) with the shard's own error, and a Ray
session the caller had started is used and left running. The caller is a driver process of
its own, as a training script would be."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from raytesting import loopback_cluster

#: input bytes per shard; the input is this many shards
SHARD_BYTES, SHARDS = 32 << 10, 8

DRIVER = """
import json, sys
import ray
from megafmt.errors import BadInputError
from megafmt.preprocess import PreprocessConfig
from megafmt.preprocess.on_ray import RayOptions, preprocess_on_ray

source, prefix, storage, shard_bytes = sys.argv[1:5]
ray.init(address=sys.argv[5], log_to_driver=False)
cancelled = []
cancel = ray.cancel
ray.cancel = lambda ref, **options: (cancelled.append(1), cancel(ref, **options))
config = PreprocessConfig(input=source, output_prefix=prefix)
try:
    preprocess_on_ray(config, RayOptions(shard_bytes=int(shard_bytes), storage=storage))
    raised = None
except Exception as error:
    raised = [isinstance(error, BadInputError), str(error), getattr(error, "__notes__", [])]

@ray.remote(num_cpus=1)
def still_runs(value):
    return value + 1

print(json.dumps({
    "raised": raised,
    "cancelled": len(cancelled),
    "session": ray.is_initialized() and ray.get(still_runs.remote(1)) == 2,
}))
"""


@pytest.fixture(scope="module")
def cluster():
    """One CPU: one shard runs at a time, the others wait."""
    with loopback_cluster(workers=1, start_timeout=180) as running:
        yield running


def test_a_failed_shard_cancels_the_rest_and_leaves_the_caller_s_session(cluster, tmp_path):
    source = tmp_path / "in.jsonl"
    with open(source, "w") as stream:
        stream.write('{"text": "cut short\n')  # the first shard's first line is bad
        while stream.tell() < SHARDS * SHARD_BYTES:
            stream.write('{"text": "a line of the corpus that tokenizes well enough"}\n')
    prefix, storage = tmp_path / "out" / "o", tmp_path / "storage"
    arguments = [str(source), str(prefix), str(storage), str(SHARD_BYTES), cluster.address]
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, *arguments],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    bad_input, message, notes = report["raised"]
    assert bad_input and "in.jsonl bytes 0-" in message and "line 1: not JSON" in message, message
    assert any(note.startswith("in Ray shard 0 of ") for note in notes), notes
    # how many shards were still waiting when shard 0 failed depends on the machine's load (on
    # a busy one every other shard may have finished): the run must not wait for them
    assert report["session"]  # the caller's session is still up and runs tasks
    assert not (prefix.parent).exists() or list(prefix.parent.iterdir()) == []
    assert list(storage.iterdir()) == []  # the run's folder is gone
