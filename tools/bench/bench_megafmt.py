"""megafmt against megatron-core (or the seed commit), side by side in one process, on the same
files.

    .venv/bin/python tools/bench/bench_megafmt.py [--tokens 50e6] [--documents 100e3]
        [--reference megatron-core|seed] [--rows FILE]

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

import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from statistics import geometric_mean

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
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


def bench_builder(
    report: benchreport.Report,
    workdir: Path,
    tokens: float,
    documents: int,
    dtype: type,
    repeats: int,
) -> None:
    """Build the same corpus from each input form with both builders; state each form's CPU and
    wall time and the geometric mean of the CPU ratios. The two builders must write identical
    files."""
    pool = document_pool(numpy.random.default_rng(0), int(tokens / documents), dtype)
    written = sum(len(pool[i % len(pool)]) for i in range(documents))
    dtype_name = numpy.dtype(dtype).name
    conditions = (
        f"{written / 1e6:.3g}M {dtype_name} tokens in {documents / 1e3:.0f}k documents, "
        f"add_document per document, finalize included, best of {repeats}"
    )
    report.heading(f"build: {conditions}")
    ratios = []
    for form, forms_pool in input_forms(pool).items():
        times: dict[str, list[tuple[float, float]]] = {"reference": [], "megafmt": []}
        for _ in range(repeats):  # alternate, so neither side always runs on a warmer page cache
            for name, module in (("reference", megatron), ("megafmt", megafmt)):
                prefix = str(workdir / f"build_{name}")
                times[name].append(timed_build(module, prefix, forms_pool, documents, dtype))
            for suffix in (".bin", ".idx"):
                with (
                    open(workdir / f"build_reference{suffix}", "rb") as a,
                    open(workdir / f"build_megafmt{suffix}", "rb") as b,
                ):
                    assert a.read() == b.read(), f"the builders wrote different {suffix} files"
            for name in times:
                for suffix in (".bin", ".idx"):
                    os.remove(workdir / f"build_{name}{suffix}")
        for clock, which in (("CPU", 0), ("wall", 1)):
            row = report.compare(
                f"build {dtype_name} corpus from {form}, {clock} time",
                ours=min(t[which] for t in times["megafmt"]),
                theirs=min(t[which] for t in times["reference"]),
                unit="s",
                conditions=conditions,
            )
            if clock == "CPU" and row.ratio is not None:
                ratios.append(row.ratio)
    report.note(
        f"geometric mean of the {len(ratios)} CPU-time ratios, {dtype_name}: "
        f"{geometric_mean(ratios):.2f}x"
    )


def bench_merge(report: benchreport.Report, workdir: Path, documents: int) -> None:
    """Merge one corpus of ``documents`` one-token documents: index-bound work."""
    source = str(workdir / "many_docs")
    with open(source + ".idx", "wb") as stream:
        megafmt.IndexWriter(numpy.uint16).write(
            stream, numpy.ones(documents, numpy.int32), numpy.arange(documents + 1)
        )
    with open(source + ".bin", "wb") as stream:
        stream.truncate(documents * 2)
    times = {}
    for name, module in (("reference", megatron), ("megafmt", megafmt)):
        out = str(workdir / f"merged_{name}")
        start = time.perf_counter()
        builder = module.IndexedDatasetBuilder(out + ".bin", dtype=numpy.uint16)
        builder.add_index(source)
        builder.finalize(out + ".idx")
        times[name] = time.perf_counter() - start
    with (
        open(str(workdir / "merged_reference.idx"), "rb") as a,
        open(str(workdir / "merged_megafmt.idx"), "rb") as b,
    ):
        assert a.read() == b.read()
    report.compare(
        "merge (add_index + finalize)",
        ours=times["megafmt"],
        theirs=times["reference"],
        unit="s",
        conditions=f"{documents / 1e6:g}M one-token uint16 documents",
    )


def bench_reads(report: benchreport.Report, workdir: Path, reads: int, documents: int) -> None:
    rng = numpy.random.default_rng(1)
    prefix = str(workdir / "reads")
    build_corpus(megafmt, prefix, document_pool(rng, 800, numpy.uint16), documents, numpy.uint16)
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
        n = reads if mmap else reads // 10  # megatron's file reader opens the file per read
        sample = triples[:n]
        for a, b in zip(sample[:100], sample[:100], strict=True):
            numpy.testing.assert_array_equal(theirs[mmap].get(*a), ours[mmap].get(*b))

        def read(dataset, sample=sample):
            return lambda: [dataset.get(i, o, c) for i, o, c in sample]

        reader = "mmap" if mmap else "file"
        conditions = f"{n:,} random reads, {documents:,} uint16 documents of ~800 tokens, best of 3"
        report.compare(
            f"random get(i, offset, length), {reader} reader",
            ours=best_of(3, read(ours[mmap])) / n * 1e6,
            theirs=best_of(3, read(theirs[mmap])) / n * 1e6,
            unit="us/read",
            conditions=conditions,
        )
        whole = [i for i, _, _ in sample]
        report.compare(
            f"random [i] (whole sequence), {reader} reader",
            ours=best_of(3, lambda d=ours[mmap], w=whole: [d[i] for i in w]) / n * 1e6,
            theirs=best_of(3, lambda d=theirs[mmap], w=whole: [d[i] for i in w]) / n * 1e6,
            unit="us/read",
            conditions=conditions,
        )


def main() -> None:
    parser = benchreport.parser(__doc__)
    parser.add_argument("--tokens", type=float, default=50e6, help="per builder case")
    parser.add_argument("--documents", type=float, default=100e3, help="per builder case")
    parser.add_argument("--merge-documents", type=float, default=20e6)
    parser.add_argument("--reads", type=int, default=200_000)
    parser.add_argument("--read-documents", type=int, default=50_000, help="corpus of the reads")
    parser.add_argument("--repeats", type=int, default=2, help="builds per side (best counts)")
    parser.add_argument(
        "--sections", default="reads,build,merge", help="comma-separated, of reads, build, merge"
    )
    args = parser.parse_args()
    report = benchreport.Report("megafmt", REFERENCE, args.rows)
    sections = set(args.sections.split(","))
    workdir = ROOT / "build" / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"{report.reference} vs megafmt {megafmt.__version__}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, {os.cpu_count()} CPUs"
    )
    try:
        if "reads" in sections:
            bench_reads(report, workdir, args.reads, args.read_documents)
        if "build" in sections:
            for dtype in (numpy.int32, numpy.uint16):
                bench_builder(
                    report, workdir, args.tokens, int(args.documents), dtype, args.repeats
                )
        if "merge" in sections:
            bench_merge(report, workdir, int(args.merge_documents))
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
