"""megafmt against megatron-core, side by side in one process, on the same files.

    .venv/bin/python tools/bench/bench_megafmt.py [--tokens 50e6] [--documents 100e3]

Measures random ``get()`` reads (both readers), builder throughput writing a corpus of
``--tokens`` tokens in ``--documents`` documents (finalize included) for int32 and uint16
corpora, from each form users hand ``add_document`` (arrays of the corpus dtype, int64 arrays,
lists of ints, torch int64 tensors), and merging a corpus of ``--merge-documents`` documents
(``add_index`` + ``finalize``). Prints each time and the speedup (megatron-core's time divided by
megafmt's); for builds CPU time first, wall time in parentheses, and the geometric mean of the
speedups over the forms. ``--sections`` runs only some. Files go to ``build/bench`` and are
deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from statistics import geometric_mean

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


def input_forms(pool: list) -> dict[str, list]:
    """The documents of ``pool`` in each form users hand a builder: arrays of the corpus dtype,
    int64 arrays (numpy's default), lists of ints (what tokenizers return), torch int64 tensors."""
    wide = [tokens.astype(numpy.int64) for tokens in pool]
    return {
        f"numpy {pool[0].dtype.name}": pool,
        "numpy int64": wide,
        "list of int": [tokens.tolist() for tokens in pool],
        "torch int64": [torch.from_numpy(tokens) for tokens in wide],
    }


def build_corpus(module, prefix: str, pool: list, documents: int, dtype: type) -> None:
    builder = module.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    size = len(pool)
    for i in range(documents):
        tokens = pool[i % size]
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")


def timed_build(
    module, prefix: str, pool: list, documents: int, dtype: type
) -> tuple[float, float]:
    """CPU and wall seconds to build, finalize included, starting with no dirty pages from
    earlier runs. CPU time (user + system, this process) is what other processes on a shared
    machine disturb least; wall time includes waiting for them."""
    os.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    build_corpus(module, prefix, pool, documents, dtype)
    return time.process_time() - cpu, time.perf_counter() - wall


def bench_builder(workdir: Path, tokens: float, documents: int, dtype: type, repeats: int) -> None:
    """Build the same corpus from each input form with both builders; print each speedup and
    their geometric mean. The two builders must write identical files."""
    pool = document_pool(numpy.random.default_rng(0), int(tokens / documents), dtype)
    written = sum(len(pool[i % len(pool)]) for i in range(documents))
    print(
        f"build {written / 1e6:.0f}M {numpy.dtype(dtype).name} tokens in {documents / 1e3:.0f}k "
        f"documents, add_document per document, best of {repeats}; cpu s (wall s):",
        flush=True,
    )
    speedups: dict[str, list[float]] = {"cpu": [], "wall": []}
    for form, forms_pool in input_forms(pool).items():
        times: dict[str, list[tuple[float, float]]] = {"megatron": [], "megafmt": []}
        for _ in range(repeats):  # alternate, so neither side always runs on a warmer page cache
            for name, module in (("megatron", megatron), ("megafmt", megafmt)):
                prefix = str(workdir / f"build_{name}")
                times[name].append(timed_build(module, prefix, forms_pool, documents, dtype))
            for suffix in (".bin", ".idx"):
                with (
                    open(workdir / f"build_megatron{suffix}", "rb") as a,
                    open(workdir / f"build_megafmt{suffix}", "rb") as b,
                ):
                    assert a.read() == b.read(), f"the builders wrote different {suffix} files"
            for name in times:
                for suffix in (".bin", ".idx"):
                    os.remove(workdir / f"build_{name}{suffix}")
        theirs = [min(t[i] for t in times["megatron"]) for i in (0, 1)]
        ours = [min(t[i] for t in times["megafmt"]) for i in (0, 1)]
        speedups["cpu"].append(theirs[0] / ours[0])
        speedups["wall"].append(theirs[1] / ours[1])
        print(
            f"  from {form:<14} megatron-core {theirs[0]:6.2f} ({theirs[1]:6.2f})   "
            f"megafmt {ours[0]:6.2f} ({ours[1]:6.2f})   "
            f"speedup {speedups['cpu'][-1]:5.2f}x ({speedups['wall'][-1]:5.2f}x)",
            flush=True,
        )
    print(
        f"  geometric mean of the {len(speedups['cpu'])} speedups, {numpy.dtype(dtype).name}: "
        f"{geometric_mean(speedups['cpu']):.2f}x ({geometric_mean(speedups['wall']):.2f}x)",
        flush=True,
    )


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
    build_corpus(megafmt, prefix, document_pool(rng, 800, numpy.uint16), 50_000, numpy.uint16)
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
    parser.add_argument("--tokens", type=float, default=50e6, help="per builder case")
    parser.add_argument("--documents", type=float, default=100e3, help="per builder case")
    parser.add_argument("--merge-documents", type=float, default=20e6)
    parser.add_argument("--reads", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2, help="builds per side (best counts)")
    parser.add_argument(
        "--sections", default="reads,build,merge", help="comma-separated, of reads, build, merge"
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    workdir = ROOT / "build" / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"megatron-core vs megafmt {megafmt.__version__}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, {os.cpu_count()} CPUs"
    )
    try:
        if "reads" in sections:
            bench_reads(workdir, args.reads)
        if "build" in sections:
            for dtype in (numpy.int32, numpy.uint16):
                bench_builder(workdir, args.tokens, int(args.documents), dtype, args.repeats)
        if "merge" in sections:
            bench_merge(workdir, int(args.merge_documents))
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
