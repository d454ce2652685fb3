"""``mega preprocess --ray`` without an address starts a local Ray cluster for this machine
alone. Ray binds some services to every interface whatever address it is given: such a cluster
is refused, naming its sockets, unless ``--ray-local-any-interface`` accepts it (then the run
completes with the bytes of a one-machine run and lists the sockets)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from megafmt.preprocess import PreprocessConfig, preprocess

#: seconds a local cluster may take to start, run and stop on a busy machine
RUN_SECONDS = 300


def run_local(source, prefix, *extra):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "megafmt.cli.main", "preprocess", "--input", str(source)]
    return subprocess.run(
        [*command, "--output-prefix", str(prefix), "--ray", "--workers", "1", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray_local") / "in.jsonl"
    path.write_text("".join(f'{{"text": "line {i} of the corpus"}}\n' for i in range(200)))
    return path


def test_a_local_cluster_listening_beyond_loopback_is_refused(source, tmp_path):
    run = run_local(source, tmp_path / "out" / "o")
    if run.returncode == 0:  # a Ray that binds its services to the node address: all is well
        assert "listens" not in run.stderr
        return
    assert run.returncode == 1, run.stderr
    assert "the local Ray cluster" in run.stderr and "listens beyond loopback" in run.stderr
    assert "--ray-local-any-interface" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_an_accepted_local_cluster_runs_and_names_its_sockets(source, tmp_path):
    reference = tmp_path / "one" / "o"
    preprocess(PreprocessConfig(input=str(source), output_prefix=str(reference)))
    prefix = tmp_path / "out" / "o"
    run = run_local(source, prefix, "--ray-local-any-interface")
    assert run.returncode == 0, run.stderr
    for suffix in (".bin", ".idx"):
        ours = f"{prefix}_text_document{suffix}"
        with open(ours, "rb") as a, open(f"{reference}_text_document{suffix}", "rb") as b:
            assert a.read() == b.read(), ours
    assert sorted(os.listdir(tmp_path / "out")) == [
        ".mega", "o_text_document.bin", "o_text_document.idx"
    ]  # fmt: skip
