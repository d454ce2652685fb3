"""Many "nodes" on one machine sharing index tables through object storage.

Test support, not part of any package (the cross-package tests and
``tools/bench/bench_shared_cache.py`` import it). :func:`launch` starts ``nodes x per_node``
processes, each one a rank of one gloo group (or, with ``group=False``, a job of its own); each
node has its own local cache folder and all share the store at ``store`` (an S3 URL on moto's
loopback endpoint, :mod:`s3testing`). Every process builds the same blend
(``BlendedMegatronDatasetBuilder``, ``path_to_cache=store``), reads its first sample, and writes
a JSON report: seconds from the launch to its first sample, how each table came
(built/cache), and the requests it sent to the store.

Run as a script, it is one such process (``--help``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: when this process's own code began (after the interpreter's start and the standard library)
STARTED = time.time()
HERE = Path(__file__).resolve().parent
#: a worker waits at most this long for its group and its datasets
WORKER_TIMEOUT = 600


@dataclass(frozen=True)
class Job:
    """What every process of a launch builds."""

    store: str
    corpora: list[str]
    weights: list[float]
    samples: int
    sequence_length: int = 32
    builder_threads: int = 1
    """``num_dataset_builder_threads``: corpora whose tables are obtained at once."""


def node_folder(workdir: Path, node: int) -> Path:
    return workdir / f"node{node}"


def worker_command(job: Job, workdir: Path, rank: int, node: int, **extra: Any) -> list[str]:
    spec = workdir / "job.json"
    if not spec.exists():
        spec.write_text(json.dumps(job.__dict__))
    command = [sys.executable, str(HERE / "sharednodes.py"), "--job", str(spec)]
    command += ["--rank", str(rank), "--node", str(node), "--workdir", str(workdir)]
    for name, value in extra.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def launch(
    job: Job,
    workdir: Path,
    nodes: int,
    per_node: int,
    *,
    group: bool = True,
    timeout: float = WORKER_TIMEOUT,
    port: int | None = None,
    profiled: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """Run every process of ``nodes x per_node`` and return their reports, by rank; raises
    naming the rank and its output when one fails. The ranks in ``profiled`` write cProfile's
    statistics of their build to ``workdir/profile-<rank>.prof``."""
    from s3testing import free_port

    workdir.mkdir(parents=True, exist_ok=True)
    world = nodes * per_node
    started = time.time()
    extra: dict[str, Any] = {"launched": started}
    if group:
        extra.update(world=world, port=port or free_port())
    processes = [
        subprocess.Popen(
            worker_command(
                job,
                workdir,
                rank,
                rank // per_node,
                **extra,
                **({"profile": workdir / f"profile-{rank}.prof"} if rank in profiled else {}),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        if process.returncode != 0:
            raise RuntimeError(f"rank {rank} exited with {process.returncode}:\n{output}")
    return [json.loads((workdir / f"report-{rank}.json").read_text()) for rank in range(world)]


def _hang_while_building(marker: str) -> None:
    """Make this process stop for good inside its first table build, after touching
    ``marker`` (the test kills it there: a node that dies while building)."""
    from megaindex import gpt_index

    def hang(self: Any) -> Any:
        Path(marker).touch()
        time.sleep(WORKER_TIMEOUT)
        raise SystemExit("not killed")

    gpt_index.GPTTableRecipe.build = hang


def _worker(args: argparse.Namespace) -> None:
    import torch

    from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    from megaindex.shared_cache import requests_sent
    from megaindex.tokenizer import IdentifiedTokenizer

    job = Job(**json.loads(Path(args.job).read_text()))
    imported = time.time()
    if args.world:
        torch.distributed.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=args.rank,
            world_size=args.world,
        )
    grouped = time.time()
    if args.hang_while_building:
        _hang_while_building(args.hang_while_building)
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=job.sequence_length,
        blend=(job.corpora, job.weights),
        split="1,0,0",
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=job.store,
        object_storage_cache_path=str(node_folder(Path(args.workdir), args.node)),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        barrier_timeout=WORKER_TIMEOUT,
        num_dataset_builder_threads=job.builder_threads,
    )
    builder = BlendedMegatronDatasetBuilder(GPTDataset, [job.samples, 0, 0], lambda: True, config)
    if args.profile:
        import cProfile

        with cProfile.Profile() as profile:
            train = builder.build()[0]
        profile.dump_stats(args.profile)
    else:
        train = builder.build()[0]
    first = train[args.rank % len(train)]["tokens"]
    done = time.time()
    sources = [train.index_source] + [d.index_source for d in train.datasets]
    report = {
        "rank": args.rank,
        "node": args.node,
        "seconds_to_first_batch": done - args.launched,
        "seconds_after_import": done - imported,
        "seconds_after_group": done - grouped,
        # the phases, from the launch: this script's first line, torch's import, the group
        "phases": {
            "start": STARTED - args.launched,
            "import": imported - STARTED,
            "group": grouped - imported,
            "datasets": done - grouped,
            "shared_cache": sum(s.seconds.get("shared", 0.0) for s in sources),
        },
        "first_tokens": first[:8].tolist(),
        "kinds": [s.kind for s in sources],
        "requests": dict(requests_sent),
    }
    Path(args.workdir, f"report-{args.rank}.json").write_text(json.dumps(report))
    if args.world:
        # every rank past the builder's last barrier before any leaves: rank 0 holds the
        # group's store, and a rank still polling it there (the machine loaded) found it gone
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", required=True, help="the Job as JSON (a file)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--launched", type=float, default=None, help="time.time() at launch")
    parser.add_argument("--world", type=int, default=0, help="gloo group size (0: none)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--hang-while-building", help="touch this file and hang in the build")
    parser.add_argument("--profile", help="write cProfile's statistics of the build to this file")
    args = parser.parse_args()
    if args.launched is None:
        args.launched = time.time()
    _worker(args)


if __name__ == "__main__":
    main()
