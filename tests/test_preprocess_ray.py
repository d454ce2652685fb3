"""``mega preprocess --ray`` on a Ray cluster on loopback (a head and two worker nodes): the
shards' outputs merge into exactly the bytes of a one-machine run, also when a task's worker
is killed mid-shard and Ray retries it; nothing is left beside the output."""

import gzip
import itertools
import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from raytesting import kill_task_writing, loopback_cluster

from megafmt.manifest import read_manifest
from megafmt.preprocess import PreprocessConfig, preprocess

KEYS = ("text", "title")
#: a shard is about 1 MiB of the large file (``--ray-shard-mb 1``)
LARGE_MB = 5


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster(workers=2) as running:
        yield running


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A folder of a large jsonl (cut into shards), a small one and a gzipped one (a shard each),
    and the one-machine run's output prefix."""
    folder = tmp_path_factory.mktemp("ray_input")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "zeta", "日本", "theta", ""]

    def record():
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 300)))
        return json.dumps({"text": text, "title": rng.choice(words)}) + "\n"

    with open(folder / "a_large.jsonl", "w") as stream:
        while stream.tell() < LARGE_MB << 20:
            stream.write(record())
    with open(folder / "b_small.jsonl", "w") as stream:
        stream.writelines(record() for _ in range(500))
    with gzip.open(folder / "c_packed.jsonl.gz", "wt") as stream:
        stream.writelines(record() for _ in range(500))
    reference = str(tmp_path_factory.mktemp("one_machine") / "out")
    preprocess(
        PreprocessConfig(
            input=str(folder), output_prefix=reference, json_keys=KEYS, append_eod=True, workers=1
        )
    )
    return folder, reference


def mega_preprocess(folder, prefix, storage, env_address=None, extra=()):
    env = dict(os.environ, MEGA_PROGRESS="1")
    if env_address:
        env["RAY_ADDRESS"] = env_address
    command = [
        *(sys.executable, "-m", "megafmt.cli.main", "preprocess"),
        *("--input", str(folder), "--output-prefix", str(prefix), "--append-eod"),
        *("--json-keys", *KEYS, "--ray", "--ray-shard-mb", "1"),
        *(() if storage is None else ("--ray-storage", str(storage))),
        *extra,
    ]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def assert_same_bytes(prefix, reference):
    for key in KEYS:
        for suffix in (".bin", ".idx"):
            ours = f"{prefix}_{key}_document{suffix}"
            with open(ours, "rb") as a, open(f"{reference}_{key}_document{suffix}", "rb") as b:
                assert a.read() == b.read(), ours


def check_run(process, prefix, reference, storage, seconds=240):
    # a run takes 20 to 60 s on a loaded 2-core CI machine (Ray's start included): the limit
    # only keeps a hung run from hanging the suite
    output, _ = process.communicate(timeout=seconds)
    print(output)
    assert process.returncode == 0, output
    assert_same_bytes(prefix, reference)
    names = sorted(os.listdir(os.path.dirname(prefix)))
    assert names == sorted(
        [".mega", *(f"out_{key}_document{suffix}" for key in KEYS for suffix in (".bin", ".idx"))]
    ), names  # no partial, no shard (nor the default storage folder) left beside the output
    assert sorted(os.listdir(os.path.join(os.path.dirname(prefix), ".mega"))) == sorted(
        f"out_{key}_document.manifest.json" for key in KEYS
    )  # the manifests, out of merge_datasets.py's way
    if storage is not None:
        assert os.listdir(storage) == []  # the run's folder is gone, shards and attempts too
    manifest = read_manifest(f"{prefix}_text_document")
    shards = manifest["shards"]
    large = [s for s in shards if s["path"].endswith("a_large.jsonl")]
    assert len(large) >= LARGE_MB and len(shards) == len(large) + 2
    assert large[0]["start"] == 0 and large[-1]["end"] == os.path.getsize(large[0]["path"])
    assert all(a["end"] == b["start"] for a, b in itertools.pairwise(large))
    assert (
        sum(s["documents"] for s in shards)
        == read_manifest(f"{reference}_text_document")["documents"]
    )
    print(f"{len(shards)} shards, attempts {[s['attempts'] for s in shards]}, bytes equal")
    return shards


def test_ray_run_writes_the_bytes_of_one_machine(cluster, corpus, tmp_path):
    folder, reference = corpus
    prefix = tmp_path / "out" / "out"  # the shards go to out.shards/ beside it, by default
    process = mega_preprocess(folder, prefix, None, extra=("--ray-address", cluster.address))
    shards = check_run(process, str(prefix), reference, None)
    assert all(s["attempts"] == 1 for s in shards)


def test_a_task_killed_mid_shard_is_retried(cluster, corpus, tmp_path):
    folder, reference = corpus
    prefix, storage = tmp_path / "out" / "out", tmp_path / "storage"
    process = mega_preprocess(folder, prefix, storage, env_address=cluster.address)
    # the run's start (a process, its imports, the cluster's workers) took over 30 s on a CI
    # machine running the other suites beside it; the limit only keeps a run that never writes
    # from hanging the suite
    killed = kill_task_writing(cluster, "tokenize_shard", str(storage), timeout=240)
    print(f"killed the worker {killed} while it wrote its shard")
    shards = check_run(process, str(prefix), reference, storage)
    assert max(s["attempts"] for s in shards) == 2


def test_a_killed_drivers_run_folder_is_cleared_by_the_next_run(cluster, corpus, tmp_path):
    """A driver killed before its cleanup leaves its run's folder in the storage, named after
    its process; the next run of the same output removes it (a live driver's is kept)."""
    folder, reference = corpus
    prefix, storage = tmp_path / "out" / "out", tmp_path / "storage"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = storage / f"out.{int(dead.stdout)}-0123abcd.partial"
    (stale / "000000-5f5f5f5f5f5f").mkdir(parents=True)
    (stale / "000000-5f5f5f5f5f5f" / "shard_text_document.bin").write_bytes(b"half")
    process = mega_preprocess(folder, prefix, storage, env_address=cluster.address)
    check_run(process, str(prefix), reference, storage)  # the storage is left empty
