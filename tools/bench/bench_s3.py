"""Reading a corpus from S3: megafmt's fsspec reader against megatron-core's (or the seed
commit's) S3 reader.

    .venv/bin/python tools/bench/bench_s3.py [--megabytes 64] [--chunk-kib 1024] [--samples 400]
        [--reference megatron-core|seed] [--rows FILE]

Both read the same corpus from the same S3 endpoint (moto's server on loopback, started here in
a process of its own) with the same chunk size, twice: from moto as shipped, and from moto made
S3-like for timing (``--latency-ms`` before each GET's answer, many answered at once, ranges cut
in place; see ``moto_endpoint`` in ``testing/s3testing.py``). moto as shipped copies the whole
object for every ranged GET, one at a time per object, so its figures measure moto as much as the
readers. Measured: random samples of ``--seq-length`` + 1 tokens (a
GPTDataset's reads: a random document and offset) and a sequential scan of every sequence;
the local mmap reader gives the scale. megafmt's chunk cache is capped below the corpus size
(``--cache-mib``), so the random figure is not the corpus sitting in memory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))  # s3testing
warnings.filterwarnings("ignore")
import boto3  # noqa: E402
from megatron.core.datasets import indexed_dataset as megatron  # noqa: E402
from megatron.core.datasets.object_storage_utils import S3Config  # noqa: E402
from s3testing import moto_endpoint  # noqa: E402

from megafmt import IndexedDataset, IndexedDatasetBuilder  # noqa: E402


def write_corpus(prefix: str, megabytes: float, seed: int = 0) -> None:
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    pool = [rng.integers(0, 50000, n).astype(numpy.uint16) for n in rng.integers(200, 8000, 512)]
    written, i = 0, 0
    while written < megabytes * 1e6:
        tokens = pool[i % len(pool)]
        builder.add_document(tokens, [len(tokens)])
        written += tokens.nbytes
        i += 1
    builder.finalize(prefix + ".idx")


def random_reads(
    dataset, lengths, samples: int, seq: int, plan: int = 0, seed: int = 1
) -> tuple[float, int]:
    """Seconds for ``samples`` reads of ``seq`` + 1 tokens at random places (within a
    sequence, as long as it allows), and the tokens read. With ``plan`` the dataset is told the
    next ``plan`` reads ahead of time, as a loader that knows its sampler's order would."""
    rng = numpy.random.default_rng(seed)
    reads = []
    for i in rng.integers(0, len(lengths), samples):
        size = int(lengths[i])
        length = min(seq + 1, size)
        reads.append((int(i), int(rng.integers(0, size - length + 1)), length))
    total = 0
    start = time.perf_counter()
    for number, read in enumerate(reads):
        if plan and number % plan == 0:
            dataset.prefetch(reads[number : number + 2 * plan])
        total += dataset.get(*read).size
    return time.perf_counter() - start, total


def scan(dataset, count: int) -> float:
    start = time.perf_counter()
    for i in range(count):
        dataset[i]
    return time.perf_counter() - start


def measure(
    report: benchreport.Report, args: argparse.Namespace, local: str, work: Path, endpoint: str
) -> None:
    """Every reader's random and scan figures against the endpoint now running."""
    chunk = args.chunk_kib << 10
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    for suffix in (".bin", ".idx"):
        client.upload_file(local + suffix, "bench", "corpus" + suffix)
    url = "s3://bench/corpus"
    here = IndexedDataset(local)
    lengths = here.sequence_lengths
    theirs = megatron.IndexedDataset(
        url,
        mmap=False,
        object_storage_config=S3Config(
            path_to_idx_cache=str(work / endpoint / "megatron_cache"), bin_chunk_nbytes=chunk
        ),
    )
    options = {
        "chunk_bytes": chunk,
        "cache_bytes": args.cache_mib << 20,
        "idx_cache_dir": str(work / endpoint / "megafmt_cache"),
    }
    ours = IndexedDataset(url, reader_options=options)
    planned = IndexedDataset(url, reader_options=options)
    conditions = (
        f"{endpoint}; corpus {args.megabytes:g} MB, chunk {args.chunk_kib} KiB, megafmt cache "
        f"{args.cache_mib} MiB"
    )
    report.heading(f"S3: {conditions}")
    runs = (
        ("local mmap", here, 0),
        ("reference", theirs, 0),
        ("megafmt fsspec", ours, 0),
        ("megafmt fsspec + plan", planned, args.plan),
    )
    rates = {}
    for name, dataset, plan in runs:
        seconds, tokens = random_reads(dataset, lengths, args.samples, args.seq_length, plan)
        rates[name] = args.samples / seconds
        report.note(
            f"random  {name:<22} {rates[name]:9.1f} samples/s  {tokens * 2 / seconds / 1e6:8.1f} "
            "MB/s"
        )
    random_conditions = f"{conditions}; {args.samples} samples of {args.seq_length + 1} tokens"
    for name, how in (("megafmt fsspec", ""), ("megafmt fsspec + plan", ", reads planned")):
        report.compare(
            f"S3 random samples{how}, {endpoint}",
            ours=rates[name],
            theirs=rates["reference"],
            unit="samples/s",
            higher_is_better=True,
            conditions=random_conditions + (f"; {args.plan} reads announced ahead" if how else ""),
        )
    scans = {}
    for name, dataset, _ in runs[:3]:
        scans[name] = args.megabytes / scan(dataset, len(lengths))
        report.note(f"scan    {name:<22} {scans[name]:9.1f} MB/s")
    report.compare(
        f"S3 sequential scan, {endpoint}",
        ours=scans["megafmt fsspec"],
        theirs=scans["reference"],
        unit="MB/s",
        higher_is_better=True,
        conditions=f"{conditions}; every sequence in order",
    )
    report.note(f"megafmt retries {ours.bin_reader.retries + planned.bin_reader.retries}")


def main() -> None:
    parser = benchreport.parser(__doc__)
    parser.add_argument("--megabytes", type=float, default=64)
    parser.add_argument("--chunk-kib", type=int, default=1024)
    parser.add_argument("--cache-mib", type=int, default=16)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--plan", type=int, default=8, help="reads announced ahead")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20,
        help="first-byte latency of the S3-like endpoint (measured after moto as shipped)",
    )
    args = parser.parse_args()
    report = benchreport.Report("s3", REFERENCE, args.rows)
    work = Path(tempfile.mkdtemp(prefix="bench_s3"))
    try:
        local = str(work / "corpus")
        write_corpus(local, args.megabytes)
        print(
            f"corpus {args.megabytes:.0f} MB, {len(IndexedDataset(local)):,} sequences; chunk "
            f"{args.chunk_kib} KiB; megafmt cache {args.cache_mib} MiB; samples of "
            f"{args.seq_length + 1} tokens",
            flush=True,
        )
        endpoints = (
            ("moto as shipped", None),
            (f"moto S3-like: {args.latency_ms:g} ms to first byte", args.latency_ms / 1000),
        )
        for endpoint, latency in endpoints:
            with moto_endpoint(separate_process=True, first_byte_latency=latency):
                measure(report, args, local, work, endpoint)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
