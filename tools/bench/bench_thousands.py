"""Thousands of corpora on many nodes: a blend's cold build and cache hit, and a warm start of
many processes from a cache in object storage.

    .venv/bin/python tools/bench/bench_thousands.py [--corpora 2400] [--samples 200000]
        [--shapes small,pretraining] [--nodes 8] [--per-node 8]
        [--warm-corpora 4] [--builder-threads 1] [--warm-only]
        [--blend-only] [--cache-root DIR] [--reference megatron-core] [--rows FILE]

1. The blends: ``--corpora`` corpora of each of ``--shapes`` (both by default), their document
   counts spread log-uniformly, one-sequence documents of uint16 tokens (an ``.idx`` and a sparse
   ``.bin`` each), weighted by their token counts. ``small``: 1 to 10,000 documents of 1..199
   tokens, ``--samples`` training samples of 4096 tokens (3 epochs of the blend at the default
   200,000; each corpus's own work is most of the build: the least favourable case).
   ``pretraining``: a pretraining blend's shape scaled to this machine, 1 to 100,000 documents of
   1..1,999 tokens (21 billion tokens), asked for 95 % of one epoch of the blend (each corpus
   read about once). Each side (megaindex, the reference) builds each blend, on
   ``--builder-threads`` threads (``num_dataset_builder_threads``), in a fresh process with an
   empty cache (cold build: twice each, in the order theirs, ours, ours, theirs, the better of
   the two reported, since creating files slows down for minutes after many were deleted; the
   runs start once two probes of 400 file creations in a row cost at most 100 us each, at most 2
   minutes), then opens it again in another (cache hit): seconds from the builder's start to the
   datasets in hand (imports excluded), the process's peak RSS (whole, and above what it held
   once its imports were done: torch's are most of it on both sides), and the most open file
   descriptors seen (sampled every 5 ms from /proc/self/fd). megaindex's first cold build also
   checks each corpus at its first open and notes those of more than 4,096 sequences (233 of the
   small shape's 2,400; megafmt's notes, in a folder of the run's: ``MEGA_CACHE_DIR``; a smaller
   one is checked at every open); a second cold build into an empty cache folder, the corpora
   checked before, is the case of a new mix over corpora a machine has read already.
   ``--cache-root`` puts the caches in another folder: on a tmpfs (``/dev/shm/...``) the figures
   leave the disk's file creations out (this VM's ext4 swings them by 10x). Then the blending
   indices alone (the blend's two tables), each side's helper in this process: 2,400 and 20,000
   corpora, weights spread as the blend's, and equal; and 2,400 corpora weighted by their sizes
   (every sample drawn once).
2. The warm start (megaindex only: the references have no cache in object storage): the tables
   of a blend of ``--warm-corpora`` corpora (made as above) are put in S3 (moto's server in a
   process of its own, on loopback) by a cold start, then ``--nodes`` x ``--per-node``
   processes, one gloo group, each node with an empty local cache folder, start together
   (testing/sharednodes.py, ``--builder-threads`` as ``num_dataset_builder_threads``): the
   seconds to the first sample on the slowest and the median rank, from the launch (torch's
   import included: every rank imports it) and from the end of the group's start, and the
   requests each node sent, by kind. ``--warm-only`` skips part 1, ``--blend-only`` part 2.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testing"))  # test support: moto's endpoint, the node harness
from bench_scale import peak_rss_mib  # noqa: E402  (a sibling benchmark's helper)
from s3testing import free_port  # noqa: E402

WORKDIR = ROOT / "build" / "bench_thousands"
VOCAB = 50000
SEQUENCE_LENGTH = 4096
FD_SAMPLE_SECONDS = 0.005
WARM_START_TIMEOUT = 1800  # seconds a warm start's rank may take, from the launch


@dataclass(frozen=True)
class CorpusShape:
    """The corpora of a blend: document counts spread log-uniformly from 1 to ``largest``,
    documents of 1 to ``longest`` tokens (uniform)."""

    name: str
    largest: int
    longest: int
    what: str
    """The shape in words, for the report."""


#: ``small``: thousands of small corpora (the cost of each corpus's own work, the least
#: favourable case); ``pretraining``: a pretraining blend's shape scaled to this machine (21
#: billion tokens in 21 million documents of 1..1,999 tokens, 1 to 100,000 documents a corpus),
#: asked for 95 % of one epoch of the blend: with megatron-core's 0.5 % surplus each corpus is
#: read about once (the smallest, of a few documents, more often: a sample takes 4,097 tokens)
SHAPES = {
    "small": CorpusShape("small", 10_000, 199, "1..10,000 documents of 1..199 tokens"),
    "pretraining": CorpusShape(
        "pretraining", 100_000, 1_999, "1..100,000 documents of 1..1,999 tokens"
    ),
}
PRETRAINING_EPOCH_SHARE = 0.95
LARGEST = SHAPES["small"].largest  # documents of the small shape's largest corpus


def write_corpora(
    folder: Path, count: int, shape: CorpusShape = SHAPES["small"]
) -> tuple[list[str], list[float]]:
    """``count`` corpora of ``shape``; their prefixes and token counts (the blend's
    weights)."""
    from megafmt import IndexWriter

    rng = numpy.random.default_rng(0)
    documents = numpy.exp(rng.uniform(0, numpy.log(shape.largest), count)).astype(int).clip(1)
    folder.mkdir(parents=True, exist_ok=True)
    prefixes, weights = [], []
    for number, size in enumerate(documents):
        prefix = str(folder / f"c{number:05d}")
        lengths = rng.integers(1, shape.longest + 1, int(size), dtype=numpy.int32)
        with open(prefix + ".idx", "wb") as stream:
            IndexWriter(numpy.uint16).write(stream, lengths, numpy.arange(int(size) + 1))
        tokens = int(lengths.sum(dtype=numpy.int64))
        with open(prefix + ".bin", "wb") as stream:
            stream.truncate(tokens * 2)
        prefixes.append(prefix)
        weights.append(float(tokens))
    return prefixes, weights


SETTLE_PROBE_FILES = 400  # files created per probe of the file system's speed
SETTLE_SECONDS = 120.0  # the longest the benchmark waits for the file system to settle
#: what creating a file costs on this machine's ext4 volume at rest (20 to 70 us; 300 to 800 us
#: for a while after many files were deleted)
SETTLED_CREATE_US = 100.0


def settle_file_system(folder: Path) -> float:
    """Wait until creating a file costs at most SETTLED_CREATE_US twice in a row, at most
    SETTLE_SECONDS: after many files were deleted (the run before) it costs up to 20 times more
    for a while. The microseconds per file creation of the last probe."""
    deadline = time.monotonic() + SETTLE_SECONDS
    costs: list[float] = []
    while True:
        probe = folder / f"probe-{len(costs)}"
        probe.mkdir(parents=True)
        start = time.perf_counter()
        for number in range(SETTLE_PROBE_FILES):
            os.close(os.open(probe / str(number), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        costs.append((time.perf_counter() - start) / SETTLE_PROBE_FILES * 1e6)
        settled = len(costs) >= 2 and max(costs[-2:]) <= SETTLED_CREATE_US
        if settled or time.monotonic() > deadline:
            print(
                f"  creating a file: {', '.join(f'{cost:.0f}' for cost in costs)} us"
                + ("" if settled else f" (not settled after {SETTLE_SECONDS:.0f} s)"),
                file=sys.stderr,
            )
            return costs[-1]
        time.sleep(2.0)


class DescriptorWatch:
    """The most file descriptors this process held at once, sampled on a thread."""

    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(FD_SAMPLE_SECONDS):
            self.most = max(self.most, len(os.listdir("/proc/self/fd")))

    def __enter__(self) -> DescriptorWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, len(os.listdir("/proc/self/fd")))


def child(side: str, blend_file: str, cache: str, samples: int, threads: int) -> None:
    """One side's build or cache hit of the blend in this fresh process; prints JSON."""
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    if side == "megatron":
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    else:
        from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    import torch
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    # megatron-core's BlendedDataset asks for the rank unguarded: a group of one on both sides
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    prefixes, weights = json.loads(Path(blend_file).read_text())
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQUENCE_LENGTH,
        blend=(prefixes, weights),
        split="100,0,0",
        tokenizer=NullTokenizer(VOCAB),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        num_dataset_builder_threads=threads,
    )
    baseline = peak_rss_mib()
    with DescriptorWatch() as descriptors:
        start = time.perf_counter()
        train = BlendedMegatronDatasetBuilder(
            GPTDataset, [samples, 0, 0], lambda: True, config
        ).build()[0]
        train[0]
        seconds = time.perf_counter() - start
    answer = {
        "seconds": seconds,
        "peak_mib": peak_rss_mib(),
        "baseline_mib": baseline,
        "descriptors": descriptors.most,
        "samples": len(train),
    }
    torch.distributed.destroy_process_group()
    print(json.dumps(answer))


def bench_blend(
    report: benchreport.Report,
    corpora: int,
    samples: int | None,
    threads: int,
    cache_root: Path,
    shape: CorpusShape,
) -> None:
    """The cold builds and cache hits of a blend of ``corpora`` corpora of ``shape``, asked for
    ``samples`` samples (None: :data:`PRETRAINING_EPOCH_SHARE` of one epoch)."""
    start = time.perf_counter()
    folder = WORKDIR / shape.name
    prefixes, weights = write_corpora(folder / "corpora", corpora, shape)
    print(
        f"  {corpora} corpora ({shape.what}) written in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    epoch = int(sum(weights)) // (SEQUENCE_LENGTH + 1)
    if samples is None:
        samples = int(epoch * PRETRAINING_EPOCH_SHARE)
    blend_file = folder / "blend.json"
    blend_file.write_text(json.dumps([prefixes, weights]))
    os.sync()
    creation_us = settle_file_system(cache_root / f"probes-{shape.name}")
    where = "" if cache_root == WORKDIR else f"; the caches in {cache_root}"
    conditions = (
        f"{corpora} corpora of {shape.what} (log-uniform counts), {samples} samples of "
        f"{SEQUENCE_LENGTH} ({samples / epoch:.2f} epochs of the blend), {threads} builder "
        f"thread{'s' * (threads > 1)}; fresh process each, imports excluded; cold builds: the "
        f"better of two, run theirs, ours, ours, theirs; a file creation cost {creation_us:.0f} "
        f"us before{where}"
    )
    blend = "the blend" if shape.name == "small" else f"the {shape.name} blend"

    def run(side: str, cache: str, notes: str = "notes-1") -> dict:
        # megafmt's notes of the corpora it checked at their first open (those above 4,096
        # sequences), in a folder of this run's: a cold build with new notes checks each
        # corpus (megatron-core checks none)
        os.environ["MEGA_CACHE_DIR"] = str(folder / notes)
        # what the run before left to write back (the corpora, the other side's cache) is
        # written first, not during this one
        os.sync()
        return benchreport.child_json(
            __file__,
            side,
            blend_file,
            str(cache_root / f"{shape.name}-{cache}"),
            samples,
            threads,
            "--reference",
            REFERENCE,
        )

    # Each cold build twice, theirs, ours, ours, theirs: creating files slows down for minutes
    # after many were deleted (the run before, the corpora of this one), and each side meets
    # the same drift. Every build writes a new cache folder (nothing is deleted meanwhile).
    theirs_runs = [run("megatron", "cache-megatron-1")]
    ours_runs = [
        run("megaindex", "cache-megaindex-1"),
        run("megaindex", "cache-megaindex-2", "notes-2"),
    ]
    theirs_runs.append(run("megatron", "cache-megatron-2"))
    ours_cold = min(ours_runs, key=lambda answer: answer["seconds"])
    theirs_cold = min(theirs_runs, key=lambda answer: answer["seconds"])
    # a new mix over corpora this machine has read: the notes of the larger ones are there
    ours_cold_again = run("megaindex", "cache-megaindex-3")
    ours_hit, theirs_hit = (
        run("megaindex", "cache-megaindex-1"),
        run("megatron", "cache-megatron-1"),
    )
    print(
        f"  cold builds of {blend} (s): megaindex "
        + ", ".join(f"{answer['seconds']:.2f}" for answer in ours_runs)
        + "; megatron-core "
        + ", ".join(f"{answer['seconds']:.2f}" for answer in theirs_runs),
        file=sys.stderr,
    )
    if ours_cold["samples"] != theirs_cold["samples"]:
        raise RuntimeError(f"the blends differ in length: {ours_cold} vs {theirs_cold}")
    pairs = (
        (f"cold build of {blend}", ours_cold, theirs_cold),
        (f"cold build of {blend}, its corpora checked before", ours_cold_again, theirs_cold),
        (f"cache hit of {blend}", ours_hit, theirs_hit),
    )
    for label, ours, theirs in pairs:
        for side in (ours, theirs):
            side["above_imports_mib"] = side["peak_mib"] - side["baseline_mib"]
        for figure, key, unit in (
            ("", "seconds", "s"),
            (": peak RSS", "peak_mib", "MiB"),
            (": peak RSS above the imports", "above_imports_mib", "MiB"),
            (": most open files", "descriptors", "fds"),
        ):
            report.compare(
                f"{label}{figure}",
                ours=ours[key],
                theirs=theirs[key],
                unit=unit,
                conditions=conditions,
            )


#: (corpora, samples) of the blending indices compared: this benchmark's blend, and a mix ten
#: times wider
BLENDING_CASES = ((2400, 200_000), (20_000, 300_000))


def bench_blending(report: benchreport.Report) -> None:
    """The blending indices alone (BlendedDataset's two tables), from each side's helper in
    this process: weights spread over four orders of magnitude (as the blend's), and equal;
    and a blend weighted by its corpora's sizes (no weights given: every sample drawn once)."""
    try:
        from megatron.core.datasets import helpers_cpp
    except ImportError as error:  # the seed commit's helpers are compiled on first use
        print(f"  blending indices skipped: the reference's helper ({error})", file=sys.stderr)
        return
    from megaindex import helpers

    def compare(figure: str, function: str, samples: int, conditions: str, *arguments) -> None:
        """Time each side's ``function`` filling tables of ``samples``; they must be equal."""
        seconds, tables = {}, {}
        for side, module in (("ours", helpers), ("theirs", helpers_cpp)):
            index = numpy.zeros(samples, numpy.int16)
            sample = numpy.zeros(samples, numpy.int64)
            start = time.perf_counter()
            getattr(module, function)(index, sample, *arguments)
            seconds[side], tables[side] = time.perf_counter() - start, (index, sample)
        if not all(map(numpy.array_equal, tables["ours"], tables["theirs"])):
            raise RuntimeError(f"{figure}: the two sides' tables differ")
        report.compare(
            figure, ours=seconds["ours"], theirs=seconds["theirs"], unit="s", conditions=conditions
        )

    for corpora, samples in BLENDING_CASES:
        rng = numpy.random.default_rng(corpora)
        for kind, weights in (
            ("spread", numpy.exp(rng.uniform(0, numpy.log(LARGEST), corpora))),
            ("equal", numpy.ones(corpora)),
        ):
            compare(
                f"blending indices of {corpora} corpora, {kind} weights",
                "build_blending_indices",
                samples,
                f"{samples} samples; each side's helper in one process, equal tables",
                weights / weights.sum(),
                corpora,
                samples,
                False,
            )
    corpora = BLENDING_CASES[0][0]
    sizes = numpy.exp(numpy.random.default_rng(0).uniform(0, numpy.log(1000), corpora))
    sizes = sizes.astype(numpy.int64) + 1
    compare(
        f"exhaustive blending indices of {corpora} corpora (weighted by their sizes)",
        "build_exhaustive_blending_indices",
        int(sizes.sum()),
        f"{int(sizes.sum())} samples, 1 to 1,000 per corpus (log-uniform)",
        sizes,
        corpora,
    )


def bench_warm_start(
    report: benchreport.Report, nodes: int, per_node: int, count: int, threads: int
) -> None:
    import boto3
    from s3testing import moto_endpoint
    from sharednodes import Job, launch

    folder = WORKDIR / "warm"
    corpora, weights = write_corpora(folder / "corpora", count)
    job = Job("s3://shared/cache", corpora, weights, samples=2000, builder_threads=threads)
    with moto_endpoint(separate_process=True):
        boto3.client("s3").create_bucket(Bucket="shared")
        launch(job, folder / "cold", 1, 1)  # fills the store
        start = time.perf_counter()
        # 64 imports of torch on a loaded 2-core machine outlast launch's default 600 s
        reports = launch(job, folder / "start", nodes, per_node, timeout=WARM_START_TIMEOUT)
        wall = time.perf_counter() - start
    launched = sorted(r["seconds_to_first_batch"] for r in reports)
    grouped = sorted(r["seconds_after_group"] for r in reports)
    imports = sorted(r["phases"]["import"] for r in reports)
    per_node_requests = [
        dict(sum((Counter(r["requests"]) for r in reports if r["node"] == node), Counter()))
        for node in range(nodes)
    ]
    fetching = [
        len([r for r in reports if r["node"] == node and sum(r["requests"].values())])
        for node in range(nodes)
    ]
    conditions = (
        f"{nodes} nodes x {per_node} processes, gloo, moto S3 on loopback, {count} corpora "
        f"({count + 1} cache entries), {threads} builder threads"
    )
    report.note(
        f"warm start ({conditions}): first batch {launched[-1]:.1f} s (slowest rank) / "
        f"{median(launched):.1f} s (median) after the launch, {grouped[-1]:.1f} / "
        f"{median(grouped):.1f} s after the group's start; torch's import {imports[-1]:.1f} / "
        f"{median(imports):.1f} s; launch to exit {wall:.1f} s; requests per node "
        f"{per_node_requests}; processes that sent any, per node {fetching}; tables built "
        f"{sum('built' in r['kinds'] for r in reports)}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
        return
    parser = benchreport.parser(__doc__)
    parser.add_argument("--corpora", type=int, default=2400)
    parser.add_argument("--samples", type=int, default=200_000, help="of the small corpora's blend")
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help="the blends' corpus shapes, among " + ", ".join(SHAPES),
    )
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--warm-corpora", type=int, default=4, help="corpora of the warm start")
    parser.add_argument("--builder-threads", type=int, default=1, help="in both parts")
    parser.add_argument(
        "--cache-root",
        type=Path,
        default=WORKDIR,
        help="the folder of the blend's caches (a tmpfs such as /dev/shm/x: the file system "
        "out of the cold builds); emptied before and after",
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--warm-only", action="store_true", help="only the warm start")
    only.add_argument("--blend-only", action="store_true", help="only the blend (part 1)")
    args = parser.parse_args()
    report = benchreport.Report("thousands", REFERENCE, args.rows)
    roots = dict.fromkeys((WORKDIR, args.cache_root))
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    try:
        if not args.warm_only:
            for name in args.shapes.split(","):
                if name not in SHAPES:
                    parser.error(f"--shapes: {name!r} is none of {', '.join(SHAPES)}")
                samples = args.samples if name == "small" else None
                bench_blend(
                    report,
                    args.corpora,
                    samples,
                    args.builder_threads,
                    args.cache_root,
                    SHAPES[name],
                )
            bench_blending(report)
        if not args.blend_only:
            bench_warm_start(
                report, args.nodes, args.per_node, args.warm_corpora, args.builder_threads
            )
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
