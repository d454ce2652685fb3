"""``mega preprocess --ray``: the input's shards tokenized by Ray tasks, merged in input order.

The driver cuts the input into shards (``shards.plan_shards``) and starts one Ray task per
shard. A task runs the one-machine pipeline (``tokenize_into``) on its shard into a folder of
its own under the shared storage, ``<storage>/<run>/<shard>-<attempt id>/``: a local path every
node sees, or any fsspec URL (the task then writes locally and uploads). In local storage
``<run>`` is ``<output name>.<driver pid>-<token>.partial``: the folder of a run whose driver was
killed (so its cleanup never ran) is removed by the next run of the same output. A task that
fails for a system reason (its worker killed, its node lost) is retried by Ray; a retry writes
to a new attempt folder, and the driver only ever reads the folder the successful attempt returned.
The driver merges the shards' pairs in shard order with ``add_index`` (``merging.merge``) into
the output, which appears under its final name only when complete: the bytes of a one-machine
run with the same flags. The first shard to fail ends the run: the other tasks are cancelled
and its error raised. The run's folder in the storage is deleted at the end, whatever
happened (and the default storage folder with it when nothing else is in it); a Ray session
the caller had started before is used and left running.

Progress: each task posts its running totals to one small actor, which the driver polls and
shows as one progress line for the whole run. The manifest lists the shards (file, byte range,
documents, tokens, attempts).

Ray is imported only here and only when used: ``pip install megafmt[ray]``. Every node needs
megafmt (and the tokenizer's library) installed; ``--ray-address`` or ``RAY_ADDRESS`` names
the cluster, else a local one is started with ``--workers`` CPUs, on 127.0.0.1. Ray binds some
of its services to every interface whatever address it is given: a local cluster found
listening beyond loopback (``listeners.exposed_listeners``) is shut down and the run refused,
naming the sockets, unless ``--ray-local-any-interface`` accepts it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

import fsspec
from fsspec.implementations.local import LocalFileSystem

from megafmt.atomic import partial_path, remove_stale_partials
from megafmt.errors import MegafmtError, PluginError
from megafmt.manifest import remove_manifest
from megafmt.merging import merge
from megafmt.preprocess.inputs import InputFile, expand_input
from megafmt.preprocess.listeners import exposed_listeners
from megafmt.preprocess.pipeline import (
    SHOWN_BAD_LINES,
    PreprocessConfig,
    PreprocessSummary,
    check_config,
    load_checked_tokenizer,
    new_progress,
    output_level,
    tokenize_into,
    write_manifests,
)
from megafmt.preprocess.shards import plan_shards
from megafmt.preprocess.writer import output_prefix_of

#: seconds between the driver's looks at the tasks' progress
POLL_SECONDS = 0.5
#: where a local cluster listens
LOOPBACK = "127.0.0.1"
#: Ray's retries of a task whose worker died
TASK_RETRIES = 3


@dataclass(frozen=True)
class RayOptions:
    """Where and how the shards are tokenized."""

    address: str | None = None
    """The cluster (``ray://...`` or ``host:port``); None: ``RAY_ADDRESS``, else a local
    cluster."""
    storage: str | None = None
    """Shared storage for the shards' pairs (a path every node sees, or an fsspec URL); None:
    ``<output_prefix>.shards`` beside the output."""
    shard_bytes: int = 256 << 20
    """About this much input per task (large plain jsonl files are cut on line starts)."""
    cpus_per_task: int = 1
    """Tokenizer processes inside each task."""
    allow_exposed_local: bool = False
    """Accept a local cluster whose services listen beyond loopback (they are printed); off,
    such a cluster is shut down and the run refused."""


class ProgressBoard:
    """A Ray actor: the latest running totals of each shard (a retry starts its shard over)."""

    def __init__(self) -> None:
        self.totals: dict[int, tuple[int, float, int]] = {}

    def post(self, shard: int, documents: int, megabytes: float, tokens: int) -> None:
        self.totals[shard] = (documents, megabytes, tokens)

    def sum(self) -> tuple[int, float, int]:
        columns = list(zip(*self.totals.values(), strict=True)) or [(0,), (0.0,), (0,)]
        return int(sum(columns[0])), float(sum(columns[1])), int(sum(columns[2]))


class BoardProgress:
    """A task's ``ProgressSink``: its shard's running totals, posted to the board about once a
    second."""

    def __init__(self, board: Any, shard: int) -> None:
        self.board, self.shard = board, shard
        self.documents, self.megabytes, self.tokens = 0, 0.0, 0
        self._last = 0.0

    def update(self, amount: float = 1, **also: float) -> None:
        self.documents += int(amount)
        self.megabytes += also.get("MB", 0.0)
        self.tokens += int(also.get("tokens", 0))
        if time.monotonic() - self._last >= 1.0:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        self.board.post.remote(self.shard, self.documents, self.megabytes, self.tokens)

    def close(self, summary: str | None = None) -> None:
        self.flush()


@dataclass(frozen=True)
class ShardResult:
    """What a successful task wrote: its pair per json key (prefixes in the shared storage,
    URLs there when it is remote) and its counts."""

    prefixes: dict[str, str]
    summary: PreprocessSummary


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def tokenize_shard(
    config: PreprocessConfig, shard: InputFile, index: int, storage: str, board: Any
) -> ShardResult:
    """One Ray task: the pipeline on ``shard`` into a new attempt folder under ``storage``."""
    fs, root = fsspec.core.url_to_fs(storage)
    folder = f"{root.rstrip('/')}/{index:06d}-{uuid.uuid4().hex[:12]}"
    fs.makedirs(folder, exist_ok=True)
    local = folder if _is_local(fs) else tempfile.mkdtemp(prefix="megafmt-shard-")
    try:
        shard_config = dataclasses.replace(
            config, output_prefix=os.path.join(local, "shard"), log_interval=1 << 62
        )
        tokenizer = load_checked_tokenizer(shard_config)
        progress = BoardProgress(board, index)
        summary = tokenize_into(
            shard_config, [shard], tokenizer, progress, in_process=config.workers == 1
        )
        progress.flush()
        prefixes = {}
        for key, prefix in summary.outputs.items():
            stored = f"{folder}/{os.path.basename(prefix)}"
            if not _is_local(fs):
                for suffix in (".bin", ".idx"):
                    fs.put_file(prefix + suffix, stored + suffix)
            prefixes[key] = stored
    finally:
        if not _is_local(fs):
            shutil.rmtree(local, ignore_errors=True)
    return ShardResult(prefixes, summary)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PluginError("mega preprocess --ray needs Ray: pip install 'megafmt[ray]'") from None
    return ray


class ExposedClusterError(MegafmtError, RuntimeError):
    """The local Ray cluster started for a run listens beyond loopback, and the run was not
    told to accept that."""


def _connect(ray: Any, address: str | None, workers: int, allow_exposed: bool = False) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), or start a local one for this
    machine alone; a local one whose services listen beyond loopback is shut down and refused
    (:class:`ExposedClusterError`, naming each socket) unless ``allow_exposed``, which prints
    them instead."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    before = set(exposed_listeners())
    ray.init(
        num_cpus=workers,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address=LOOPBACK,  # a local cluster serves this machine only
    )
    exposed = [found for found in exposed_listeners() if found not in before]
    if not exposed:
        return
    listed = ", ".join(exposed)
    if allow_exposed:
        print(f"mega preprocess --ray: the local Ray cluster listens on {listed}", file=sys.stderr)
        return
    ray.shutdown()
    raise ExposedClusterError(
        f"the local Ray cluster (Ray {ray.__version__}) listens beyond loopback, on {listed}: "
        "Ray binds these services to every interface whatever node address it is given. Pass "
        "--ray-address with a cluster you have secured, or --ray-local-any-interface to accept "
        "(Ray's token authentication guards the ports where it is on)"
    )


def _combine(results: list[ShardResult], outputs: dict[str, str]) -> PreprocessSummary:
    total = PreprocessSummary(dict(outputs))
    total.key_counts = {key: {"sequences": 0, "tokens": 0} for key in outputs}
    for result in results:
        part = result.summary
        total.documents += part.documents
        total.tokens += part.tokens
        total.input_bytes += part.input_bytes
        total.skipped_lines += part.skipped_lines
        total.first_skipped += part.first_skipped[: SHOWN_BAD_LINES - len(total.first_skipped)]
        for key, counts in part.key_counts.items():
            for name, value in counts.items():
                total.key_counts[key][name] += value
    return total


def _local_prefix(fs: fsspec.AbstractFileSystem, stored: str, scratch: str) -> str:
    """A stored shard pair's prefix on this machine (fetched into ``scratch`` when remote)."""
    if _is_local(fs):
        return stored
    local = os.path.join(scratch, os.path.basename(os.path.dirname(stored)))
    for suffix in (".bin", ".idx"):
        fs.get_file(stored + suffix, local + suffix)
    return local


def _attempts(fs: fsspec.AbstractFileSystem, root: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for path in fs.ls(root, detail=False):
        shard = int(os.path.basename(path.rstrip("/")).split("-", 1)[0])
        counts[shard] = counts.get(shard, 0) + 1
    return counts


def _wait_for_shards(
    ray: Any, pending: list[Any], shards: list[InputFile], board: Any, progress: Any
) -> list[ShardResult]:
    """The shards' results in input order, showing their progress meanwhile. The first task to
    fail (after Ray's retries) ends the wait at once: the others are cancelled (their workers
    stopped) and its error is raised, naming the shard in a note, not after every other shard
    has run to its end."""
    results: dict[int, ShardResult] = {}
    number = {ref: index for index, ref in enumerate(pending)}
    shown = (0, 0.0, 0)
    waiting = list(pending)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_SECONDS)
        for ref in done:
            try:
                results[number[ref]] = ray.get(ref)
            except ray.exceptions.RayError as error:  # a task's error, or its worker lost
                for other in waiting:
                    ray.cancel(other, force=True)
                shard = shards[number[ref]]
                task_error = isinstance(error, ray.exceptions.RayTaskError)
                cause = error.as_instanceof_cause() if task_error else error
                cause.add_note(
                    f"in Ray shard {number[ref]} of {len(shards)} ({shard.path}, bytes "
                    f"{shard.start} to {shard.size if shard.end is None else shard.end}); "
                    f"{len(waiting)} unfinished shards were cancelled"
                )
                raise cause from None
        now = ray.get(board.sum.remote())
        progress.update(now[0] - shown[0], MB=now[1] - shown[1], tokens=now[2] - shown[2])
        shown = now
    return [results[index] for index in range(len(pending))]


def run_folder_stem(config: PreprocessConfig) -> str:
    """What the name of a run's folder in the storage starts with: the output's name. In local
    storage it is a ``*.partial`` name of the driver's process, so a run killed before its
    cleanup leaves a folder the next run of the same output removes."""
    return os.path.basename(config.output_prefix)


def preprocess_on_ray(
    config: PreprocessConfig, options: RayOptions, stream: TextIO | None = None
) -> PreprocessSummary:
    """``preprocess`` with the shards tokenized by Ray tasks; the same output bytes."""
    check_config(config)
    if config.partitions > 1 and not config.keep_sequential_samples:
        raise ValueError(
            f"--ray with --partitions {config.partitions}: shards merge in input order, which "
            "round-robin partitions do not keep; leave --partitions at 1 (or add "
            "--keep-sequential-samples, which gives input order)"
        )
    ray = _import_ray()
    inputs = expand_input(config.input)
    tokenizer = load_checked_tokenizer(config)
    shards = plan_shards(inputs, options.shard_bytes)
    storage = options.storage or config.output_prefix + ".shards"
    if "://" not in storage:  # the tasks' working folders are not the driver's
        storage = os.path.abspath(storage)
    fs, base = fsspec.core.url_to_fs(storage)
    # this run's own folder: nothing else under the storage is touched but the folders of
    # killed runs of the same output on this machine (their driver process is gone)
    if _is_local(fs):
        name = os.path.basename(partial_path(os.path.join(base, run_folder_stem(config))))
        remove_stale_partials(os.path.join(base, run_folder_stem(config)))
    else:
        name = f"{run_folder_stem(config)}-{uuid.uuid4().hex[:12]}"
    root = f"{base.rstrip('/')}/{name}"
    run_storage = f"{storage.rstrip('/')}/{name}"
    # a session the caller started is used and left running; else one is joined or started,
    # before any folder (a failure leaves none), and shut down at the end
    owned = not ray.is_initialized()
    if owned:
        _connect(ray, options.address, config.workers, options.allow_exposed_local)
    progress = new_progress(config, stream)
    try:
        fs.makedirs(root, exist_ok=True)
        board = ray.remote(num_cpus=0)(ProgressBoard).remote()
        task = ray.remote(num_cpus=options.cpus_per_task, max_retries=TASK_RETRIES)(tokenize_shard)
        shard_config = dataclasses.replace(config, workers=options.cpus_per_task)
        pending = [
            task.remote(shard_config, shard, index, run_storage, board)
            for index, shard in enumerate(shards)
        ]
        results = _wait_for_shards(ray, pending, shards, board, progress)
        level = output_level(config)
        summary = _combine(
            results,
            {key: output_prefix_of(config.output_prefix, key, level) for key in config.json_keys},
        )
        attempts = _attempts(fs, root)
        os.makedirs(os.path.dirname(os.path.abspath(config.output_prefix)), exist_ok=True)
        for key, prefix in summary.outputs.items():
            remove_manifest(prefix)
            with tempfile.TemporaryDirectory(prefix="megafmt-merge-") as scratch:
                merge(
                    prefix,
                    [_local_prefix(fs, r.prefixes[key], scratch) for r in results],
                    overwrite=True,
                )
        summary.elapsed = progress.elapsed
        write_manifests(
            config,
            tokenizer,
            summary,
            inputs,
            ray={"address": options.address or os.environ.get("RAY_ADDRESS") or "local"},
            shards=[
                {
                    "path": shard.path,
                    "start": shard.start,
                    "end": shard.size if shard.end is None else shard.end,
                    "documents": result.summary.documents,
                    "tokens": result.summary.tokens,
                    "attempts": attempts.get(index, 1),
                }
                for index, (shard, result) in enumerate(zip(shards, results, strict=True))
            ],
        )
    except BaseException:
        progress.close("")
        raise
    finally:
        if owned:
            ray.shutdown()
        if fs.exists(root):
            fs.rm(root, recursive=True)
        if options.storage is None and fs.exists(base) and not fs.ls(base, detail=False):
            fs.rmdir(base)  # the default folder, named after the output, is this run's too
    progress.close(summary.describe())
    return summary
