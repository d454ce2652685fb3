"""megafmt against megatron-core, side by side in one process, on the same files.

    .venv/bin/python tools/bench/bench_megafmt.py [--tokens 200e6] [--documents 400e3]

Measures random ``get()`` reads (both readers), builder throughput writing a corpus of
``--tokens`` tokens in ``--documents`` documents (finalize included), and merging a corpus of
``--merge-documents`` documents (``add_index`` + ``finalize``). Prints each time and the speedup
(megatron-core's time divided by megafmt's). Files go to ``build/bench`` and are deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy

warnings.filterwarnings("ignore")
import torch  # noqa: E402  (megatron-core needs it; imported after silencing its warnings)
from megatron.core.datasets import indexed_dataset as megatron  # noqa: E402

import megafmt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def best_of(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def report(name: str, theirs: float, ours: float, unit: str = "s") -> None:
    print(
        f"{name:<46} megatron-core {theirs:9.3f} {unit}   megafmt {ours:9.3f} {unit}   "
        f"speedup {theirs / ours:6.2f}x",
        flush=True,
    )


def document_pool(rng: numpy.random.Generator, mean_length: int, dtype: type) -> list:
    """Distinct documents reused in turn, so generating tokens does not dominate the timing."""
    lengths = rng.integers(1, 2 * mean_length, 4096)
    return [rng.integers(0, 50000, n).astype(dtype) for n in lengths]


def build_corpus(module, prefix: str, pool: list, documents: int) -> None:
    builder = module.IndexedDatasetBuilder(prefix + ".bin", dtype=pool[0].dtype.type)
    size = len(pool)
    for i in range(documents):
        tokens = pool[i % size]
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")


def timed_build(module, prefix: str, pool: list, documents: int) -> float:
    """Seconds to build, finalize included, starting with no dirty pages from earlier runs."""
    os.sync()
    start = time.perf_counter()
    build_corpus(module, prefix, pool, documents)
    return time.perf_counter() - start


def bench_builder(workdir: Path, tokens: float, documents: int, dtype: type, repeats: int) -> None:
    pool = document_pool(numpy.random.default_rng(0), int(tokens / documents), dtype)
    written = sum(len(pool[i % len(pool)]) for i in range(documents))
    times: dict[str, list[float]] = {"megatron": [], "megafmt": []}
    for _ in range(repeats):  # alternate, so neither side always runs on a warmer page cache
        for name, module in (("megatron", megatron), ("megafmt", megafmt)):
            prefix = str(workdir / f"build_{name}")
            times[name].append(timed_build(module, prefix, pool, documents))
        for suffix in (".bin", ".idx"):
            with (
                open(workdir / f"build_megatron{suffix}", "rb") as a,
                open(workdir / f"build_megafmt{suffix}", "rb") as b,
            ):
                assert a.read() == b.read(), f"the two builders wrote different {suffix} files"
        for name in times:
            for suffix in (".bin", ".idx"):
                os.remove(workdir / f"build_{name}{suffix}")
    label = f"build {written / 1e6:.0f}M tokens, {documents / 1e3:.0f}k docs, {dtype.__name__}"
    report(label, min(times["megatron"]), min(times["megafmt"]))


def bench_merge(workdir: Path, documents: int) -> None:
    """Merge one corpus of ``documents`` one-token documents: index-bound work."""
    source = str(workdir / "many_docs")
    with open(source + ".idx", "wb") as stream:
        megafmt.IndexWriter(numpy.uint16).write(
            stream, numpy.ones(documents, numpy.int32), numpy.arange(documents + 1)
        )
    with open(source + ".bin", "wb") as stream:
        stream.truncate(documents * 2)
    times = {}
    for name, module in (("megatron", megatron), ("megafmt", megafmt)):
        out = str(workdir / f"merged_{name}")
        start = time.perf_counter()
        builder = module.IndexedDatasetBuilder(out + ".bin", dtype=numpy.uint16)
        builder.add_index(source)
        builder.finalize(out + ".idx")
        times[name] = time.perf_counter() - start
    with (
        open(str(workdir / "merged_megatron.idx"), "rb") as a,
        open(str(workdir / "merged_megafmt.idx"), "rb") as b,
    ):
        assert a.read() == b.read()
    report(
        f"merge (add_index + finalize) {documents / 1e6:.0f}M docs",
        times["megatron"],
        times["megafmt"],
    )


def bench_reads(workdir: Path, reads: int) -> None:
    rng = numpy.random.default_rng(1)
    prefix = str(workdir / "reads")
    build_corpus(megafmt, prefix, document_pool(rng, 800, numpy.uint16), 50_000)
    theirs = {
        True: megatron.IndexedDataset(prefix),
        False: megatron.IndexedDataset(prefix, mmap=False),
    }
    ours = {True: megafmt.IndexedDataset(prefix), False: megafmt.IndexedDataset(prefix, mmap=False)}
    lengths = ours[True].sequence_lengths
    picks = rng.integers(0, len(lengths), reads)
    offsets = (rng.random(reads) * lengths[picks] / 2).astype(numpy.int64)
    counts = (lengths[picks] - offsets) // 2
    triples = list(zip(picks.tolist(), offsets.tolist(), counts.tolist(), strict=True))
    for mmap in (True, False):
        n = reads if mmap else reads // 10  # megatron-core's file reader opens the file per read
        sample = triples[:n]
        for a, b in zip(sample[:100], sample[:100], strict=True):
            numpy.testing.assert_array_equal(theirs[mmap].get(*a), ours[mmap].get(*b))

        def read(dataset, sample=sample):
            return lambda: [dataset.get(i, o, c) for i, o, c in sample]

        report(
            f"random get() x{n // 1000}k, {'mmap' if mmap else 'file'} reader (us/read)",
            best_of(3, read(theirs[mmap])) / n * 1e6,
            best_of(3, read(ours[mmap])) / n * 1e6,
            unit="us",
        )
        whole = [i for i, _, _ in sample]
        report(
            f"random [i] x{n // 1000}k, {'mmap' if mmap else 'file'} reader (us/read)",
            best_of(3, lambda d=theirs[mmap], w=whole: [d[i] for i in w]) / n * 1e6,
            best_of(3, lambda d=ours[mmap], w=whole: [d[i] for i in w]) / n * 1e6,
            unit="us",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--documents", type=float, default=400e3)
    parser.add_argument("--merge-documents", type=float, default=20e6)
    parser.add_argument("--reads", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2, help="builds per side (best counts)")
    args = parser.parse_args()
    workdir = ROOT / "build" / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"megatron-core vs megafmt {megafmt.__version__}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, {os.cpu_count()} CPUs"
    )
    try:
        bench_reads(workdir, args.reads)
        for dtype in (numpy.int32, numpy.uint16):
            bench_builder(workdir, args.tokens, int(args.documents), dtype, args.repeats)
        bench_merge(workdir, int(args.merge_documents))
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
