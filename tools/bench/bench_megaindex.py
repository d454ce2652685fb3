"""megaindex against megatron-core (or the seed commit), side by side on the same corpus and
configuration.

    .venv/bin/python tools/bench/bench_megaindex.py [--documents 20e6]
        [--reference megatron-core|seed] [--rows FILE]

1. Index build: a synthetic corpus of ``--documents`` documents (the ``.idx`` written directly,
   the ``.bin`` sparse) and enough samples of 4096 tokens for 2 epochs. Each side builds its
   cache in a fresh process; the time of ``build()`` and the process's peak RSS are reported.
2. Cache-hit start-up: a fresh process constructs the datasets again from the cache (best of
   ``--hits``), and once more with the corpus and the cache evicted from the page cache. What the
   corpus's consistency check at open and the tables' checksums cost when they run in full
   (files new to this machine or changed) is measured apart.
3. ``__getitem__`` throughput at sequence length 4096 on a corpus of 20k documents of 50-950
   tokens, without reset flags, with them, and with them and an attention mask.

Prints each figure for both and the ratio (>1 means megaindex is better). ``--skip-build``
leaves out 1 and 2. Files go to ``build/bench_megaindex`` and are deleted at the end.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / "build" / "bench_megaindex"
VOCAB = 50000
SEQUENCE_LENGTH = 4096


def quiet_imports():
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


def tokenizer():
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    return NullTokenizer(VOCAB)


def classes(side: str) -> tuple:
    """The builder, dataset and config classes of megatron-core or megaindex."""
    if side == "megatron":
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    else:
        from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


def datasets(side: str, prefix: str, cache: str, sizes: list, **flags):
    """Build (or load) the datasets with megatron-core's or megaindex's classes."""
    fields = dict(
        random_seed=1234,
        sequence_length=SEQUENCE_LENGTH,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=tokenizer(),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    fields.update(flags)
    builder, dataset, config = classes(side)
    return builder(dataset, sizes, lambda: True, config(**fields)).build()


def child(side: str, prefix: str, cache: str, samples: int) -> None:
    """One side's build or cache-hit start-up in this fresh process; prints JSON."""
    quiet_imports()
    classes(side)  # imports (torch included) are not part of the timing: a job has them loaded
    tokenizer()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    train = datasets(side, prefix, cache, [samples, None, None])[0]
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    checks = {}
    if side == "megaindex":  # what its reliability checks cost when they run in full
        from megafmt.verification import check_consistency
        from megaindex.cache import table_checksums

        corpus = train.dataset
        start = time.perf_counter()
        check_consistency(corpus.index, corpus.bin_reader.path, corpus.bin_reader.nbytes)
        checks["consistency_check"] = time.perf_counter() - start
        tables = {t: getattr(train, t) for t in ("document_index", "sample_index", "shuffle_index")}
        start = time.perf_counter()
        table_checksums(tables)
        checks["table_checksums"] = time.perf_counter() - start
    print(
        json.dumps(
            {
                "checks": checks,
                "seconds": seconds,
                "peak_mib": peak / 1024,
                "baseline_mib": baseline / 1024,
                "samples": len(train),
                "tables": [
                    str(getattr(train, t).dtype)
                    for t in ("document_index", "sample_index", "shuffle_index")
                ],
            }
        )
    )


def run_child(side: str, prefix: str, cache: str, samples: int) -> dict:
    """``child`` in a fresh process that imports the same reference as this one."""
    return benchreport.child_json(__file__, side, prefix, cache, samples, "--reference", REFERENCE)


def synthetic_corpus(prefix: str, documents: int) -> tuple[int, int]:
    """An index of ``documents`` one-sequence documents of 1..199 tokens, and a sparse .bin."""
    from megafmt import IndexWriter

    lengths = numpy.random.default_rng(0).integers(1, 200, documents, dtype=numpy.int32)
    with open(prefix + ".idx", "wb") as stream:
        IndexWriter(numpy.uint16).write(stream, lengths, numpy.arange(documents + 1))
    tokens = int(lengths.sum(dtype=numpy.int64))
    with open(prefix + ".bin", "wb") as stream:
        stream.truncate(tokens * 2)
    return tokens, documents


def bench_build(report: benchreport.Report, documents: int, hits: int) -> None:
    prefix = str(WORKDIR / "synthetic")
    tokens, _ = synthetic_corpus(prefix, documents)
    samples = int(1.5 * tokens / SEQUENCE_LENGTH)  # 1.5 epochs: 2 epochs are built
    conditions = (
        f"{documents / 1e6:g}M documents, {tokens / 1e9:.2f}G tokens, {samples:,} samples of "
        f"{SEQUENCE_LENGTH} (2 epochs), fresh process"
    )
    report.heading(f"index build: {conditions}")
    results = {}
    for side in ("megatron", "megaindex"):
        cache = str(WORKDIR / f"cache_{side}")
        built = run_child(side, prefix, cache, samples)
        warm = [run_child(side, prefix, cache, samples) for _ in range(hits)]
        benchreport.evict_page_cache(WORKDIR)
        cold = run_child(side, prefix, cache, samples)
        built["above_mib"] = built["peak_mib"] - built["baseline_mib"]
        results[side] = {
            "built": built,
            "warm": min(warm, key=lambda h: h["seconds"]),
            "cold": cold,
        }
    theirs, ours = results["megatron"], results["megaindex"]
    assert theirs["built"]["samples"] == ours["built"]["samples"]
    assert theirs["built"]["tables"] == ours["built"]["tables"]
    tables_equal = all(
        numpy.array_equal(numpy.load(a, mmap_mode="r"), numpy.load(b, mmap_mode="r"))
        for a, b in zip(
            sorted((WORKDIR / "cache_megatron").glob("*.npy")),
            sorted((WORKDIR / "cache_megaindex").glob("*.npy")),
            strict=True,
        )
    )
    figures = (  # figure, which run, its field, unit, what the conditions add
        ("index build time (end to end)", "built", "seconds", "s", ""),
        ("peak RSS of the index-building process", "built", "peak_mib", "MiB", ""),
        (
            "peak RSS of the index build above the baseline",
            "built",
            "above_mib",
            "MiB",
            "; baseline: the process with torch imported",
        ),
        ("cache-hit start-up, warm page cache", "warm", "seconds", "s", f"; best of {hits}"),
        (
            "cache-hit start-up, cold page cache",
            "cold",
            "seconds",
            "s",
            "; corpus and cache evicted from the page cache first",
        ),
    )
    for figure, run, field, unit, more in figures:
        report.compare(
            figure,
            ours=ours[run][field],
            theirs=theirs[run][field],
            unit=unit,
            conditions=conditions + more,
        )
    report.note(
        "megaindex's checks when they run in full (new or changed files; skipped, after a "
        "stat, for files that passed them before):"
    )
    for name, what in (
        ("consistency_check", "the corpus's consistency check at open"),
        ("table_checksums", "the tables' checksums at load"),
    ):
        cost = ours["warm"]["checks"][name]
        share = 100 * cost / ours["built"]["seconds"]
        report.note(f"  {what}: {cost:.3f} s ({share:.1f}% of the build)")
    report.note(f"tables identical: {tables_equal}")


def realistic_corpus(prefix: str, seed: int = 0) -> None:
    """20k documents of 50-950 random tokens, each ending with EOD."""
    from megafmt import IndexedDatasetBuilder

    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for _ in range(20000):
        tokens = rng.integers(0, VOCAB, int(rng.integers(50, 950)) + 1).astype(numpy.uint16)
        tokens[-1] = VOCAB  # EOD
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(prefix + ".idx")


def samples_per_second(dataset, count: int) -> float:
    dataset[0]
    start = time.perf_counter()
    for idx in range(count):
        dataset[idx]
    return count / (time.perf_counter() - start)


def bench_getitem(report: benchreport.Report) -> None:
    quiet_imports()
    prefix = str(WORKDIR / "realistic")
    realistic_corpus(prefix)
    conditions = f"sequence length {SEQUENCE_LENGTH}, 20k documents of 50-950 tokens"
    report.heading(f"__getitem__: {conditions}")
    configurations = [
        ("__getitem__, no reset flags", {}, 2000, 2000),
        (
            "__getitem__, reset flags, no attention mask",
            dict(
                reset_position_ids=True,
                reset_attention_mask=True,
                eod_mask_loss=True,
                create_attention_mask=False,
            ),
            2000,
            2000,
        ),
        (
            "__getitem__, reset flags and attention mask",
            dict(reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True),
            20,
            500,
        ),
    ]
    for name, flags, their_count, our_count in configurations:
        tag = "-".join(sorted(flags)) or "plain"
        theirs = datasets(
            "megatron", prefix, str(WORKDIR / f"get_m_{tag}"), [2000, None, None], **flags
        )[0]
        ours = datasets(
            "megaindex", prefix, str(WORKDIR / f"get_o_{tag}"), [2000, None, None], **flags
        )[0]
        for idx in (1, 2, 3):
            for key, value in theirs[idx].items():
                assert value.equal(ours[idx][key]), key
        report.compare(
            name,
            ours=samples_per_second(ours, our_count),
            theirs=samples_per_second(theirs, their_count),
            unit="samples/s",
            higher_is_better=True,
            conditions=conditions,
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = benchreport.parser(__doc__)
    parser.add_argument("--documents", type=float, default=20e6)
    parser.add_argument("--hits", type=int, default=3, help="warm cache-hit starts (best counts)")
    parser.add_argument("--skip-build", action="store_true", help="only the __getitem__ figures")
    args = parser.parse_args()
    report = benchreport.Report("megaindex", REFERENCE, args.rows)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    try:
        if not args.skip_build:
            bench_build(report, int(args.documents), args.hits)
        bench_getitem(report)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)


if __name__ == "__main__":
    main()
